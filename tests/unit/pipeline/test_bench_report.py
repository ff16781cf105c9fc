"""``freshkey bench pipeline`` without services: the summary arithmetic, the tables and the option parsing,
on synthetic figures."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rich.console import Console

from pipeline.bench.config import BenchConfig, parse_only
from pipeline.bench.raw import _lag_figures
from pipeline.bench.report import render, summarize


def _run(per_s: dict[str, float]) -> dict[str, Any]:
    return {
        name: {"items": 100, "seconds": 100 / v, "per_s": v, "processes": {}, "background_cores": 0.5}
        for name, v in per_s.items()
    }


def test_summary_takes_medians_over_runs_and_ratios_per_run() -> None:
    runs = [
        {"run": 1, **_run({"raw-decode": 1000.0, "connector": 500.0})},
        {"run": 2, **_run({"raw-decode": 2000.0, "connector": 1800.0})},
        {"run": 3, **_run({"raw-decode": 1500.0, "connector": 600.0})},
    ]
    summary = summarize({"backlogs": {"single": {"rows": 100, "transactions": 100, "runs": runs}}})
    single = summary["backlogs"]["single"]
    assert single["scenarios"]["connector"]["per_s"] == {
        "median": 600.0,
        "min": 500.0,
        "max": 1800.0,
        "runs": 3,
    }
    # Per-run ratios 0.5, 0.9, 0.4: their median, not the ratio of the medians (600 / 1500 = 0.4).
    assert single["ratios"] == {"connector / raw decode": {"median": 0.5, "min": 0.4, "max": 0.9, "runs": 3}}


def test_tables_say_when_other_processes_kept_the_machine_busy() -> None:
    def printed(background: float) -> str:
        runs = [{"run": 1, **_run({"raw-decode": 1000.0, "connector": 500.0})}]
        for scenario in runs[0].values():
            if isinstance(scenario, dict):
                scenario["background_cores"] = background
        report = {
            "config": {"runs": 1},
            "backlogs": {"single": {"rows": 100, "transactions": 100, "runs": runs}},
        }
        console = Console(record=True, width=200)
        render(report, summarize(report), console)
        return console.export_text()

    assert "connector / raw decode: 0.50x" in printed(0.1)
    assert "other processes used" not in printed(0.1)
    assert "other processes used 1.5 cores" in printed(1.5)


def test_only_picks_backlogs_and_scenarios_and_full_matches_the_issue() -> None:
    assert parse_only([]) == (("single", "multi"), BenchConfig().scenarios)
    assert parse_only(["multi,e2e", "rates"]) == (("multi",), ("e2e", "rates"))
    with pytest.raises(ValueError, match="unknown e2d"):
        parse_only(["e2d"])
    full = BenchConfig.full()
    assert (full.changes, full.inserts, full.insert_rows) == (50_000, 50, 1_000)
    with pytest.raises(ValueError, match="--runs"):
        BenchConfig(runs=0).check()


def _rate_run(rate: float, broker_p50: float | None) -> dict[str, Any]:
    run: dict[str, Any] = {
        "rate": rate,
        "run": 1,
        "changes": 100,
        "drive_s": 1.0,
        "driven_per_s": rate,
        "throughput_per_s": rate,
        "catch_up_s": 0.01,
        "reached_rate": True,
        "sustained": True,
        "lag_ms": {"p50": 9.0, "p99": 20.0, "max": 30.0},
        "stages_ms": {"connector->worker": {"p50": 7.0, "p99": 15.0, "max": 25.0}},
        "processes": {},
        "background_cores": 0.0,
    }
    if broker_p50 is not None:
        run["broker_lag_ms"] = {"p50": broker_p50, "p99": 2 * broker_p50, "max": 3 * broker_p50}
    return run


def test_the_stage_table_shows_the_broker_alone_beside_the_stages() -> None:
    def printed(broker_p50: float | None) -> str:
        report = {"config": {"runs": 1}, "backlogs": {}, "rates": {"runs": [_rate_run(1000.0, broker_p50)]}}
        console = Console(record=True, width=200)
        render(report, summarize(report), console)
        return console.export_text()

    assert re.search(r"the broker alone +│ +4\.5 / 9\.0 / 13\.5 │", printed(4.5))
    assert "the broker alone" not in printed(None)  # a report from before the figure existed


def test_broker_lag_figures_give_percentiles_and_the_p50_of_each_second() -> None:
    sent = [0.0, 0.5, 1.0, 1.2, 1.9, 2.5]
    lags = [1.0, 3.0, 10.0, 30.0, 20.0, 5.0]
    figures = _lag_figures(sent, lags)
    assert figures == {
        "samples": 6,
        "p50": 10.0,
        "p99": 30.0,
        "max": 30.0,
        "p50_by_second": [3.0, 20.0, 5.0],
    }
