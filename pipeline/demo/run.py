"""The embedded default: private MariaDB, Redis and Kafka broker, the connector and a worker, a driver.

``run_demo`` starts the stack (:mod:`pipeline.demo.stack`), writes heartbeats (``connectors.heartbeat``,
on by default) so the SLA's heartbeat target has data, drives inserts/updates/deletes at a fixed rate
against a sample multimodal table (:mod:`pipeline.demo.driver`), decides catch-up with sentinel rows seen
in Redis (``pipeline.demo.catchup``), accounts for every change it wrote (``pipeline.demo.accounting``),
compares every cache entry with the database and returns the figures (:mod:`pipeline.demo.summary`).
With ``serve`` it then keeps the stack up (heartbeats on) until ``serve`` returns. Everything it started
is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cache_writer import entry_key
from connectors.heartbeat import HeartbeatSettings
from pipeline.demo.accounting import Accounting, Written
from pipeline.demo.catchup import (
    SentinelRows,
    fetch_stats,
    high_watermarks,
    redis_version_reader,
    worker_reached,
)
from pipeline.demo.driver import drive
from pipeline.demo.machine import MachineLoad
from pipeline.demo.race import RaceConfig, RaceReaders
from pipeline.demo.stack import (
    BINDINGS,
    CHANGE_TOPIC,
    HEARTBEAT_DATABASE,
    HEARTBEAT_NAMESPACE,
    HEARTBEAT_ROW_ID,
    HEARTBEAT_TABLE,
    NAMESPACE,
    PREFIX,
    DemoError,
    Endpoints,
    Heartbeats,
    Progress,
    redis_sync,
    start_stack,
    wait,
)
from pipeline.demo.summary import DemoResult, settled_stats, verify_l1, verify_redis
from schemas import parse_bindings

Serve = Callable[[DemoResult, Endpoints], None]
"""Called with the figures while the stack is still up (heartbeats on); the stack stops when it
returns."""


def run_demo(
    *,
    changes: int,
    rate: float,
    rows: int = 500,
    partitions: int = 4,
    seed: int = 7,
    workdir: Path | None = None,
    progress: Progress | None = None,
    catch_up_timeout_s: float = 180.0,
    race: RaceConfig | None = None,
    heartbeat_interval_ms: float | None = HeartbeatSettings.model_fields["interval_ms"].default,
    serve: Serve | None = None,
) -> DemoResult:
    """Run the whole flow once. With ``race``, the sample table is bound in invalidate mode and
    concurrent readers fill it after misses (with leases, or plainly) while the driver keeps changing
    ``race.hot_rows`` rows; the verifier then covers the readers' L1 as well as Redis.

    ``heartbeat_interval_ms``: a heartbeat prober writes every so often while the pipeline runs (None:
    no prober, one heartbeat to warm up). ``serve``: called with the result before anything stops."""
    if changes < 1 or rate <= 0 or rows < 1:
        raise ValueError("changes, rate and rows must be positive")
    progress = progress or Progress()
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="freshkey-demo-")) if workdir is None else workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        with ExitStack() as stack:
            running = start_stack(
                stack,
                root,
                partitions=partitions,
                invalidate=race is not None,
                heartbeat_interval_ms=heartbeat_interval_ms,
                progress=progress,
            )
            db, cache, admin, alive = running.db, running.cache, running.admin, running.alive
            endpoints, bindings_text = running.endpoints, running.bindings_text

            heartbeats = Heartbeats(running.admin_mysql(), heartbeat_interval_ms or 500.0)
            stack.callback(heartbeats.stop)
            written_heartbeats = 0
            if heartbeat_interval_ms:
                progress.stage(f"warming up: heartbeats every {heartbeat_interval_ms:g} ms through the path")
                heartbeats.start()
            else:
                progress.stage("warming up: one heartbeat through the whole path")
                with admin.cursor() as cur:
                    cur.execute(
                        f"REPLACE INTO {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE} VALUES (%s, UTC_TIMESTAMP(6))",
                        (HEARTBEAT_ROW_ID,),
                    )
                written_heartbeats += 1
            redis = stack.enter_context(redis_sync(cache.url))
            wait(
                lambda: bool(redis.exists(entry_key(PREFIX, HEARTBEAT_NAMESPACE, [HEARTBEAT_ROW_ID]))),
                90,
                "the first heartbeat",
                alive,
            )

            readers: RaceReaders | None = None
            if race is not None:
                binding = parse_bindings(bindings_text).bindings[0]
                readers = RaceReaders(
                    race,
                    redis_url=cache.url,
                    prefix=PREFIX,
                    binding=binding,
                    connect_db=lambda: db.connect(admin=False),
                )
                how = "with leases" if race.leases else "plain cache-aside"
                progress.stage(f"starting {race.readers} readers ({how}) on {race.hot_rows} hot rows")
                readers.start()
                stack.callback(readers.stop)
                rows = race.hot_rows

            progress.stage(f"driving {changes} changes at {rate:g}/s")
            started = time.monotonic()
            driven, pace = drive(
                admin, changes=changes, rate=rate, rows=rows, seed=seed, progress=progress, check=alive
            )
            drive_s = time.monotonic() - started
            machine = MachineLoad.now()

            # Catch-up: no beat after the sentinels, so that the accounting below is exact; the
            # watermarks can only prolong the wait (they under-report on the test broker).
            heartbeats.stop()
            bootstrap = running.broker.bootstrap
            topic_partitions = len(high_watermarks(bootstrap, CHANGE_TOPIC))
            progress.stage(
                f"waiting for the pipeline to catch up: a sentinel row on each of the {topic_partitions} "
                "partitions, seen in Redis"
            )
            sentinel_rows = SentinelRows(
                database=HEARTBEAT_DATABASE,
                table=HEARTBEAT_TABLE,
                namespace=HEARTBEAT_NAMESPACE,
                prefix=PREFIX,
                partitions=topic_partitions,
            )
            sentinels = sentinel_rows.write(admin)
            tiers = [redis_version_reader(redis)]
            wait(
                lambda: not SentinelRows.missing(sentinels, tiers),
                catch_up_timeout_s,
                lambda: (
                    "the sentinel rows of partitions "
                    + ", ".join(str(s.partition) for s in SentinelRows.missing(sentinels, tiers))
                    + " in Redis"
                ),
                alive,
            )
            caught_up_s = time.monotonic() - started
            highs = high_watermarks(bootstrap, CHANGE_TOPIC)
            wait(
                lambda: worker_reached(fetch_stats(endpoints.stats), CHANGE_TOPIC, highs),
                catch_up_timeout_s,
                "the worker's offsets to reach the broker's high watermarks",
                alive,
            )
            written = Written(
                inserts=driven["inserts"],
                updates=driven["updates"],
                deletes=driven["deletes"],
                heartbeats=written_heartbeats + heartbeats.beats,
                sentinels=len(sentinels),
            )
            stats = settled_stats(endpoints.stats, written)
            accounting = Accounting.from_events(written, stats.get("events", {}))

            race_summary: dict[str, Any] | None = None
            if readers is not None:
                readers.pause()
                race_summary = readers.summary()
            progress.stage("comparing every cache entry with the database")
            report = verify_redis(db, cache.url, bindings_text)
            if readers is not None and race_summary is not None:
                l1_stale = verify_l1(db, readers, bindings_text)
                readers.stop()
                race_summary["stale_l1"] = l1_stale
                race_summary["stale_l2"] = report.stale
                race_summary["stale"] = l1_stale + report.stale
            lag = stats.get("lag_ms", {}).get(NAMESPACE, {})
            result = DemoResult(
                changes=changes,
                applied=accounting.applied,
                stale=report.stale if race_summary is None else race_summary["stale"],
                missing=report.missing if race is None else 0,
                throughput_per_s=changes / caught_up_s,
                drive_rate_per_s=changes / drive_s,
                lag_ms={"p50": lag.get("p50"), "p99": lag.get("p99"), "max": lag.get("max")},
                stages_ms=stats.get("stages_ms", {}),
                catch_up_s=caught_up_s - drive_s,
                verify=report,
                accounting=accounting,
                pace=pace,
                machine=machine,
                sentinels=len(sentinels),
                race=race_summary,
            )
            if serve is not None:
                if heartbeat_interval_ms:
                    heartbeats.start()
                serve(result, endpoints)
            return result
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


# What ``freshkey demo`` (pipeline.commands.demo) uses, with run_demo: this module is the demo's entry point.
__all__ = [
    "BINDINGS",
    "DemoError",
    "DemoResult",
    "Endpoints",
    "Progress",
    "Serve",
    "run_demo",
]
