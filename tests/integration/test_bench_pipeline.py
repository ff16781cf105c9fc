"""``freshkey bench pipeline``: it runs end to end on its own private services and writes every figure.

The smoke test uses tiny sizes and asserts the shape and the internal consistency of the figures, never
a speed (the machines are shared; speeds are what the bench is for). The summary arithmetic and the
option parsing are checked on synthetic input in tests/unit/pipeline/test_bench_report.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.processes import processes_mentioning

STAGES = {"commit->connector", "connector->worker", "worker->planned", "planned->tier:redis"}


def _bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run ``freshkey bench pipeline`` with tiny sizes, two runs and ``args``; its JSON report. Afterwards
    nothing it started may be left running."""
    out = tmp_path / "bench.json"
    workdir = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipeline.commands.bench import bench_app; bench_app()",
            "pipeline",
            *("--changes", "200", "--insert-rows", "100", "--rows", "100", "--runs", "2"),
            *("--partitions", "2", "--workdir", str(workdir), "--json", str(out)),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "figures written to" in result.stdout
    assert processes_mentioning(str(workdir)) == []
    report: dict[str, Any] = orjson.loads(out.read_bytes())
    return report


def _check_backlog_figures(report: dict[str, Any], scenarios: tuple[str, ...]) -> None:
    """Both backlogs, two runs, each scenario: 200 rows in a positive time, the rate that makes."""
    assert report["config"]["changes"] == 200 and report["config"]["inserts"] == 2
    assert report["rates"]["runs"] == []
    for kind in ("single", "multi"):
        entry = report["backlogs"][kind]
        assert entry["rows"] == 200 and [run["run"] for run in entry["runs"]] == [1, 2]
        for run in entry["runs"]:
            assert set(run) == {"run", *scenarios}
            for scenario in scenarios:
                figures = run[scenario]
                assert figures["items"] == 200, (kind, scenario)
                assert figures["seconds"] > 0 and figures["per_s"] > 0
                assert figures["per_s"] == pytest.approx(200 / figures["seconds"], rel=1e-3)
                assert figures["background_cores"] >= 0
                assert figures.get("rejoins", 0) == 0  # no consumer group rebalance inside a measurement
        summary = report["summary"]["backlogs"][kind]
        assert set(summary["scenarios"]) == set(scenarios)
        for figures in summary["scenarios"].values():
            assert figures["per_s"]["runs"] == 2
            assert figures["per_s"]["min"] <= figures["per_s"]["median"] <= figures["per_s"]["max"]


def _written(report: dict[str, Any], *names: str) -> int:
    """Changes the workers ``names`` wrote into Redis: applied, or superseded by a newer change of the
    same row in the same batch (never rejected as older)."""
    figures = [report["worker_outcomes"][name] for name in names]
    return sum(
        f["outcomes"].get("redis:applied", 0) + f["events"].get("change_superseded", 0) for f in figures
    )


@pytest.mark.integration
def test_bench_pipeline_measures_the_ceilings_the_connector_and_end_to_end(tmp_path: Path) -> None:
    scenarios = ("raw-decode", "raw-redis", "connector", "e2e")
    report = _bench(tmp_path, "--only", ",".join(scenarios))

    _check_backlog_figures(report, scenarios)
    for kind in ("single", "multi"):
        for run in report["backlogs"][kind]["runs"]:
            # What each scenario charged, and to whom: the measured process did the work.
            assert run["raw-decode"]["processes"]["bench"]["cpu_s"] > 0
            assert run["connector"]["processes"]["connector"]["cpu_s"] > 0
            assert {"connector", "worker", "mariadb", "kafka", "redis"} <= set(run["e2e"]["processes"])
            for figures in run["e2e"]["processes"].values():
                assert figures["peak_rss_mib"] > 0 and figures["hwm_mib"] >= figures["peak_rss_mib"]
        ratios = report["summary"]["backlogs"][kind]["ratios"]
        assert set(ratios) == {"connector / raw decode", "e2e / raw decode"}
        runs = report["backlogs"][kind]["runs"]
        per_run = sorted(run["connector"]["per_s"] / run["raw-decode"]["per_s"] for run in runs)
        assert ratios["connector / raw decode"]["min"] == pytest.approx(per_run[0], rel=1e-3)
        assert ratios["connector / raw decode"]["max"] == pytest.approx(per_run[-1], rel=1e-3)
    # The end-to-end worker wrote both backlogs of both runs: 4 x 200 changes.
    assert _written(report, "worker-e2e") >= 800


@pytest.mark.integration
def test_bench_pipeline_drains_copies_with_one_worker_and_with_two(tmp_path: Path) -> None:
    scenarios = ("worker", "workers-2")
    report = _bench(tmp_path, "--only", ",".join(scenarios))

    _check_backlog_figures(report, scenarios)
    for kind in ("single", "multi"):
        for run in report["backlogs"][kind]["runs"]:
            assert run["worker"]["processes"]["worker"]["cpu_s"] > 0
            assert run["workers-2"]["processes"]["worker-1"]["cpu_s"] > 0
            assert run["workers-2"]["processes"]["worker-2"]["cpu_s"] > 0
        assert set(report["summary"]["backlogs"][kind]["ratios"]) == {"2 workers / 1 worker"}
    # Each backlog of each run was copied once, in full, to each group: 4 x 200 changes written by the
    # single worker, and by the pair between them.
    assert _written(report, "worker-one") >= 800
    assert _written(report, "worker-two-a", "worker-two-b") >= 800


@pytest.mark.integration
def test_bench_pipeline_drives_fixed_rates_with_lag_per_stage(tmp_path: Path) -> None:
    report = _bench(tmp_path, "--only", "rates", "--rates", "200,300", "--rate-seconds", "1", "--runs", "1")

    assert report["backlogs"] == {}
    runs = report["rates"]["runs"]
    assert [(run["rate"], run["changes"]) for run in runs] == [(200, 200), (300, 300)]
    for run in runs:
        assert isinstance(run["sustained"], bool) and isinstance(run["reached_rate"], bool)
        lag = run["lag_ms"]
        assert lag["samples"] == run["changes"]  # the driven changes only: warm-ups have their own table
        assert 0 < lag["p50"] <= lag["p99"] <= lag["max"]
        assert set(run["stages_ms"]) >= STAGES
        broker = run["broker_lag_ms"]  # the broker alone, at the same rate for as long
        assert broker["samples"] == run["changes"] and 0 < broker["p50"] <= broker["p99"] <= broker["max"]
        assert len(broker["p50_by_second"]) in (1, 2)
        assert run["processes"]["connector"]["cpu_s"] > 0 and run["processes"]["worker"]["cpu_s"] > 0
        assert run["catch_up_s"] == pytest.approx(
            run["changes"] / run["throughput_per_s"] - run["drive_s"], abs=0.01
        )
    summary = report["summary"]["rates"]
    assert set(summary) == {"200", "300"}
    assert summary["300"]["runs"] == 1 and set(summary["300"]["lag_ms"]) == {"p50", "p99", "max"}
    assert set(summary["300"]["broker_lag_ms"]) == {"p50", "p99", "max"}
