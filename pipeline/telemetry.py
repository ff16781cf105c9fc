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
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Tracer
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache_writer import CacheAction
from connectors.exceptions import ConfigurationError
from pipeline.sla import ConsumerProgress, SlaState, SlaViolation

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

SCOPE = "freshkey"
"""Instrumentation scope (meter and tracer name) of the pipeline's own instruments."""

# -- instrument names (OpenTelemetry) ----------------------------------------------------------------
LAG = "freshkey.lag"
STAGE_DURATION = "freshkey.stage.duration"
EVENTS = "freshkey.events"
CACHE_OUTCOMES = "freshkey.cache.outcomes"
LEASES_VOIDED = "freshkey.leases.voided"
CONSUMER_LAG = "freshkey.consumer.lag"
CONSUMER_BACKLOG_AGE = "freshkey.consumer.backlog.age"
CONSUMER_UNKNOWN_PARTITIONS = "freshkey.consumer.partitions.unknown"
SLA_VIOLATIONS = "freshkey.sla.violations"
SLA_VIOLATED = "freshkey.sla.violated"
SLA_LAG_P99 = "freshkey.sla.lag.p99"
SLA_WINDOW_RATIO = "freshkey.sla.window.ratio"
CONNECTOR_ACK_LATENCY = "freshkey.connector.ack.latency"
"""Recorded by ``connectors.runner`` (which cannot import this module: the name is repeated there)."""
CONNECTOR_CHECKPOINT_AGE = "freshkey.connector.checkpoint.age"
"""Observed by ``connectors.runner``."""

# -- attribute keys ----------------------------------------------------------------------------------
ATTR_NAMESPACE = "namespace"
ATTR_COARSE = "coarse"
ATTR_STAGE = "stage"
ATTR_KIND = "kind"
ATTR_TIER = "tier"
ATTR_OUTCOME = "outcome"
ATTR_TARGET = "target"
ATTR_TOPIC = "messaging.destination.name"
"""OpenTelemetry messaging semantic conventions (Prometheus label ``messaging_destination_name``)."""
ATTR_PARTITION = "messaging.destination.partition.id"

LAG_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 5000, 10000)
"""Lag buckets: the SLA thresholds (200 ms, 1.5 s) are bucket bounds, so Prometheus can count exactly."""
STAGE_BUCKETS_MS: tuple[float, ...] = (0.1, 0.25, 0.5, *LAG_BUCKETS_MS)

_HISTOGRAMS = {
    "freshkey_lag_milliseconds",
    "freshkey_stage_duration_milliseconds",
    "freshkey_connector_ack_latency_milliseconds",
}
_COUNTERS = {
    "freshkey_events",
    "freshkey_cache_outcomes",
    "freshkey_leases_voided",
    "freshkey_sla_violations",
    "freshkey_connector_retries",
    "freshkey_connector_oversize",
    "freshkey_connector_gaps",
}
_GAUGES = {
    "freshkey_consumer_lag",
    "freshkey_sla_violated",
    "freshkey_sla_lag_p99_milliseconds",
    "freshkey_sla_window_ratio",
    "freshkey_connector_checkpoint_age_seconds",
    "freshkey_connector_connected",
    "freshkey_consumer_backlog_age_milliseconds",
    "freshkey_consumer_partitions_unknown",
}
PROMETHEUS_METRIC_NAMES: frozenset[str] = frozenset(
    {f"{h}{suffix}" for h in _HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | {f"{c}_total" for c in _COUNTERS}
    | _GAUGES
    | {"target_info"}
)
"""Every series name the worker and the connector can export on their Prometheus endpoints."""


class BrokerFigures(NamedTuple):
    """One reading of :class:`BrokerOffsets`: partition -> high watermark, and -> committed offset."""

    highs: dict[int, int]
    committed: dict[int, int | None]
    """The group's committed offset (the next one to consume); None: the group committed none there."""


class BrokerOffsets:
    """A topic's high watermarks and a consumer group's committed offsets, read straight from the broker.

    What :class:`~pipeline.sla.ConsumerProgress` needs to tell "caught up" from "unknown" for partitions
    the worker has received nothing on (a quiet partition after a restart, an agent that died before its
    first message) and for the partitions it does not hold (before it joined its group). A librdkafka
    client that never subscribes: it does not join the group and commits nothing, it only asks (one
    ListOffsets per partition and one OffsetFetch: about 1 ms here for 3 partitions).

    Blocking: call :meth:`read` in a thread. It raises ``confluent_kafka.KafkaException`` when the broker
    does not answer within ``timeout_s`` or the topic does not exist. Some brokers answer ListOffsets
    with less than the log end (Tansu, measured here: the last record batch's base offset + 1); the
    progress keeps the highest figure from any source, and the consumer's own (fetch) high watermarks
    are exact there.
    """

    def __init__(self, bootstrap: str, *, group_id: str, topic: str, timeout_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._lock = threading.Lock()

    def read(self) -> BrokerFigures:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        with self._lock:
            if self._consumer is None:
                from confluent_kafka import Consumer

                self._consumer = Consumer(
                    {
                        "bootstrap.servers": self.bootstrap,
                        "group.id": self.group_id,
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                        "logger": log,
                    }
                )
            consumer = self._consumer
            metadata = consumer.list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
            if metadata is None or metadata.error is not None:
                error = metadata.error if metadata is not None else None
                raise KafkaException(error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
            partitions = sorted(metadata.partitions)
            highs = {
                p: int(consumer.get_watermark_offsets(TopicPartition(self.topic, p), self.timeout_s)[1])
                for p in partitions
            }
            committed = consumer.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=self.timeout_s
            )
        return BrokerFigures(highs, {tp.partition: tp.offset if tp.offset >= 0 else None for tp in committed})

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


class TelemetryError(ConfigurationError):
    """Telemetry is configured in a way that cannot work (e.g. OTLP asked for, its extra missing)."""


class TelemetrySettings(BaseSettings):
    """Where metrics and traces go. The Prometheus endpoints listen on localhost unless configured."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_TELEMETRY_", extra="ignore")

    prometheus_bind: str = "127.0.0.1"
    prometheus_port: int = Field(9464, ge=0, le=65535, description="Worker's /metrics port; 0: off.")
    connector_prometheus_port: int = Field(9465, ge=0, le=65535, description="Connector's port; 0: off.")
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces (extra 'otlp')."
    )
    trace_sample_every: int = Field(100, ge=0, description="Trace one cache action in N; 0: none.")
    consumer_lag_interval_s: float = Field(2.0, gt=0, description="How often consumer lag is sampled.")


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
    """What the tracer needs of one planned change (``pipeline.worker.Planned`` is one)."""

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
    :class:`~pipeline.sla.ConsumerProgress`), what it knows of the change topic: a partition with no
    figure has no ``freshkey.consumer.lag`` observation (never a 0) and is counted by
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
