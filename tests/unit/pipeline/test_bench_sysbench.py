"""``freshkey bench sysbench`` without services: reading sysbench's report, and the message when
sysbench is not installed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.bench.config import BenchError
from pipeline.bench.sysbench_tool import (
    ROWS_PER_TRANSACTION,
    SysbenchConfig,
    parse_sysbench,
    sysbench_args,
    sysbench_binary,
)

# The end of a real `sysbench 1.0.20 oltp_write_only ... run` (4 threads, 5 s) on the private MariaDB.
REPORT = """
SQL statistics:
    queries performed:
        read:                            0
        write:                           40174
        other:                           20106
        total:                           60280
    transactions:                        10017  (1999.72 per sec.)
    queries:                             60280  (12033.85 per sec.)
    ignored errors:                      72     (14.37 per sec.)
    reconnects:                          0      (0.00 per sec.)

General statistics:
    total time:                          5.0087s
    total number of events:              10017

Latency (ms):
         min:                                    0.23
         avg:                                    1.99
         max:                                   88.15
         95th percentile:                        5.00
         sum:                                19983.64
"""


def test_sysbench_report_is_read() -> None:
    figures = parse_sysbench(REPORT)

    assert figures == {
        "transactions": 10017,
        "transactions_per_s": 1999.72,
        "queries": 60280,
        "queries_per_s": 12033.85,
        "ignored_errors": 72,
        "ignored_errors_per_s": 14.37,
        "reconnects": 0,
        "reconnects_per_s": 0.0,
        "total_time_s": 5.0087,
        "latency_min_ms": 0.23,
        "latency_avg_ms": 1.99,
        "latency_max_ms": 88.15,
        "latency_p95_ms": 5.0,
    }
    # That run's connector and worker applied 40,068 row changes: 4 per committed transaction (the
    # transactions that hit an ignored error were rolled back and are not counted).
    assert figures["transactions"] * ROWS_PER_TRANSACTION == 40_068


def test_an_interrupted_report_has_no_transactions() -> None:
    assert "transactions" not in parse_sysbench("Threads started!\nFATAL: mysql_drv_query() failed\n")


def test_without_sysbench_the_error_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(BenchError, match=r"sysbench not found .*apt-get install -y sysbench"):
        sysbench_binary()


def test_rate_reaches_sysbench_and_a_negative_one_is_refused() -> None:
    db = SimpleNamespace(host="127.0.0.1", port=3306, admin_user="root", admin_password="pw")
    unthrottled = sysbench_args("sysbench", SysbenchConfig(), db, "run")  # type: ignore[arg-type]
    assert "--rate=0" in unthrottled
    throttled = sysbench_args("sysbench", SysbenchConfig(rate=1500), db, "run")  # type: ignore[arg-type]
    assert "--rate=1500" in throttled and "--rate=0" not in throttled
    assert SysbenchConfig(rate=1500).pace == "throttled to 1,500 tps"
    assert SysbenchConfig().pace == "unthrottled"
    with pytest.raises(ValueError, match="--rate"):
        SysbenchConfig(rate=-1).check()
