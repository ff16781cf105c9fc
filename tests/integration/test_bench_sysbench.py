"""``freshkey bench sysbench``: a short sysbench run on small tables, end to end on its own private
services; the report holds every figure, they agree with each other and with sysbench's, and nothing is
stale. No speed is asserted (the machines are shared; speeds are what the bench is for).

Needs sysbench (``make system-packages-test`` installs it); skipped, saying so, without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.bench.sysbench_tool import ROWS_PER_TRANSACTION
from tests.support.processes import processes_mentioning

pytestmark = pytest.mark.skipif(
    shutil.which("sysbench") is None,
    reason="sysbench is not installed: apt-get update && apt-get install -y sysbench "
    "(make system-packages-test does it)",
)


@pytest.mark.integration
def test_bench_sysbench_reports_how_far_behind_freshkey_ends_and_nothing_stale(tmp_path: Path) -> None:
    out = tmp_path / "sysbench.json"
    workdir = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipeline.commands.bench import bench_app; bench_app()",
            "sysbench",
            *("--time", "3", "--threads", "2", "--tables", "2", "--table-size", "500"),
            *("--partitions", "2", "--workdir", str(workdir), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "figures written to" in result.stdout
    assert processes_mentioning(str(workdir)) == []
    report: dict[str, Any] = orjson.loads(out.read_bytes())

    sysbench = report["sysbench"]
    assert sysbench["transactions"] > 0 and sysbench["transactions_per_s"] > 0
    # Every committed transaction's 4 row changes reached the worker, and no other change did.
    assert report["row_changes"] == sysbench["transactions"] * ROWS_PER_TRANSACTION
    assert report["sysbench_row_changes"] == report["row_changes"]
    assert report["row_changes_per_s"] > 0 and report["binlog_bytes"] > 0

    end = report["at_sysbench_end"]
    assert 0 <= end["changes_not_applied"] <= report["row_changes"]
    assert end["changes_applied"] + end["changes_not_applied"] == report["row_changes"]
    assert end["connector_caught_up_s"] is not None
    assert 0 <= end["connector_caught_up_s"] <= end["caught_up_s"]
    assert end["caught_up_within_target"] == (end["caught_up_s"] <= 2.0)

    # Lag percentiles per sbtest namespace, from the µs commit-time column the bench adds.
    assert set(report["lag_ms"]) == {"sbtest1", "sbtest2"}
    for lag in report["lag_ms"].values():
        assert lag["samples"] > 0 and 0 < lag["p50"] <= lag["p99"] <= lag["max"]

    for phase in ("run", "catch_up"):
        assert {"connector", "worker", "mariadb", "redis", "kafka"} <= set(report["processes"][phase])
    assert report["processes"]["run"]["sysbench"]["cpu_s"] > 0
    assert report["processes"]["run"]["connector"]["cpu_s"] > 0
    assert report["processes"]["run"]["mariadb"]["cpu_s"] > 0
    assert len(report["samples"]) >= 2
    assert set(report["cpu_us_per_change"]) == {"connector", "kafka", "worker", "redis"}
    assert report["cpu_us_per_change"]["connector"] > 0 and report["cpu_us_per_change"]["worker"] > 0

    verify = report["verify"]
    assert verify["exit_code"] == 0 and verify["unverifiable"] == []
    assert verify["stale"] == 0 and verify["in_flight"] == 0
    # Every row of both tables (and the sentinels) is either checked in Redis or missing there (never
    # changed since freshkey started); most were changed.
    assert verify["rows"] == 2 * 500 + report["config"]["partitions"] + 1
    assert verify["checked"] + verify["missing"] == verify["rows"]
    assert verify["checked"] > verify["rows"] // 4
