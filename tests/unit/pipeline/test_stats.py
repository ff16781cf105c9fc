"""pipeline.observe.stats: percentiles (numpy's default linear interpolation), summaries, lag and offsets."""

from __future__ import annotations

import pytest

from pipeline.observe.stats import WorkerStats, percentile, summarize

# Expected values computed by hand with numpy's default ("linear") method:
# rank = (n - 1) * q / 100; result = v[floor(rank)] + (v[floor(rank) + 1] - v[floor(rank)]) * frac(rank).


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([10.0], 0, 10.0),
        ([10.0], 50, 10.0),
        ([10.0], 99, 10.0),
        ([10.0], 100, 10.0),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # rank 1.5
        ([1.0, 2.0, 3.0, 4.0], 99, 3.97),  # rank 2.97 -> 3 + 0.97
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([1.0, 3.0], 25, 1.5),  # rank 0.25
        ([15.0, 20.0, 35.0, 40.0, 50.0], 40, 29.0),  # rank 1.6 -> 20 + 15 * 0.6
        ([0.0, 10.0, 20.0, 30.0, 40.0], 90, 36.0),  # rank 3.6
        ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),  # rank 2 exactly
        ([5.0, 5.0, 5.0, 100.0], 50, 5.0),
        (list(map(float, range(101))), 99, 99.0),  # rank 99
        (list(map(float, range(1, 11))), 99, 9.91),  # rank 8.91 -> 9 + 0.91
    ],
)
def test_percentile_matches_numpy_linear(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected, abs=1e-9)


def test_percentile_of_nothing_raises() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summarize_empty() -> None:
    assert summarize([]) == {"p50": None, "p99": None, "max": None, "samples": 0}
    assert summarize(iter(())) == {"p50": None, "p99": None, "max": None, "samples": 0}


def test_summarize_sorts_its_input() -> None:
    summary = summarize([4.0, 1.0, 3.0, 2.0])
    assert summary["p50"] == pytest.approx(2.5)
    assert summary["p99"] == pytest.approx(3.97)
    assert summary["max"] == 4.0
    assert summary["samples"] == 4


def test_summarize_single_and_generator() -> None:
    assert summarize(x for x in [7.5]) == {"p50": 7.5, "p99": 7.5, "max": 7.5, "samples": 1}


def test_lag_is_per_namespace_and_coarse_samples_are_only_counted() -> None:
    stats = WorkerStats()
    for lag in (4.0, 1.0, 3.0, 2.0):
        stats.record_lag("assets", lag, coarse=False)
    stats.record_lag("texts", 10.0, coarse=False)
    stats.record_lag("assets", 5000.0, coarse=True)
    stats.record_lag("assets", 9000.0, coarse=True)
    stats.record_lag("audio", 7000.0, coarse=True)

    snap = stats.snapshot()
    assert snap["lag_ms"]["assets"] == {"p50": 2.5, "p99": pytest.approx(3.97), "max": 4.0, "samples": 4}
    assert snap["lag_ms"]["texts"] == {"p50": 10.0, "p99": 10.0, "max": 10.0, "samples": 1}
    assert "audio" not in snap["lag_ms"]  # only coarse samples: no lag figures
    assert snap["coarse_lag_samples"] == {"assets": 2, "audio": 1}


def test_max_samples_bounds_memory() -> None:
    stats = WorkerStats(max_samples=3)
    for lag in (100.0, 1.0, 2.0, 3.0):
        stats.record_lag("ns", lag, coarse=False)
        stats.record_stage("decode", lag)
    snap = stats.snapshot()
    assert snap["lag_ms"]["ns"]["samples"] == 3
    assert snap["lag_ms"]["ns"]["max"] == 3.0  # the oldest sample was dropped
    assert snap["stages_ms"]["decode"]["samples"] == 3


def test_record_offset_keeps_the_max() -> None:
    stats = WorkerStats()
    stats.record_offset("changes", 0, 5)
    stats.record_offset("changes", 0, 3)
    stats.record_offset("changes", 1, 0)
    stats.record_offset("changes", 0, 9)
    stats.record_offset("changes", 0, 7)
    stats.record_offset("other", 0, 1)
    assert stats.offsets == {"changes/0": 9, "changes/1": 0, "other/0": 1}
    assert stats.snapshot()["offsets"] == {"changes/0": 9, "changes/1": 0, "other/0": 1}


def test_snapshot_shape() -> None:
    stats = WorkerStats()
    stats.events["c"] += 2
    stats.outcomes["redis:applied"] += 1
    stats.record_stage("commit->connector", 1.0)
    snap = stats.snapshot()
    assert set(snap) == {
        "uptime_s",
        "events",
        "outcomes",
        "lag_ms",
        "coarse_lag_samples",
        "stages_ms",
        "offsets",
    }
    assert snap["events"] == {"c": 2}
    assert snap["outcomes"] == {"redis:applied": 1}
    assert snap["stages_ms"]["commit->connector"]["samples"] == 1
    assert snap["uptime_s"] >= 0
