"""One definition per figure: ``/freshkey/stats``, the SLA state, the dashboard's series and the
Prometheus SLA gauge give the same p50/p99/max for the same window from the same samples.

Issue 13 saw a dashboard with three p99 values at once (179, 205 and 314 ms), a green p99 tile of 19.1 ms
beside an SLA card saying 4.14 s violated, and ``p99 lag 204.8 ms <= 200 ms ... ok``: four aggregators,
each with its own percentile definition and window. Here the samples go through the worker's own path
(``ChangeProcessor.apply`` -> ``Observers`` -> the lag sketch) and every reader is asked at one moment.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from pipeline.observe import BatchReport, Observers
from pipeline.observe.otel import OtelObserver
from pipeline.observe.series import SUMMARY_WINDOW_S, SeriesRecorder
from pipeline.observe.sketch import LagSketch
from pipeline.observe.sla import SlaEvaluator
from pipeline.observe.stats import WorkerStats
from pipeline.processor import ChangeProcessor
from pipeline.settings import SlaSettings
from schemas import Binding, Bindings
from tests.support.fakes import T0, Clock, InstantTier, update_message


def readers(clock: Clock, sla_settings: SlaSettings) -> tuple[Observers, dict[str, Any]]:
    stats = WorkerStats(clock=clock)
    sla = SlaEvaluator(sla_settings, worker="w", clock=clock)
    series = SeriesRecorder(clock=clock)
    reader = InMemoryMetricReader()
    otel = OtelObserver(meter=MeterProvider(metric_readers=[reader]).get_meter("freshkey"))
    otel.watch_sla(lambda: sla.state)
    observers = Observers([stats, sla, series, otel], sketch=LagSketch(clock=clock))
    return observers, {"stats": stats, "sla": sla, "series": series, "reader": reader}


def figures_of(parts: dict[str, Any], seconds: float) -> dict[str, tuple[float | None, ...]]:
    """(p50, p99, max, samples) of the window from each reader, asked at the same moment (and the
    Prometheus gauge ``freshkey_sla_lag_p99_milliseconds`` checked against the SLA's p99)."""
    name = f"last_{seconds:g}s"
    stats = parts["stats"].snapshot()["windows"][name]["lag_ms"]
    state, _ = parts["sla"].evaluate()
    series = parts["series"].snapshot()
    found = {
        "stats": (stats["p50"], stats["p99"], stats["max"], stats["samples"]),
        "series windows": tuple(
            series["windows"][name]["lag_ms"][k] for k in ("p50", "p99", "max", "samples")
        ),
    }
    if seconds == state.evaluation_window_s:
        found["sla"] = (state.p50_ms, state.p99_ms, state.max_ms, state.samples)
    if seconds == SUMMARY_WINDOW_S:
        summary = series["summary"]["lag_ms"]
        found["dashboard summary"] = (summary["p50"], summary["p99"], summary["max"], summary["samples"])
    data = parts["reader"].get_metrics_data()
    gauges = [
        p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "freshkey.sla.lag.p99"
        for p in m.data.data_points
    ]
    assert gauges == [state.p99_ms], "the Prometheus gauge is the SLA state's p99"
    return found


def _change(row_id: int, commit_us: int) -> bytes:
    return update_message(row_id, table="t", commit_us=commit_us, ts_ms=commit_us // 1000 + 1)


@pytest.mark.parametrize("window_s", [60.0, 10.0])
def test_stats_sla_series_and_prometheus_agree_on_samples_applied_by_the_processor(window_s: float) -> None:
    rng = random.Random(int(window_s))
    clock = Clock(time.time())
    observers, parts = readers(clock, SlaSettings(evaluation_window_s=window_s))
    processor = ChangeProcessor(
        Bindings(bindings=(Binding(table="shop.t", namespace="t"),)),  # type: ignore[call-arg]
        [InstantTier()],  # type: ignore[list-item]
        key_prefix="fk",
    )
    processor.observers = observers
    loop = asyncio.new_event_loop()
    try:
        for batch in range(20):
            now_us = time.time_ns() // 1000
            messages = [
                (None, _change(batch * 100 + i, now_us - int(rng.lognormvariate(10, 1.0))))
                for i in range(100)
            ]
            prepared = loop.run_until_complete(processor.prepare(messages))
            loop.run_until_complete(processor.apply(prepared.planned, received_ms=0, planned_ms=0))
    finally:
        loop.close()
    clock.now = time.time() + 1  # every second recorded is over: in the window
    found = figures_of(parts, window_s)
    expected = found["stats"]
    assert expected[3] == 2000 and expected[1] is not None
    assert all(figures == expected for figures in found.values()), found


def test_every_window_agrees_across_readers_on_a_multi_second_feed() -> None:
    rng = random.Random(3)
    clock = Clock(T0)
    observers, parts = readers(clock, SlaSettings(evaluation_window_s=60.0))
    values: list[tuple[float, float]] = []
    for second in range(90):
        for _ in range(rng.randint(0, 3)):
            lags = [rng.lognormvariate(3.5, 1.1) for _ in range(rng.randint(1, 200))]
            at = T0 + second + rng.random()
            values += [(at, lag) for lag in lags]
            observers.on_batch(
                BatchReport(at=at, lags={rng.choice(["a", "b"]): np.array(lags)}, events={"u": len(lags)})
            )
    clock.now = T0 + 90.5
    sixty, ten = figures_of(parts, 60.0), figures_of(parts, 10.0)
    assert "sla" in sixty and "dashboard summary" in sixty and len(ten) == 2
    for found in (sixty, ten):
        first = next(iter(found.values()))
        assert all(figures == first for figures in found.values()), found
    in_sixty = [lag for at, lag in values if T0 + 30 <= at < T0 + 90]
    assert sixty["stats"][3] == len(in_sixty) and sixty["stats"][2] == max(in_sixty)
    interpolated = float(np.percentile(in_sixty, 99))
    assert sixty["stats"][1] != interpolated, "the old stats page's figure would differ from the SLA's"
