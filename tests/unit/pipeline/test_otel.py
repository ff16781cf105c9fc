"""pipeline.observe.otel: instruments and attributes (SDK in-memory reader), Prometheus endpoint, traces."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from cache_writer import CacheAction
from pipeline.embedded import free_port
from pipeline.observe import STAGE_PLAN, STAGE_TRANSPORT, BatchReport, Observers, Repeated
from pipeline.observe.otel import OtelObserver, TelemetryError, configure_telemetry, key_hash
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.sketch import LagSketch
from pipeline.observe.sla import SlaEvaluator
from pipeline.observe.traces import _outcomes_by_action
from pipeline.settings import SlaSettings, TelemetrySettings
from schemas.metrics import PROMETHEUS_METRIC_NAMES

T0 = 1_800_000_000.0


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    if data is None:
        return found
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def histograms(registry: CollectorRegistry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted labels (without the scope ones): value}}`` of the registry's histograms."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in registry.collect():
        if family.type != "histogram":
            continue
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if not k.startswith("otel_scope")))
            found.setdefault(sample.name, {})[labels] = sample.value
    return found


def test_instruments_and_their_attributes() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    registry = CollectorRegistry()
    otel = OtelObserver(meter=provider.get_meter("freshkey"), registry=registry)
    observers = Observers([otel])
    observers.on_event("dead_lettered")
    observers.on_batch(
        BatchReport(
            at=T0,
            events={"u": 2},
            outcomes={("redis", "assets", "applied"): 2, ("redis", "assets", "not_newer"): 1},
            lags={"assets": np.array([42.0])},
            coarse_lags={"assets": np.array([-5.0])},
            stages={STAGE_TRANSPORT: np.array([3.0, 4.0]), STAGE_PLAN: Repeated(0.2, 2)},
        )
    )
    otel.on_offset("changes", 0, 9)
    otel.on_offset("changes", 1, 4)
    otel.set_high_watermarks("changes", {0: 15, 1: 5, 2: 7})  # partition 2: nothing processed yet
    found = points(reader)
    provider.shutdown()

    events = {p.attributes["kind"]: p.value for p in found["freshkey.events"]}
    assert events == {"u": 2, "dead_lettered": 1}
    outcomes = {
        (p.attributes["tier"], p.attributes["namespace"], p.attributes["outcome"]): p.value
        for p in found["freshkey.cache.outcomes"]
    }
    assert outcomes == {("redis", "assets", "applied"): 2, ("redis", "assets", "not_newer"): 1}
    assert "freshkey.lag" not in found, "the lag histograms are the sketch's, not OpenTelemetry instruments"

    series = histograms(registry)
    precise = (("coarse", "false"), ("namespace", "assets"))
    assert series["freshkey_lag_milliseconds_count"][precise] == 1
    assert series["freshkey_lag_milliseconds_sum"][precise] == 42.0
    assert series["freshkey_lag_milliseconds_bucket"][(*precise[:1], ("le", "20"), precise[1])] == 0
    assert series["freshkey_lag_milliseconds_bucket"][(*precise[:1], ("le", "50"), precise[1])] == 1
    coarse = (("coarse", "true"), ("namespace", "assets"))
    assert series["freshkey_lag_milliseconds_count"][coarse] == 1
    assert series["freshkey_lag_milliseconds_sum"][coarse] == 0.0, "a negative lag (clock skew) sums as 0"
    stage_sums = {dict(k)["stage"]: v for k, v in series["freshkey_stage_duration_milliseconds_sum"].items()}
    assert stage_sums == {STAGE_TRANSPORT: 7.0, STAGE_PLAN: pytest.approx(0.4)}

    consumer_lag = {
        (
            p.attributes["messaging.destination.name"],
            p.attributes["messaging.destination.partition.id"],
        ): p.value
        for p in found["freshkey.consumer.lag"]
    }
    assert consumer_lag == {("changes", "0"): 5, ("changes", "1"): 0}
    assert otel.consumer_lag() == {("changes", 0): 5, ("changes", 1): 0}


class CountingMeter:
    """A meter whose synchronous instruments note each call (observable ones are passed through)."""

    def __init__(self, meter: Any) -> None:
        self.meter = meter
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.meter, name)

    def _wrap(self, name: str, inner: Any) -> Any:
        calls = self.calls

        class Noted:
            def add(self, amount: float, attributes: Any = None) -> None:
                calls.append(name)
                inner.add(amount, attributes)

            def record(self, amount: float, attributes: Any = None) -> None:
                calls.append(name)
                inner.record(amount, attributes)

        return Noted()

    def create_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(name, self.meter.create_counter(name, *args, **kwargs))

    def create_histogram(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(name, self.meter.create_histogram(name, *args, **kwargs))


def test_no_opentelemetry_call_per_batch_the_counters_are_read_at_collection() -> None:
    """A batch adds to the observer's tallies; the SDK is asked nothing until a reader collects."""
    reader = InMemoryMetricReader()
    meter = CountingMeter(MeterProvider(metric_readers=[reader]).get_meter("freshkey"))
    otel = OtelObserver(meter=meter)  # type: ignore[arg-type]
    report = BatchReport(
        at=T0, events={"u": 500, "change_applied": 500}, outcomes={("redis", "a", "applied"): 500}
    )
    for _ in range(3):
        otel.on_batch(report)
    otel.on_event("ddl")
    assert meter.calls == [], "no instrument is called per batch or event"
    found = points(reader)
    events = {p.attributes["kind"]: p.value for p in found["freshkey.events"]}
    assert events == {"u": 1500, "change_applied": 1500, "ddl": 1}
    assert [p.value for p in found["freshkey.cache.outcomes"]] == [1500]


def test_consumer_gauges_from_progress_show_unknown_partitions_as_unknown_never_as_zero() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel = OtelObserver(meter=provider.get_meter("freshkey"))
    now = [1_800_000_000.0]
    progress = ConsumerProgress("changes", partitions=3, clock=lambda: now[0])
    otel.watch_progress(progress)
    otel.on_offset("freshkey.hotness", 0, 3)  # an internal topic: not in this view
    otel.set_high_watermarks("freshkey.hotness", {0: 10})
    found = points(reader)
    assert found.get("freshkey.consumer.lag", []) == [], "before the group join: no lag, not a lag of 0"
    unknown = found["freshkey.consumer.partitions.unknown"]
    assert [(dict(p.attributes or {}), p.value) for p in unknown] == [
        ({"messaging.destination.name": "changes"}, 3)
    ]
    progress.set_assignment({0, 1})
    progress.set_high_watermarks({0: 15})
    progress.set_committed({0: 10})
    progress.on_received("changes", 0, 10, now[0] * 1000)
    now[0] += 0.25
    found = points(reader)
    provider.shutdown()
    partition = "messaging.destination.partition.id"
    lag = {p.attributes[partition]: p.value for p in found["freshkey.consumer.lag"]}
    assert lag == {"0": 5}, "partition 1 has no high watermark: no observation"
    ages = {p.attributes[partition]: p.value for p in found["freshkey.consumer.backlog.age"]}
    assert ages == {"0": pytest.approx(250.0)}
    assert [p.value for p in found["freshkey.consumer.partitions.unknown"]] == [1]
    assert otel.consumer_lag() == {("changes", 0): 5}


def test_sla_gauges_and_violation_counter() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel = OtelObserver(meter=provider.get_meter("freshkey"))
    now = [1_800_000_000.0]
    sla = SlaEvaluator(SlaSettings(evaluation_window_s=10), clock=lambda: now[0])
    otel.watch_sla(lambda: sla.state)
    assert points(reader).get("freshkey.sla.violated", []) == [], "nothing to report before any sample"
    Observers([sla], sketch=LagSketch(clock=lambda: now[0])).on_batch(
        BatchReport(at=now[0], lags={"ns": np.array([10.0] * 99 + [5000.0, 5000.0])})
    )
    now[0] += 1
    _, events = sla.evaluate()
    for event in events:
        otel.on_sla_event(event)
    found = points(reader)
    provider.shutdown()
    violated = {p.attributes["target"]: p.value for p in found["freshkey.sla.violated"]}
    assert violated == {"p99_lag": 1, "consistency_window": 1}, "no_data targets are not reported"
    counted = {p.attributes["target"]: p.value for p in found["freshkey.sla.violations"]}
    assert counted == {"p99_lag": 1, "consistency_window": 1}
    (p99,) = found["freshkey.sla.lag.p99"]
    assert isinstance(p99, NumberDataPoint) and p99.value == sla.state.p99_ms
    (ratio,) = found["freshkey.sla.window.ratio"]
    assert ratio.value == pytest.approx(99 / 101)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return text


def series_names(text: str) -> set[str]:
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }


def test_prometheus_endpoint_serves_the_listed_names() -> None:
    port = free_port()
    telemetry = configure_telemetry(
        TelemetrySettings(prometheus_port=port), service="worker", set_global=False
    )
    try:
        assert telemetry.prometheus_port == port
        otel = OtelObserver(meter=telemetry.meter_provider.get_meter("freshkey"), registry=telemetry.registry)
        now = [T0]
        sla = SlaEvaluator(SlaSettings(), clock=lambda: now[0])
        otel.watch_sla(lambda: sla.state)
        observers = Observers([sla, otel], sketch=LagSketch(clock=lambda: now[0]))
        observers.on_batch(BatchReport(at=T0, lags={"ns": np.array([9000.0])}))
        now[0] += 1
        for event in sla.evaluate()[1]:
            otel.on_sla_event(event)
        observers.on_event("c")
        observers.on_batch(
            BatchReport(
                at=T0,
                outcomes={("redis", "assets", "tombstoned"): 1},
                lags={"assets": np.array([12.5])},
                stages={STAGE_PLAN: Repeated(0.3, 1)},
            )
        )
        observers.on_offset("changes", 0, 1)
        otel.set_high_watermarks("changes", {0: 4})
        progress = ConsumerProgress("changes", partitions=2)
        progress.set_assignment({0, 1})
        progress.set_high_watermarks({0: 4})
        progress.on_offset("changes", 0, 1)
        otel.watch_progress(progress)
        text = scrape(port)
    finally:
        telemetry.shutdown()
    names = series_names(text)
    worker_names = {n for n in PROMETHEUS_METRIC_NAMES if not n.startswith("freshkey_connector_")}
    assert names == worker_names, f"exported {sorted(names)}"
    assert 'freshkey_lag_milliseconds_bucket{coarse="false",le="20",namespace="assets",' in text
    assert 'freshkey_cache_outcomes_total{namespace="assets",otel_scope_name="freshkey"' in text
    assert (
        'freshkey_consumer_lag{messaging_destination_name="changes",messaging_destination_partition_id="0"'
        in text
    )
    assert 'service_name="freshkey-worker"' in text


def test_connector_metrics_through_the_global_api_in_a_fresh_process() -> None:
    """The connector records through the API; once an entry point configures the SDK they are served."""
    port = free_port()
    script = textwrap.dedent(
        f"""
        import urllib.request
        from pipeline.settings import TelemetrySettings
        from pipeline.observe.otel import configure_telemetry
        from connectors.metrics import CONNECTOR_METRICS as m
        settings = TelemetrySettings(connector_prometheus_port={port})
        first = configure_telemetry(settings, service="connector")
        assert configure_telemetry(settings, service="connector") is first
        m.ack_latency.record(3.0)
        m.checkpoint_ages.append(lambda: 1.5)
        m.retried("database")
        m.oversize.add(1)
        m.gaps.add(1)
        m.unreadable.add(1)
        m.connection_states.append(lambda: 1)
        with urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5) as response:
            print(response.read().decode())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    names = series_names(result.stdout)
    assert names == {n for n in PROMETHEUS_METRIC_NAMES if n.startswith("freshkey_connector_")} | {
        "target_info"
    }
    assert "freshkey_connector_checkpoint_age_seconds{" in result.stdout
    assert 'service_name="freshkey-connector"' in result.stdout


def test_a_busy_port_is_logged_and_the_process_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        telemetry = configure_telemetry(
            TelemetrySettings(prometheus_port=port), service="worker", set_global=False
        )
    try:
        assert telemetry.prometheus_port is None
        assert "FRESHKEY_TELEMETRY_PROMETHEUS_PORT" in caplog.text
    finally:
        telemetry.shutdown()


def test_port_zero_serves_nothing() -> None:
    telemetry = configure_telemetry(TelemetrySettings(prometheus_port=0), service="worker", set_global=False)
    assert telemetry.prometheus_port is None
    telemetry.shutdown()


def test_otlp_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    settings = TelemetrySettings(prometheus_port=0, otlp_endpoint="http://127.0.0.1:4318/v1/traces")
    with pytest.raises(TelemetryError, match=r"freshkey\[otlp\]"):
        configure_telemetry(settings, service="worker", set_global=False)


def test_otlp_with_its_extra_installs_a_tracer_provider() -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    settings = TelemetrySettings(prometheus_port=0, otlp_endpoint="http://127.0.0.1:1/v1/traces")
    telemetry = configure_telemetry(settings, service="worker", set_global=False)
    assert telemetry.tracer_provider is not None
    assert telemetry.tracer_provider.resource.attributes["service.name"] == "freshkey-worker"
    telemetry.tracer_provider.shutdown()
    telemetry.tracer_provider = None
    telemetry.shutdown()


@dataclass(frozen=True)
class _Binding:
    namespace: str


@dataclass(frozen=True)
class _Event:
    op: str
    ts_ms: int


@dataclass(frozen=True)
class _Planned:
    binding: _Binding
    event: _Event
    actions: list[CacheAction] = field(default_factory=list)


def applied(tier_outcomes: dict[str, list[str]]) -> BatchReport:
    """A batch report with each tier's outcomes in sending order, acknowledged now."""
    now = time.time()
    return BatchReport(
        at=now, tier_outcomes=tier_outcomes, tier_done_ms=dict.fromkeys(tier_outcomes, now * 1000)
    )


def test_sampled_changes_are_traced_with_a_key_hash_version_and_outcome() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    otel = OtelObserver(
        meter=meters.get_meter("freshkey"), tracer=provider.get_tracer("freshkey"), trace_sample_every=2
    )
    commit_us = (time.time_ns() // 1000) - 1_000_000
    update = _Planned(
        _Binding("assets"),
        _Event("u", commit_us // 1000 + 3),
        [
            CacheAction("invalidate", "p:{assets}:old", 7, commit_us),
            CacheAction("write", "p:{assets}:new", 7, commit_us, b"v"),
        ],
    )
    insert = _Planned(
        _Binding("assets"),
        _Event("c", commit_us // 1000 + 4),
        [CacheAction("write", "p:{assets}:x", 8, commit_us, b"w")],
    )
    with otel.trace_batch(
        [update, insert], received_ms=commit_us / 1000 + 5, planned_ms=commit_us / 1000 + 6
    ):
        # ChangeProcessor.apply's order: invalidations, then writes, each in batch order.
        otel.on_batch(applied({"redis": ["tombstoned", "applied", "not_newer"]}))
    spans = exporter.get_finished_spans()
    meters.shutdown()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (root,) = by_name["freshkey.apply"]
    changes = by_name["freshkey.change"]
    assert root.attributes["freshkey.batch.actions"] == 3 and root.attributes["freshkey.batch.sampled"] == 2
    assert [dict(c.attributes) for c in changes] == [
        {
            "freshkey.namespace": "assets",
            "freshkey.key.hash": key_hash("p:{assets}:old"),
            "freshkey.version": "7",
            "freshkey.op": "u",
            "freshkey.action": "invalidate",
            "freshkey.outcome.redis": "tombstoned",
        },
        {
            "freshkey.namespace": "assets",
            "freshkey.key.hash": key_hash("p:{assets}:x"),
            "freshkey.version": "8",
            "freshkey.op": "c",
            "freshkey.action": "write",
            "freshkey.outcome.redis": "not_newer",
        },
    ]
    assert all(c.parent is not None and c.parent.span_id == root.context.span_id for c in changes)
    assert changes[0].start_time == commit_us * 1000, "a change's span starts at its commit"
    assert [e.name for e in changes[0].events] == [
        "read by connector",
        "received by worker",
        "keys computed",
        "acknowledged by redis",
    ]
    assert all("p:{assets}" not in str(c.attributes) for c in changes), "raw keys never leave the process"

    exporter.clear()
    with otel.trace_batch([insert], received_ms=0, planned_ms=0):  # counter at 3: not sampled
        otel.on_batch(applied({"redis": ["applied"]}))
    assert exporter.get_finished_spans() == ()
    provider.shutdown()


def test_without_an_sdk_tracer_provider_tracing_records_nothing() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    otel = OtelObserver(meter=meters.get_meter("freshkey"), trace_sample_every=1)
    planned = _Planned(_Binding("a"), _Event("c", 1), [CacheAction("write", "k", 1, 1, b"v")])
    with otel.trace_batch([planned], received_ms=0, planned_ms=0):
        otel.on_batch(applied({"redis": ["applied"]}))
    assert otel.tracer._batch is None
    meters.shutdown()


def test_outcomes_that_do_not_fit_the_reporting_order_are_dropped() -> None:
    actions = [CacheAction("write", "a", 1, 1, b"v"), CacheAction("invalidate", "b", 1, 1)]
    assert _outcomes_by_action(actions, ["tombstoned", "applied"]) == ["applied", "tombstoned"]
    assert _outcomes_by_action(actions, ["applied", "tombstoned"]) is None
    assert _outcomes_by_action(actions, ["applied"]) is None
