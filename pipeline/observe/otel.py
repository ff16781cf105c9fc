"""OpenTelemetry metrics and traces of the worker, exported for Prometheus (and traces over OTLP).

Names follow the OpenTelemetry conventions (dotted, unit in the ``unit`` field, not in the name; counters
without ``_total``); the Prometheus exporter turns a counter ``freshkey.events`` into
``freshkey_events_total``. :data:`schemas.metrics.PROMETHEUS_METRIC_NAMES` lists every series name the
code can export, so that dashboards can be checked against it. Each series carries the labels
``otel_scope_name``, ``otel_scope_version`` and ``otel_scope_schema_url``.

Nothing is recorded per change, and no OpenTelemetry call is made per batch: the event and outcome
counters are observable counters that read this observer's own tallies at collection time (a batch
adds to two dicts). The lag and stage histograms (``freshkey_lag_milliseconds_*``, ``freshkey_stage_duration_
milliseconds_*``) are not OpenTelemetry instruments: the OpenTelemetry API records one value per call, and
four calls per change were a quarter of the worker's CPU (issue 9). They are read from the worker's lag
sketch at scrape time by :class:`SketchHistograms`, a Prometheus collector on the same endpoint, with the
same names, labels and bucket bounds as before (:data:`schemas.metrics.LAG_BUCKETS_MS`; the sketch counts
at those bounds exactly). The SLA gauges read the SLA state, itself read from the same sketch.

The SDK set-up is :mod:`pipeline.observe.telemetry` (re-exported here); traces are
:mod:`pipeline.observe.traces`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Tracer
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.report import BatchReport
from pipeline.observe.sketch import COARSE, LAG, STAGE, LagSketch
from pipeline.observe.sla_state import SlaState, SlaViolation
from pipeline.observe.telemetry import Telemetry, TelemetryError, configure_telemetry, configured
from pipeline.observe.traces import BatchTracer, PlannedChange, key_hash
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
    LAG_BUCKETS_MS,
    SCOPE,
    SLA_LAG_P99,
    SLA_VIOLATED,
    SLA_VIOLATIONS,
    SLA_WINDOW_RATIO,
    STAGE_BUCKETS_MS,
)
from schemas.metrics import LAG as LAG_METRIC
from schemas.metrics import STAGE_DURATION as STAGE_METRIC

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "OtelObserver",
    "SketchHistograms",
    "Telemetry",
    "TelemetryError",
    "configure_telemetry",
    "key_hash",
]

_SCOPE_LABELS = {"otel_scope_name": SCOPE, "otel_scope_schema_url": "", "otel_scope_version": ""}
"""What the OpenTelemetry exporter adds to each series: the histograms carry them too."""


def _prometheus_name(name: str) -> str:
    return name.replace(".", "_")


class SketchHistograms(Collector):
    """The lag sketch's since-start counts as cumulative Prometheus histograms (read at each scrape):

    - ``freshkey_lag_milliseconds`` by ``namespace`` and ``coarse`` (buckets :data:`LAG_BUCKETS_MS`);
    - ``freshkey_stage_duration_milliseconds`` by ``stage`` (buckets :data:`STAGE_BUCKETS_MS`).

    Sums count negative samples (clock skew) as 0, as a histogram's sum is a total.
    """

    def __init__(self, sketch: LagSketch) -> None:
        sketch.require_exact(*LAG_BUCKETS_MS, *STAGE_BUCKETS_MS)
        self.sketch = sketch

    def describe(self) -> Iterable[Metric]:
        return [self._lag(), self._stages()]

    def collect(self) -> Iterable[Metric]:
        lag = self._lag()
        for kind, coarse in ((LAG, "false"), (COARSE, "true")):
            for namespace, le, n, total in self.sketch.cumulative(kind, LAG_BUCKETS_MS):
                labels = {ATTR_COARSE: coarse, ATTR_NAMESPACE: namespace, **_SCOPE_LABELS}
                lag.add_metric([labels[k] for k in sorted(labels)], _buckets(LAG_BUCKETS_MS, le, n), total)
        stages = self._stages()
        for stage, le, n, total in self.sketch.cumulative(STAGE, STAGE_BUCKETS_MS):
            labels = {ATTR_STAGE: stage, **_SCOPE_LABELS}
            stages.add_metric([labels[k] for k in sorted(labels)], _buckets(STAGE_BUCKETS_MS, le, n), total)
        return [lag, stages]

    @staticmethod
    def _lag() -> HistogramMetricFamily:
        return HistogramMetricFamily(
            _prometheus_name(LAG_METRIC),
            "Commit-to-cache lag of a change: database commit to every tier acknowledging it.",
            labels=sorted({ATTR_COARSE, ATTR_NAMESPACE, *_SCOPE_LABELS}),
            unit="milliseconds",
        )

    @staticmethod
    def _stages() -> HistogramMetricFamily:
        return HistogramMetricFamily(
            _prometheus_name(STAGE_METRIC),
            "Time a change spent in one stage of the path (see pipeline.observe).",
            labels=sorted({ATTR_STAGE, *_SCOPE_LABELS}),
            unit="milliseconds",
        )


def _buckets(bounds: Sequence[float], le: Sequence[int], n: int) -> list[tuple[str, float]]:
    # The bounds written as the OpenTelemetry exporter writes them (le="20", le="0.25"), so the series
    # stay the ones Grafana and older scrapes know.
    return [*((f"{b}", float(c)) for b, c in zip(bounds, le, strict=True)), ("+Inf", float(n))]


class OtelObserver:
    """An :class:`~pipeline.observe.ApplyObserver` that exports the worker's metrics and traces.

    Instruments come from ``meter`` (default: the API's global meter named :data:`SCOPE`). The lag and
    stage histograms go to ``registry`` (default: the endpoint :func:`configure_telemetry` installed;
    none: not exported) once the observer is attached to the lag sketch.

    Consumer lag per partition: with :meth:`watch_progress` (the worker's
    :class:`~pipeline.observe.progress.ConsumerProgress`), what it knows of the change topic: a partition
    with no figure has no ``freshkey.consumer.lag`` observation (never a 0) and is counted by
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
        registry: CollectorRegistry | None = None,
    ) -> None:
        meter = meter or metrics.get_meter(SCOPE)
        if registry is None and (installed := configured()) is not None:
            registry = installed.registry
        self.registry = registry
        self.histograms: SketchHistograms | None = None
        self.tracer = BatchTracer(tracer or trace.get_tracer(SCOPE), trace_sample_every)
        self._processed: dict[tuple[str, int], int] = {}
        self._highs: dict[str, dict[int, int]] = {}
        self._sla: Callable[[], SlaState | None] | None = None
        self._progress: ConsumerProgress | None = None
        self._lock = threading.Lock()
        self.events: Counter[str] = Counter()
        """Messages handled, by kind, since start (read at each collection)."""
        self.outcomes: Counter[tuple[str, str, str]] = Counter()
        """Cache actions by (tier, namespace, outcome), since start."""
        meter.create_observable_counter(
            EVENTS,
            callbacks=[self._observe_events],
            unit="{event}",
            description="Messages handled, by kind (op, ddl, unbound, dead_lettered).",
        )
        meter.create_observable_counter(
            CACHE_OUTCOMES,
            callbacks=[self._observe_outcomes],
            unit="{action}",
            description="Cache actions per tier and outcome (applied, tombstoned, not_newer, fenced).",
        )
        self.sla_violations = meter.create_counter(
            SLA_VIOLATIONS, unit="{violation}", description="SLA violations, by violated target."
        )
        for name, callback, unit, description in (
            (
                CONSUMER_LAG,
                self._observe_consumer_lag,
                "{message}",
                "Messages on a partition not yet applied: high watermark - next offset to process.",
            ),
            (
                CONSUMER_BACKLOG_AGE,
                self._observe_backlog_age,
                "ms",
                "How long the oldest change not yet applied on a partition has waited (at least).",
            ),
            (
                CONSUMER_UNKNOWN_PARTITIONS,
                self._observe_unknown_partitions,
                "{partition}",
                "Partitions of the change topic this worker should know about but has no figure for.",
            ),
            (SLA_VIOLATED, self._observe_violated, "1", "1 while a target is violated."),
            (
                SLA_LAG_P99,
                self._observe_p99,
                "ms",
                "p99 commit-to-cache lag over the SLA evaluation window (at most 4.43 % high), as the "
                "SLA state reports it.",
            ),
            (
                SLA_WINDOW_RATIO,
                self._observe_window_ratio,
                "1",
                "Share of the changes in the SLA evaluation window applied within the window.",
            ),
        ):
            meter.create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)

    # -- ApplyObserver --------------------------------------------------------------------------------
    def attach(self, sketch: LagSketch) -> None:
        """Export the sketch's histograms on ``registry`` (once)."""
        if self.registry is not None and self.histograms is None:
            self.histograms = SketchHistograms(sketch)
            self.registry.register(self.histograms)

    def on_event(self, kind: str) -> None:
        with self._lock:
            self.events[kind] += 1

    def on_batch(self, report: BatchReport) -> None:
        with self._lock:
            self.events.update(report.events)
            self.outcomes.update(report.outcomes)
        self.tracer.on_batch(report)

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

    def watch_sla(self, state: Callable[[], SlaState | None]) -> None:
        """Report the SLA state returned by ``state`` on the ``freshkey.sla.*`` gauges."""
        self._sla = state

    def on_sla_event(self, event: SlaViolation) -> None:
        if event.kind == "violation":
            for target in event.violated:
                self.sla_violations.add(1, {ATTR_TARGET: target})

    @contextlib.contextmanager
    def trace_batch(
        self, planned: Sequence[PlannedChange], *, received_ms: float, planned_ms: float
    ) -> Iterator[None]:
        """Trace the sampled actions of the batch applied inside the ``with`` block (see
        :mod:`pipeline.observe.traces`)."""
        with self.tracer.trace_batch(planned, received_ms=received_ms, planned_ms=planned_ms):
            yield

    # -- observable instruments (called by the Prometheus scrape thread) -----------------------------
    def _observe_events(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            counts = list(self.events.items())
        return [Observation(count, {ATTR_KIND: kind}) for kind, count in counts]

    def _observe_outcomes(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            counts = list(self.outcomes.items())
        return [
            Observation(count, {ATTR_TIER: tier, ATTR_NAMESPACE: namespace, ATTR_OUTCOME: outcome})
            for (tier, namespace, outcome), count in counts
        ]

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
