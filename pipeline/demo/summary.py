"""The demo's figures: what it reports (:class:`DemoResult`), the worker's settled counts, and the
comparison of every cache entry with the database."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from cache_writer import entry_key
from cache_writer.entries import Entry, read_namespace
from connectors.database import read_table
from connectors.settings import MySQLSettings
from pipeline.demo.accounting import Accounting, Written
from pipeline.demo.catchup import fetch_stats
from pipeline.demo.machine import MachineLoad, Pace
from pipeline.demo.race import RaceReaders
from pipeline.demo.stack import DATABASE, NAMESPACE, PREFIX
from pipeline.embedded import LocalMariaDB
from pipeline.verify.judge import Verdict, VerifyReport, judge, verify_namespace
from schemas import parse_bindings

SETTLE_S = 10.0
"""How long the worker's counts may take to follow the sentinels (they are updated right after the
tiers answered), before the accounting is reported as it stands."""


@dataclass
class DemoResult:
    """The figures of one demo run (``--json`` writes :meth:`to_json`)."""

    changes: int
    applied: int
    """Changes applied in Redis (``change_applied``, every namespace: heartbeats and sentinels too)."""
    stale: int
    missing: int
    throughput_per_s: float
    drive_rate_per_s: float
    lag_ms: dict[str, Any]
    """The sample namespace's commit-to-Redis lag since the worker started (``/freshkey/stats``)."""
    stages_ms: dict[str, Any]
    catch_up_s: float
    verify: VerifyReport
    accounting: Accounting
    pace: Pace
    machine: MachineLoad
    """Measured right after the driver's last change."""
    sentinels: int
    """Partitions a sentinel row decided catch-up on."""
    race: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON (the README lists the fields)."""
        return {
            "changes": self.changes,
            "applied": self.applied,
            "stale": self.stale,
            "missing": self.missing,
            "throughput_per_s": round(self.throughput_per_s, 1),
            "drive_rate_per_s": round(self.drive_rate_per_s, 1),
            "catch_up_s": round(self.catch_up_s, 3),
            "catch_up": {"decided_by": "sentinel rows seen in Redis", "partitions": self.sentinels},
            "lag_ms": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.lag_ms.items()},
            "stages_ms": self.stages_ms,
            "accounting": self.accounting.to_json(),
            "driver": self.pace.to_json(),
            "machine": self.machine.to_json(),
            **({"race": self.race} if self.race is not None else {}),
            "verify": {
                "rows": self.verify.rows,
                "entries": self.verify.entries,
                "checked": self.verify.checked,
                "versions_checked": self.verify.versions_checked,
                "examples": self.verify.examples,
            },
        }


def settled_stats(url: str, written: Written) -> dict[str, Any]:
    """The worker's stats once its counts cover every change written (or after :data:`SETTLE_S`)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        stats = fetch_stats(url) or {}
        seen = Accounting.from_events(written, stats.get("events", {})).seen
        if seen >= written.total or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def verify_redis(db: LocalMariaDB, redis_url: str, bindings_text: str) -> VerifyReport:
    """Every entry of the sample namespace in Redis, compared with its row in the database."""
    bindings = parse_bindings(bindings_text)
    binding = bindings.for_table(DATABASE, "assets")
    assert binding is not None
    settings = MySQLSettings(host=db.host, port=db.port, user=db.user, password=db.password)

    async def entries() -> Any:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await read_namespace(client, PREFIX, NAMESPACE)
        finally:
            await client.aclose()

    return verify_namespace(
        binding,
        list(read_table(settings, DATABASE, "assets")),
        asyncio.run(entries()),
        prefix=PREFIX,
        key_columns=("id",),
    )


def verify_l1(db: LocalMariaDB, readers: RaceReaders, bindings_text: str) -> int:
    """Stale entries in the readers' in-process L1 (each compared with its row now)."""
    binding = parse_bindings(bindings_text).bindings[0]
    settings = MySQLSettings(host=db.host, port=db.port, user=db.user, password=db.password)
    rows = {entry_key(PREFIX, NAMESPACE, [r["id"]]): r for r in read_table(settings, DATABASE, "assets")}
    stale = 0
    for key, l1_entry in readers.l1.items():
        entry = Entry(key=key, version=l1_entry.version, value=l1_entry.value, commit_ts_us=None)
        verdict, _ = judge(binding, rows.get(key), entry)
        stale += verdict is Verdict.STALE
    return stale
