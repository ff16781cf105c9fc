"""OpenTelemetry metrics and traces of the pipeline, exported for Prometheus (and OTLP, optionally).

Library code (:class:`OtelObserver`, the connector loop) uses only the OpenTelemetry *API*; until an
entry point calls :func:`configure_telemetry`, every instrument is a no-op. ``configure_telemetry``
installs the SDK: a MeterProvider whose readings are served on a Prometheus endpoint
(``FRESHKEY_TELEMETRY_PROMETHEUS_BIND``/``_PORT``, localhost by default), and, when
``FRESHKEY_TELEMETRY_OTLP_ENDPOINT`` is set, a TracerProvider exporting spans over OTLP/HTTP (the
``otlp`` extra: ``pip install 'freshkey[otlp]'``).

Names follow the OpenTelemetry conventions (dotted, unit in the ``unit`` field, not in the name; counters
without ``_total``); the Prometheus exporter turns ``freshkey.lag`` with unit ``ms`` into
``freshkey_lag_milliseconds_bucket``/``_sum``/``_count`` and a counter ``freshkey.events`` into
``freshkey_events_total``. :data:`PROMETHEUS_METRIC_NAMES` lists every series name the code can export,
so that dashboards can be checked against it. Each series also carries the labels ``otel_scope_name``,
``otel_scope_version`` and ``otel_scope_schema_url``.

Traces follow one sampled cache action in ``trace_sample_every`` from its database commit to the last
tier: a span ``freshkey.apply`` per traced batch, with one child ``freshkey.change`` per sampled action
that starts at the commit time and ends when every tier acknowledged it, carrying the namespace, a hash
of the cache key (never the key: keys hold user data), the version and each tier's outcome.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Tracer

from cache_writer import CacheAction
from connectors.exceptions import ConfigurationError
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.sla import SlaState, SlaViolation
from pipeline.settings import TelemetrySettings
from schemas.metrics import (
    ATTR_COARSE,
    ATTR_KIND,
    ATTR_NAMESPACE,
    ATTR_OUTCOME,
    ATTR_PARTITION,
    ATTR_STAGE,
    ATTR_TARGET,
    ATTR_TIER,
    ATTR_TOPIC,
    CACHE_OUTCOMES,
    CONSUMER_BACKLOG_AGE,
    CONSUMER_LAG,
    CONSUMER_UNKNOWN_PARTITIONS,
    EVENTS,
    LAG,
    LAG_BUCKETS_MS,
    LEASES_VOIDED,
    SCOPE,
    SLA_LAG_P99,
    SLA_VIOLATED,
    SLA_VIOLATIONS,
    SLA_WINDOW_RATIO,
    STAGE_BUCKETS_MS,
    STAGE_DURATION,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

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
        provider, tracer_provider, server.server_port if server is not None else None, _server=server
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


_FITS = {
    "invalidate": frozenset({"tombstoned", "not_newer"}),
    "write": frozenset({"applied", "not_newer"}),
}


def _outcomes_by_action(actions: Sequence[CacheAction], reported: Sequence[str]) -> list[str] | None:
    """Each action's outcome in one tier, from that tier's outcomes in reporting order, or None.

    ``ChangeProcessor.apply`` sends a tier the batch's invalidations, then its writes, each group in
    batch order (a batch of one kind: simply batch order), and reports one outcome per action in that
    order. ``None`` when the reports do not fit that order (a count differs, or an invalidation would
    get "applied").
    """
    if len(reported) != len(actions):
        return None
    order = [i for i, a in enumerate(actions) if a.kind == "invalidate"]
    order += [i for i, a in enumerate(actions) if a.kind == "write"]
    by_action = [""] * len(actions)
    for position, index in enumerate(order):
        outcome = reported[position]
        if outcome not in _FITS[actions[index].kind]:
            return None
        by_action[index] = outcome
    return by_action


def key_hash(key: str) -> str:
    """A stable, short digest of a cache key for traces (the key itself may hold user data)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class _Binding(Protocol):
    @property
    def namespace(self) -> str: ...


class _Event(Protocol):
    @property
    def op(self) -> str: ...

    @property
    def ts_ms(self) -> int: ...


class PlannedChange(Protocol):
    """What the tracer needs of one planned change (``pipeline.processor.Planned`` is one)."""

    @property
    def binding(self) -> _Binding: ...

    @property
    def event(self) -> _Event: ...

    @property
    def actions(self) -> Sequence[CacheAction]: ...


@dataclass
class _BatchTrace:
    started_ns: int
    received_ms: float
    planned_ms: float
    changes: list[tuple[str, str, int, CacheAction]]
    """(namespace, op, connector read ms, action) of every action of the batch, in apply order."""
    sampled: list[int]
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    tier_done_ns: dict[str, int] = field(default_factory=dict)


class OtelObserver:
    """An :class:`~pipeline.observe.ApplyObserver` that records OpenTelemetry metrics and traces.

    Instruments come from ``meter`` (default: the API's global meter named :data:`SCOPE`).

    Consumer lag per partition: with :meth:`watch_progress` (the worker's
    :class:`~pipeline.observe.progress.ConsumerProgress`), what it knows of the change topic: a partition
    with no     figure has no ``freshkey.consumer.lag`` observation (never a 0) and is counted by
    ``freshkey.consumer.partitions.unknown``; ``freshkey.consumer.backlog.age`` is the age of its oldest
    waiting change. Without it, the last high watermark given to :meth:`set_high_watermarks` minus the
    next offset to process (the last acknowledged one + 1), for partitions with both figures.
    """

    def __init__(
        self,
        meter: Meter | None = None,
        tracer: Tracer | None = None,
        *,
        trace_sample_every: int = 100,
    ) -> None:
        meter = meter or metrics.get_meter(SCOPE)
        self._tracer = tracer or trace.get_tracer(SCOPE)
        self.trace_sample_every = trace_sample_every
        self._sample_counter = 0
        self._processed: dict[tuple[str, int], int] = {}
        self._highs: dict[str, dict[int, int]] = {}
        self._sla: Callable[[], SlaState | None] | None = None
        self._progress: ConsumerProgress | None = None
        self._batch: _BatchTrace | None = None
        self.lag = meter.create_histogram(
            LAG,
            unit="ms",
            description="Commit-to-cache lag of a change: database commit to every tier acknowledging it.",
            explicit_bucket_boundaries_advisory=LAG_BUCKETS_MS,
        )
        self.stage_duration = meter.create_histogram(
            STAGE_DURATION,
            unit="ms",
            description="Time a change spent in one stage of the path (see pipeline.observe).",
            explicit_bucket_boundaries_advisory=STAGE_BUCKETS_MS,
        )
        self.events = meter.create_counter(
            EVENTS, unit="{event}", description="Messages handled, by kind (op, ddl, unbound, dead_lettered)."
        )
        self.outcomes = meter.create_counter(
            CACHE_OUTCOMES,
            unit="{action}",
            description="Cache actions per tier and outcome (applied, stale, tombstoned).",
        )
        self.leases_voided = meter.create_counter(
            LEASES_VOIDED,
            unit="{lease}",
            description="Fill leases voided by an invalidation or a newer write.",
        )
        self.sla_violations = meter.create_counter(
            SLA_VIOLATIONS, unit="{violation}", description="SLA violations, by violated target."
        )
        meter.create_observable_gauge(
            CONSUMER_LAG,
            callbacks=[self._observe_consumer_lag],
            unit="{message}",
            description="Messages on a partition not yet applied: high watermark - next offset to process.",
        )
        meter.create_observable_gauge(
            CONSUMER_BACKLOG_AGE,
            callbacks=[self._observe_backlog_age],
            unit="ms",
            description="How long the oldest change not yet applied on a partition has waited (at least).",
        )
        meter.create_observable_gauge(
            CONSUMER_UNKNOWN_PARTITIONS,
            callbacks=[self._observe_unknown_partitions],
            unit="{partition}",
            description="Partitions of the change topic this worker should know about but has no figure for.",
        )
        meter.create_observable_gauge(
            SLA_VIOLATED,
            callbacks=[self._observe_violated],
            unit="1",
            description="1 while a target is violated.",
        )
        meter.create_observable_gauge(
            SLA_LAG_P99,
            callbacks=[self._observe_p99],
            unit="ms",
            description="p99 commit-to-cache lag over the SLA evaluation window (at most 4.5 % high).",
        )
        meter.create_observable_gauge(
            SLA_WINDOW_RATIO,
            callbacks=[self._observe_window_ratio],
            unit="1",
            description="Share of the changes in the SLA evaluation window applied within the window.",
        )

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_event(self, kind: str) -> None:
        self.events.add(1, {ATTR_KIND: kind})

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        self.outcomes.add(1, {ATTR_TIER: tier, ATTR_NAMESPACE: namespace, ATTR_OUTCOME: outcome})
        batch = self._batch
        if batch is not None:
            batch.outcomes.setdefault(tier, []).append(outcome)
            batch.tier_done_ns[tier] = time.time_ns()

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        # Clock skew between the database and the worker can make a lag negative; a histogram counts
        # non-negative amounts (its sum is a total), so it is recorded as 0.
        self.lag.record(max(lag_ms, 0.0), {ATTR_NAMESPACE: namespace, ATTR_COARSE: coarse})
        for stage, ms in stages.items():
            self.stage_duration.record(max(ms, 0.0), {ATTR_STAGE: stage})

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        if offset > self._processed.get(key, -1):
            self._processed[key] = offset

    # -- hooks ----------------------------------------------------------------------------------------
    def set_high_watermarks(self, topic: str, highs: Mapping[int, int]) -> None:
        """The latest high watermarks (next offset to be written) of the partitions this worker owns.

        Replaces the previous ones for ``topic``: a partition left out is no longer reported.
        """
        self._highs[topic] = dict(highs)

    def watch_progress(self, progress: ConsumerProgress) -> None:
        """Report consumer lag, backlog age and unknown partitions from ``progress`` (see the class)."""
        self._progress = progress

    def consumer_lag(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> messages not yet applied, for the partitions with both figures known."""
        if self._progress is not None:
            return self._progress.consumer_lag()
        lag: dict[tuple[str, int], int] = {}
        # Called from the Prometheus scrape thread too: iterate over copies.
        for topic, highs in list(self._highs.items()):
            for partition, high in list(highs.items()):
                processed = self._processed.get((topic, partition))
                if processed is not None:
                    lag[(topic, partition)] = max(0, high - processed - 1)
        return lag

    def on_leases_voided(self, count: int = 1, *, namespace: str = "") -> None:
        self.leases_voided.add(count, {ATTR_NAMESPACE: namespace})

    def watch_sla(self, state: Callable[[], SlaState | None]) -> None:
        """Report the SLA state returned by ``state`` on the ``freshkey.sla.*`` gauges."""
        self._sla = state

    def on_sla_event(self, event: SlaViolation) -> None:
        if event.kind == "violation":
            for target in event.violated:
                self.sla_violations.add(1, {ATTR_TARGET: target})

    # -- observable gauges ----------------------------------------------------------------------------
    def _observe_consumer_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(lag, {ATTR_TOPIC: topic, ATTR_PARTITION: str(partition)})
            for (topic, partition), lag in self.consumer_lag().items()
        ]

    def _observe_backlog_age(self, options: CallbackOptions) -> Iterable[Observation]:
        if self._progress is None:
            return []
        return [
            Observation(age, {ATTR_TOPIC: topic, ATTR_PARTITION: str(partition)})
            for (topic, partition), age in self._progress.ages().items()
        ]

    def _observe_unknown_partitions(self, options: CallbackOptions) -> Iterable[Observation]:
        if self._progress is None:
            return []
        return [Observation(self._progress.snapshot().unknown, {ATTR_TOPIC: self._progress.topic})]

    def _sla_state(self) -> SlaState | None:
        return self._sla() if self._sla is not None else None

    def _observe_violated(self, options: CallbackOptions) -> Iterable[Observation]:
        state = self._sla_state()
        if state is None:
            return []
        return [
            Observation(1 if t.status == "violated" else 0, {ATTR_TARGET: t.name})
            for t in state.targets
            if t.status != "no_data"
        ]

    def _observe_p99(self, options: CallbackOptions) -> Iterable[Observation]:
        state = self._sla_state()
        return [] if state is None or state.p99_ms is None else [Observation(state.p99_ms)]

    def _observe_window_ratio(self, options: CallbackOptions) -> Iterable[Observation]:
        state = self._sla_state()
        if state is None or state.within_window_fraction is None:
            return []
        return [Observation(state.within_window_fraction)]

    # -- traces ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def trace_batch(
        self, planned: Sequence[PlannedChange], *, received_ms: float, planned_ms: float
    ) -> Iterator[None]:
        """Trace the sampled actions of one batch applied inside the ``with`` block.

        Outcomes are matched to actions by the worker's reporting order (see
        :func:`_outcomes_by_action`); a tier whose reports do not fit is left out of the spans.
        """
        every = self.trace_sample_every
        total = sum(len(p.actions) for p in planned)
        first = self._sample_counter
        self._sample_counter += total
        sampled = list(range((-first) % every, total, every)) if every > 0 else []
        if not sampled:
            yield
            return
        root = self._tracer.start_span(
            "freshkey.apply",
            attributes={"freshkey.batch.actions": total, "freshkey.batch.sampled": len(sampled)},
        )
        if not root.is_recording():  # no SDK tracer provider installed
            root.end()
            yield
            return
        changes = [(p.binding.namespace, p.event.op, p.event.ts_ms, a) for p in planned for a in p.actions]
        batch = _BatchTrace(time.time_ns(), received_ms, planned_ms, changes, sampled)
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None
            self._emit(root, batch, time.time_ns())

    def _emit(self, root: trace.Span, batch: _BatchTrace, ended_ns: int) -> None:
        context = trace.set_span_in_context(root)
        outcomes = {
            tier: by_action
            for tier, reported in batch.outcomes.items()
            if (by_action := _outcomes_by_action([c[3] for c in batch.changes], reported)) is not None
        }
        for index in batch.sampled:
            namespace, op, read_ms, action = batch.changes[index]
            attributes: dict[str, str | int | bool] = {
                "freshkey.namespace": namespace,
                "freshkey.key.hash": key_hash(action.key),
                "freshkey.version": str(action.version),
                "freshkey.op": op,
                "freshkey.action": action.kind,
            }
            for tier, outcome in outcomes.items():
                attributes[f"freshkey.outcome.{tier}"] = outcome[index]
            commit_ns = action.commit_ts_us * 1000
            span = self._tracer.start_span(
                "freshkey.change", context=context, start_time=min(commit_ns, ended_ns), attributes=attributes
            )
            span.add_event("read by connector", timestamp=int(read_ms * 1_000_000))
            span.add_event("received by worker", timestamp=int(batch.received_ms * 1_000_000))
            span.add_event("keys computed", timestamp=int(batch.planned_ms * 1_000_000))
            for tier, done_ns in batch.tier_done_ns.items():
                span.add_event(f"acknowledged by {tier}", timestamp=done_ns)
            span.end(end_time=ended_ns)
        root.end(end_time=ended_ns)
