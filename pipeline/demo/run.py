"""The embedded default: private MariaDB, Redis and Kafka broker, the connector and a worker, a driver.

``run_demo`` starts everything on free local ports (no Docker), drives inserts/updates/deletes at a fixed
rate against a sample multimodal table, waits until the pipeline has caught up (connector checkpoint at
the binlog end, worker past every partition's high watermark), compares every cache entry with the
database and returns the figures. Everything it started is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import redis.asyncio as aioredis

from cache_writer import entry_key
from cache_writer.entries import Entry, read_namespace
from connectors.checkpoint import CheckpointStore
from connectors.database import read_table
from connectors.settings import MySQLSettings
from pipeline.demo.catchup import connector_reached, fetch_stats, high_watermarks, worker_reached
from pipeline.demo.race import RaceConfig, RaceReaders
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, free_port
from pipeline.verify.judge import Verdict, VerifyReport, judge, verify_namespace
from schemas import parse_bindings

DATABASE = "freshkey_demo"
NAMESPACE = "assets"
HEARTBEAT_NAMESPACE = "freshkey_heartbeat"
PREFIX = "fk"
CHANGE_TOPIC = "freshkey.changes"
MODALITIES = ("text", "image", "audio")

SCHEMA = f"""
CREATE DATABASE IF NOT EXISTS {DATABASE};
CREATE TABLE IF NOT EXISTS {DATABASE}.assets (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
);
CREATE TABLE IF NOT EXISTS {DATABASE}.heartbeat (
  id INT PRIMARY KEY,
  beat_at DATETIME(6) NOT NULL
);
"""

BINDINGS = f"""\
bindings:
  - table: {DATABASE}.assets
    namespace: {NAMESPACE}
    value_columns: [modality, content, embedding, updated_at]
    version_column: updated_at
    commit_time_column: updated_at
    on_change: write
  - table: {DATABASE}.heartbeat
    namespace: {HEARTBEAT_NAMESPACE}
    version_column: beat_at
    commit_time_column: beat_at
"""


@dataclass
class DemoResult:
    changes: int
    applied: int
    stale: int
    missing: int
    throughput_per_s: float
    drive_rate_per_s: float
    lag_ms: dict[str, Any]
    stages_ms: dict[str, Any]
    catch_up_s: float
    verify: VerifyReport
    race: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": self.changes,
            "applied": self.applied,
            "stale": self.stale,
            "missing": self.missing,
            "throughput_per_s": round(self.throughput_per_s, 1),
            "drive_rate_per_s": round(self.drive_rate_per_s, 1),
            "catch_up_s": round(self.catch_up_s, 3),
            "lag_ms": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.lag_ms.items()},
            "stages_ms": self.stages_ms,
            **({"race": self.race} if self.race is not None else {}),
            "verify": {
                "rows": self.verify.rows,
                "entries": self.verify.entries,
                "checked": self.verify.checked,
                "versions_checked": self.verify.versions_checked,
                "examples": self.verify.examples,
            },
        }


class DemoError(RuntimeError):
    pass


class Progress:
    """What the demo reports while it runs (the command line renders it with rich)."""

    def stage(self, text: str) -> None: ...

    def advance(self, done: int, total: int) -> None: ...


@contextmanager
def _process(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str, check: Callable[[], None]) -> float:
    start = time.monotonic()
    while not predicate():
        check()
        if time.monotonic() - start > timeout_s:
            raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


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
) -> DemoResult:
    """Run the whole flow once. With ``race``, the sample table is bound in invalidate mode and
    concurrent readers fill it after misses (with leases, or plainly) while the driver keeps changing
    ``race.hot_rows`` rows; the verifier then covers the readers' L1 as well as Redis."""
    if changes < 1 or rate <= 0 or rows < 1:
        raise ValueError("changes, rate and rows must be positive")
    progress = progress or Progress()
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="freshkey-demo-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    try:
        with ExitStack() as stack:
            progress.stage("starting MariaDB (binlog on), Redis and the Kafka broker")
            db = stack.enter_context(LocalMariaDB(workdir=root / "mariadb"))
            cache = stack.enter_context(LocalRedis(workdir=root / "redis"))
            broker = stack.enter_context(LocalKafka(workdir=root / "kafka"))
            admin = db.connect(admin=True)
            stack.callback(admin.close)
            with admin.cursor() as cur:
                for statement in filter(str.strip, SCHEMA.split(";")):
                    cur.execute(statement)
            bindings_text = (
                BINDINGS if race is None else BINDINGS.replace("on_change: write", "on_change: invalidate")
            )
            (root / "bindings.yaml").write_text(bindings_text)
            web_port = free_port()
            env = {
                **os.environ,
                "FRESHKEY_MYSQL_HOST": db.host,
                "FRESHKEY_MYSQL_PORT": str(db.port),
                "FRESHKEY_MYSQL_USER": db.user,
                "FRESHKEY_MYSQL_PASSWORD": db.password,
                "FRESHKEY_KAFKA_BOOTSTRAP": broker.bootstrap,
                "FRESHKEY_KAFKA_PARTITIONS": str(partitions),
                "FRESHKEY_REDIS_URL": cache.url,
                "FRESHKEY_REDIS_KEY_PREFIX": PREFIX,
                "FRESHKEY_BINDINGS": str(root / "bindings.yaml"),
                "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(root / "checkpoint.json"),
                "FRESHKEY_WORKER_DATA_DIR": str(root / "worker"),
                "FRESHKEY_WORKER_WEB_PORT": str(web_port),
            }
            cli = [sys.executable, "-m", "pipeline"]
            progress.stage("starting the connector and a worker")
            connector = stack.enter_context(_process([*cli, "connector"], env, root / "connector.log"))
            worker = stack.enter_context(_process([*cli, "worker"], env, root / "worker.log"))

            def alive() -> None:
                for name, proc in (("connector", connector), ("worker", worker)):
                    if proc.poll() is not None:
                        tail = (root / f"{name}.log").read_text(errors="replace")[-3000:]
                        raise DemoError(f"the {name} exited with {proc.returncode}:\n{tail}")

            checkpoint = CheckpointStore(root / "checkpoint.json")
            _wait(lambda: checkpoint.path.exists(), 60, "the connector", alive)
            stats_url = f"http://127.0.0.1:{web_port}/freshkey/stats"
            _wait(lambda: fetch_stats(stats_url) is not None, 60, "the worker", alive)
            progress.stage("warming up: one heartbeat through the whole path")
            with admin.cursor() as cur:
                cur.execute(f"REPLACE INTO {DATABASE}.heartbeat VALUES (1, UTC_TIMESTAMP(6))")
            redis_sync = stack.enter_context(_redis_sync(cache.url))
            _wait(
                lambda: bool(redis_sync(f"{PREFIX}:{{{HEARTBEAT_NAMESPACE}}}:1")),
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
            _drive(admin, changes=changes, rate=rate, rows=rows, seed=seed, progress=progress, check=alive)
            drive_s = time.monotonic() - started

            progress.stage("waiting for the pipeline to catch up")
            with admin.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                file, pos = cur.fetchone()[:2]

            target = (str(file), int(pos))
            _wait(
                lambda: connector_reached(checkpoint.load(), target),
                catch_up_timeout_s,
                "the connector checkpoint",
                alive,
            )
            highs = high_watermarks(broker.bootstrap, CHANGE_TOPIC)
            _wait(
                lambda: worker_reached(fetch_stats(stats_url), CHANGE_TOPIC, highs),
                catch_up_timeout_s,
                "the worker",
                alive,
            )
            caught_up_s = time.monotonic() - started
            stats = fetch_stats(stats_url) or {}

            race_summary: dict[str, Any] | None = None
            if readers is not None:
                readers.pause()
                race_summary = readers.summary()
            progress.stage("comparing every cache entry with the database")
            report = _verify(db, cache.url, bindings_text)
            if readers is not None and race_summary is not None:
                l1_stale = _verify_l1(db, readers, bindings_text)
                readers.stop()
                race_summary["stale_l1"] = l1_stale
                race_summary["stale_l2"] = report.stale
                race_summary["stale"] = l1_stale + report.stale
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    outcomes = stats.get("outcomes", {})
    lag = stats.get("lag_ms", {}).get(NAMESPACE, {})
    stale = report.stale if race_summary is None else race_summary["stale"]
    return DemoResult(
        changes=changes,
        applied=int(outcomes.get("redis:applied", 0)) + int(outcomes.get("redis:tombstoned", 0)),
        stale=stale,
        missing=report.missing if race is None else 0,
        throughput_per_s=changes / caught_up_s,
        drive_rate_per_s=changes / drive_s,
        lag_ms={"p50": lag.get("p50"), "p99": lag.get("p99"), "max": lag.get("max")},
        stages_ms=stats.get("stages_ms", {}),
        catch_up_s=caught_up_s - drive_s,
        verify=report,
        race=race_summary,
    )


@contextmanager
def _redis_sync(url: str) -> Iterator[Callable[[str], bool]]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        yield lambda key: bool(client.exists(key))
    finally:
        client.close()


def _drive(
    conn: Any,
    *,
    changes: int,
    rate: float,
    rows: int,
    seed: int,
    progress: Progress,
    check: Callable[[], None],
) -> None:
    """Inserts, updates and deletes at ``rate`` per second, one autocommitted statement each."""
    rng = random.Random(seed)
    live: set[int] = set()
    table = f"{DATABASE}.assets"
    start = time.monotonic()
    with conn.cursor() as cur:
        for i in range(changes):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            row_id = rng.randrange(rows)
            if row_id not in live:
                modality = rng.choice(MODALITIES)
                cur.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6))",
                    (row_id, modality, f"{modality} #{row_id} v0", rng.randbytes(32)),
                )
                live.add(row_id)
            elif rng.random() < 0.2:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (row_id,))
                live.discard(row_id)
            else:
                cur.execute(
                    f"UPDATE {table} SET content = %s, embedding = %s, updated_at = UTC_TIMESTAMP(6) "
                    "WHERE id = %s",
                    (f"content of {row_id} at change {i}", rng.randbytes(32), row_id),
                )
            if i % 50 == 0 or i == changes - 1:
                progress.advance(i + 1, changes)
                check()


def _verify_l1(db: LocalMariaDB, readers: RaceReaders, bindings_text: str) -> int:
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


def _verify(db: LocalMariaDB, redis_url: str, bindings_text: str) -> VerifyReport:
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


__all__ = ["DemoError", "DemoResult", "Progress", "pymysql", "run_demo"]
