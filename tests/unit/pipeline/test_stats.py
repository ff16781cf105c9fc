"""pipeline.observe.stats: counts, offsets, and lag figures read from the sketch with their windows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.observe import BatchReport, Observers, Repeated
from pipeline.observe.sketch import GROWTH, LagSketch, rank
from pipeline.observe.stats import WorkerStats
from tests.support.fakes import T0, Clock


def wired(clock: Clock) -> tuple[WorkerStats, Observers]:
    stats = WorkerStats(clock=clock)
    return stats, Observers([stats], sketch=LagSketch(clock=clock))


def nearest_rank(values: list[float], q: float) -> float:
    return sorted(values)[rank(q, len(values)) - 1]


def test_lag_is_per_namespace_and_coarse_samples_are_only_counted() -> None:
    clock = Clock()
    stats, observers = wired(clock)
    observers.on_batch(
        BatchReport(
            at=T0,
            lags={"assets": np.array([4.0, 1.0, 3.0, 2.0]), "texts": np.array([10.0])},
            coarse_lags={"assets": np.array([5000.0, 9000.0]), "audio": np.array([7000.0])},
        )
    )
    snap = stats.snapshot()
    assert snap["lag_ms"]["assets"] == {"window_s": None, "samples": 4, "p50": 2.0, "p99": 4.0, "max": 4.0}
    assert snap["lag_ms"]["texts"] == {"window_s": None, "samples": 1, "p50": 10.0, "p99": 10.0, "max": 10.0}
    assert "audio" not in snap["lag_ms"]  # only coarse samples: no lag figures
    assert snap["coarse_lag_samples"] == {"assets": 2, "audio": 1}


def test_percentiles_are_nearest_rank_within_the_sketch_bound() -> None:
    rng = random.Random(11)
    values = [rng.lognormvariate(3, 0.9) for _ in range(50_000)]
    clock = Clock()
    stats, observers = wired(clock)
    observers.on_batch(BatchReport(at=T0, lags={"ns": np.array(values)}))
    figures = stats.snapshot()["lag_ms"]["ns"]
    assert figures["samples"] == len(values) and figures["max"] == max(values)
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        exact = nearest_rank(values, q)
        assert exact <= figures[name] < exact * GROWTH, name


def test_every_window_states_itself_and_leaves_out_the_current_second() -> None:
    clock = Clock(T0 + 0.4)
    stats, observers = wired(clock)
    observers.on_batch(BatchReport(at=T0 - 30.5, lags={"a": np.array([1000.0])}))
    observers.on_batch(
        BatchReport(
            at=T0 - 2.5,
            lags={"a": np.array([10.0, 20.0]), "b": np.array([30.0])},
            coarse_lags={"a": np.array([900.0])},
            stages={"worker->planned": Repeated(0.5, 4)},
        )
    )
    observers.on_batch(BatchReport(at=T0 + 0.1, lags={"a": np.array([5.0])}))  # still filling
    windows = stats.snapshot()["windows"]
    assert set(windows) == {"last_10s", "last_60s", "since_start"}
    ten, sixty, start = windows["last_10s"], windows["last_60s"], windows["since_start"]
    assert (ten["window_s"], ten["end"]) == (10.0, T0) and start["window_s"] is None
    assert ten["lag_ms"] == {"window_s": 10.0, "samples": 3, "p50": 20.0, "p99": 30.0, "max": 30.0}
    assert ten["lag_ms_by_namespace"]["b"]["samples"] == 1 and ten["coarse_lag_samples"] == 1
    assert ten["stages_ms"]["worker->planned"]["samples"] == 4
    assert sixty["lag_ms"]["samples"] == 4 and sixty["lag_ms"]["max"] == 1000.0
    assert start["lag_ms"]["samples"] == 5, "since start counts the current second too"


def test_counts_come_per_batch_and_offsets_are_the_last_acknowledged() -> None:
    stats, observers = wired(Clock())
    observers.on_event("ddl")
    observers.on_batch(
        BatchReport(
            at=T0,
            events={"u": 3, "change_applied": 3},
            outcomes={("redis", "a", "applied"): 2, ("redis", "b", "applied"): 1, ("l3", "a", "fenced"): 3},
        )
    )
    for partition, offset in ((0, 5), (1, 0), (0, 9), (0, 2)):  # partition 0 restarts (a recreated topic)
        observers.on_offset("changes", partition, offset)
    observers.on_offset("other", 0, 1)
    snap = stats.snapshot()
    assert snap["events"] == {"ddl": 1, "u": 3, "change_applied": 3}
    assert snap["outcomes"] == {"redis:applied": 3, "l3:fenced": 3}
    assert stats.offsets == snap["offsets"] == {"changes/0": 2, "changes/1": 0, "other/0": 1}


def test_snapshot_shape() -> None:
    stats, observers = wired(Clock())
    observers.on_batch(BatchReport(at=T0, stages={"commit->connector": np.array([1.0])}))
    snap = stats.snapshot(now=T0 + 1)
    assert set(snap) == {
        "uptime_s",
        "events",
        "outcomes",
        "lag_ms",
        "coarse_lag_samples",
        "stages_ms",
        "windows",
        "offsets",
    }
    assert snap["stages_ms"]["commit->connector"]["samples"] == 1
    assert snap["lag_ms"] == {} and snap["windows"]["last_10s"]["lag_ms"]["p99"] is None
    assert snap["uptime_s"] == pytest.approx(1.0)
