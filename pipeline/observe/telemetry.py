"""The OpenTelemetry SDK of a freshkey process: metrics served for Prometheus, traces over OTLP.

Library code (:class:`~pipeline.observe.otel.OtelObserver`, the connector loop) uses only the
OpenTelemetry *API*; until an entry point calls :func:`configure_telemetry`, every instrument is a
no-op. ``configure_telemetry`` installs the SDK: a MeterProvider whose readings are served on a
Prometheus endpoint (``FRESHKEY_TELEMETRY_PROMETHEUS_BIND``/``_PORT``, localhost by default), and, when
``FRESHKEY_TELEMETRY_OTLP_ENDPOINT`` is set, a TracerProvider exporting spans over OTLP/HTTP (the
``otlp`` extra: ``pip install 'freshkey[otlp]'``). Series names: :mod:`schemas.metrics`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import metrics, trace

from connectors.exceptions import ConfigurationError
from pipeline.settings import TelemetrySettings

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)


class TelemetryError(ConfigurationError):
    """Telemetry is configured in a way that cannot work (e.g. OTLP asked for, its extra missing)."""


@dataclass
class Telemetry:
    """What :func:`configure_telemetry` installed; ``shutdown()`` stops the endpoint and flushes."""

    meter_provider: MeterProvider
    tracer_provider: TracerProvider | None
    prometheus_port: int | None
    """The port the Prometheus endpoint listens on (None: not serving)."""
    registry: CollectorRegistry
    """What the endpoint serves: the meter provider's reader, and collectors added to it (the lag
    histograms of :class:`~pipeline.observe.otel.OtelObserver`)."""
    _server: Any = None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.meter_provider.shutdown()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


_configured: Telemetry | None = None
_configure_lock = threading.Lock()


def configured() -> Telemetry | None:
    """What the entry point installed with ``set_global`` (None: nothing yet, e.g. in library use)."""
    return _configured


def configure_telemetry(
    settings: TelemetrySettings,
    *,
    service: Literal["worker", "connector"],
    set_global: bool = True,
) -> Telemetry:
    """Install the OpenTelemetry SDK for this process and serve Prometheus metrics.

    With ``set_global`` (entry points), the providers become the process-wide ones that the API hands
    to library code; a second call returns the first result unchanged. A Prometheus port already in use
    is logged as an error and the process goes on without the endpoint (metrics are never a reason to
    stop applying changes). Raises :class:`TelemetryError` when an OTLP endpoint is set but the ``otlp``
    extra is not installed.
    """
    global _configured
    with _configure_lock:
        if set_global and _configured is not None:
            return _configured
        telemetry = _build(settings, service)
        if set_global:
            metrics.set_meter_provider(telemetry.meter_provider)
            if telemetry.tracer_provider is not None:
                trace.set_tracer_provider(telemetry.tracer_provider)
            _configured = telemetry
        return telemetry


def _build(settings: TelemetrySettings, service: Literal["worker", "connector"]) -> Telemetry:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, start_http_server

    resource = Resource.create(
        {
            "service.name": f"freshkey-{service}",
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        }
    )
    tracer_provider = _tracer_provider(settings, resource) if settings.otlp_endpoint else None
    registry = CollectorRegistry(auto_describe=True)
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)], resource=resource)
    port = settings.prometheus_port if service == "worker" else settings.connector_prometheus_port
    server = None
    if port:
        try:
            server, _thread = start_http_server(port, addr=settings.prometheus_bind, registry=registry)
        except OSError as exc:
            variable = "PROMETHEUS_PORT" if service == "worker" else "CONNECTOR_PROMETHEUS_PORT"
            log.error(
                "cannot serve Prometheus metrics on %s:%d (%s); set FRESHKEY_TELEMETRY_%s (0: off)",
                settings.prometheus_bind,
                port,
                exc.strerror or exc,
                variable,
            )
        else:
            log.info("Prometheus metrics on http://%s:%d/metrics", settings.prometheus_bind, port)
    return Telemetry(
        provider,
        tracer_provider,
        server.server_port if server is not None else None,
        registry,
        _server=server,
    )


def _tracer_provider(settings: TelemetrySettings, resource: Resource) -> TracerProvider:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TelemetryError(
            "FRESHKEY_TELEMETRY_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
            "pip install 'freshkey[otlp]' (opentelemetry-exporter-otlp-proto-http)"
        ) from None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    return provider
