"""sysbench itself, for ``freshkey bench sysbench`` (:mod:`pipeline.bench.sysbench`): finding it, what one
run is (:class:`SysbenchConfig`), its command line, and reading its final report."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.bench.config import BenchError
from pipeline.embedded import LocalMariaDB
from pipeline.embedded.process import MissingBinaryError, find_binary

SYSBENCH_INSTALL = "apt-get update && apt-get install -y sysbench"
DATABASE = "sbtest"
SENTINEL_TABLE = "freshkey_sentinel"
SENTINEL_NAMESPACE = "sysbench_sentinel"
COMMIT_TIME_COLUMN = "freshkey_at"
ROWS_PER_TRANSACTION = 4
"""Row changes of one oltp_write_only transaction: UPDATE (indexed), UPDATE (non-indexed), DELETE, INSERT."""
CAUGHT_UP_TARGET_S = 2.0


@dataclass(frozen=True)
class SysbenchConfig:
    """What ``freshkey bench sysbench`` runs: sysbench's size and length, and the topic's partitions."""

    time_s: int = 60
    threads: int = 4
    tables: int = 4
    table_size: int = 10_000
    partitions: int = 4
    rate: int = 0
    """sysbench's ``--rate``: transactions per second it aims at; 0 (the issue's run) is unthrottled."""
    timeout_s: float = 600.0
    window_ms: float = 1500.0

    def check(self) -> None:
        """ValueError saying which option to change."""
        if min(self.time_s, self.threads, self.tables, self.table_size, self.partitions) < 1:
            raise ValueError("--time, --threads, --tables, --table-size and --partitions must be at least 1")
        if self.rate < 0:
            raise ValueError("--rate must be 0 (unthrottled) or a number of transactions per second")

    @property
    def pace(self) -> str:
        """How sysbench is paced, in words."""
        return f"throttled to {self.rate:,} tps" if self.rate else "unthrottled"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sysbench_binary() -> str:
    """The sysbench on PATH; BenchError saying how to install it otherwise."""
    try:
        return find_binary(["sysbench"], SYSBENCH_INSTALL)
    except MissingBinaryError as exc:
        raise BenchError(str(exc)) from None


def parse_sysbench(text: str) -> dict[str, float]:
    """The figures of sysbench's final report: transactions, queries, errors, reconnects (count and per
    second), total time and latency (ms)."""
    figures: dict[str, float] = {}
    for name in ("transactions", "queries", "ignored errors", "reconnects"):
        match = re.search(rf"^\s*{name}:\s+(\d+)\s+\(([\d.]+) per sec\.\)", text, re.MULTILINE)
        if match:
            key = name.replace(" ", "_")
            figures[key] = int(match.group(1))
            figures[f"{key}_per_s"] = float(match.group(2))
    match = re.search(r"^\s*total time:\s+([\d.]+)s", text, re.MULTILINE)
    if match:
        figures["total_time_s"] = float(match.group(1))
    latency = text.partition("Latency (ms):")[2]
    for name, key in (("min", "min"), ("avg", "avg"), ("max", "max"), (r"95th percentile", "p95")):
        match = re.search(rf"^\s*{name}:\s+([\d.]+)", latency, re.MULTILINE)
        if match:
            figures[f"latency_{key}_ms"] = float(match.group(1))
    return figures


def sysbench_args(binary: str, config: SysbenchConfig, db: LocalMariaDB, command: str) -> list[str]:
    """``sysbench oltp_write_only <command>`` against ``db`` as its admin, at ``config.rate`` (0:
    unthrottled)."""
    return [
        binary,
        "oltp_write_only",
        "--db-driver=mysql",
        f"--mysql-host={db.host}",
        f"--mysql-port={db.port}",
        f"--mysql-user={db.admin_user}",
        f"--mysql-password={db.admin_password}",
        f"--mysql-db={DATABASE}",
        f"--tables={config.tables}",
        f"--table-size={config.table_size}",
        f"--threads={config.threads}",
        f"--time={config.time_s}",
        f"--rate={config.rate}",
        "--report-interval=10",
        command,
    ]
