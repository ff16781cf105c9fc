"""The embedded default: private MariaDB, Redis and Kafka broker, the connector and a worker, a driver.

``run_demo`` starts everything on free local ports (no Docker; the worker's web and both Prometheus
ports included), writes heartbeats (``connectors.heartbeat``, on by default) so the SLA's heartbeat
target has data, drives inserts/updates/deletes at a fixed rate against a sample multimodal table,
decides catch-up with sentinel rows seen in Redis (``pipeline.demo.catchup``), accounts for every
change it wrote (``pipeline.demo.accounting``), compares every cache entry with the database and
returns the figures. With ``serve`` it then keeps the stack up (heartbeats on) until ``serve`` returns.
Everything it started is stopped on the way out, Ctrl-C included.

The demo is private: it sets every address, port and path itself and drops the caller's ``FRESHKEY_*``
variables, except those that tune the run rather than point somewhere (:data:`TUNABLE`).
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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pymysql
import redis.asyncio as aioredis

from cache_writer import entry_key
from cache_writer.entries import Entry, read_namespace
from connectors.checkpoint import CheckpointStore
from connectors.database import read_table
from connectors.heartbeat import HeartbeatProber, HeartbeatSettings, start_in_thread
from connectors.settings import MySQLSettings
from pipeline.demo.accounting import Accounting, Written
from pipeline.demo.catchup import (
    SentinelRows,
    fetch_stats,
    high_watermarks,
    redis_version_reader,
    worker_reached,
)
from pipeline.demo.machine import MachineLoad, Pace
from pipeline.demo.race import RaceConfig, RaceReaders
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, free_port
from pipeline.verify.judge import Verdict, VerifyReport, judge, verify_namespace
from schemas import parse_bindings

DATABASE = "freshkey_demo"
NAMESPACE = "assets"
HEARTBEAT_DATABASE: str = HeartbeatSettings.model_fields["database"].default
"""The heartbeat table is the prober's default (``FRESHKEY_HEARTBEAT_DATABASE``/``_TABLE``): one name in
the demo, deploy/bindings.yaml, docker-compose.yml, deploy/mysql/init.sql and the settings."""
HEARTBEAT_TABLE: str = HeartbeatSettings.model_fields["table"].default
HEARTBEAT_ROW_ID: int = HeartbeatSettings.model_fields["row_id"].default
HEARTBEAT_NAMESPACE = "freshkey_heartbeat"
PREFIX = "fk"
CHANGE_TOPIC = "freshkey.changes"
MODALITIES = ("text", "image", "audio")
ENV_FILE = "freshkey.env"
"""The stack's FRESHKEY_* settings, written to the work directory (``--env-file`` of sla/verify)."""
TUNABLE = (
    "FRESHKEY_SLA_",
    "FRESHKEY_WORKER_BATCH_",
    "FRESHKEY_WORKER_FETCH_MAX_WAIT_MS",
    "FRESHKEY_WORKER_COMMIT_INTERVAL_S",
    "FRESHKEY_WORKER_DEVICE",
    "FRESHKEY_HOTNESS_",
    "FRESHKEY_TELEMETRY_OTLP_ENDPOINT",
    "FRESHKEY_TELEMETRY_TRACE_SAMPLE_EVERY",
    "FRESHKEY_TELEMETRY_CONSUMER_LAG_INTERVAL_S",
)
"""Inherited ``FRESHKEY_*`` variables the demo passes on (prefixes); it drops every other one."""
SETTLE_S = 10.0
"""How long the worker's counts may take to follow the sentinels (they are updated right after the
tiers answered), before the accounting is reported as it stands."""

SCHEMA = f"""
CREATE DATABASE IF NOT EXISTS {DATABASE};
CREATE TABLE IF NOT EXISTS {DATABASE}.assets (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
);
CREATE DATABASE IF NOT EXISTS {HEARTBEAT_DATABASE};
CREATE TABLE IF NOT EXISTS {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE} (
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
  - table: {HEARTBEAT_DATABASE}.{HEARTBEAT_TABLE}
    namespace: {HEARTBEAT_NAMESPACE}
    version_column: beat_at
    commit_time_column: beat_at
"""


@dataclass(frozen=True)
class Endpoints:
    """Where the running stack can be watched and asked (what ``freshkey demo`` prints)."""

    dashboard: str
    stats: str
    sla: str
    worker_metrics: str
    connector_metrics: str
    env_file: Path
    """FRESHKEY_* settings of the stack (0600): ``freshkey sla|verify --env-file`` reach it with them."""
    mysql: str
    """A client command line for the private database (root, no password; the stack is throwaway)."""
    workdir: Path


@dataclass
class DemoResult:
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


class DemoError(RuntimeError):
    pass


class Progress:
    """What the demo reports while it runs (the command line renders it with rich)."""

    def stage(self, text: str) -> None: ...

    def advance(self, done: int, total: int) -> None: ...

    def endpoints(self, endpoints: Endpoints) -> None:
        """The worker answers: its dashboard can be watched from now on."""


Serve = Callable[[DemoResult, Endpoints], None]
"""Called with the figures while the stack is still up (heartbeats on); the stack stops when it
returns."""


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


def _wait(
    predicate: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], check: Callable[[], None]
) -> float:
    start = time.monotonic()
    while not predicate():
        check()
        if time.monotonic() - start > timeout_s:
            name = what if isinstance(what, str) else what()
            raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {name}")
        time.sleep(0.02)
    return time.monotonic() - start


def private_env(inherited: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of the demo's processes: ``inherited`` without its ``FRESHKEY_*`` variables
    (except :data:`TUNABLE` ones), then ``settings``."""
    kept = {
        name: value
        for name, value in inherited.items()
        if not name.upper().startswith("FRESHKEY_") or name.upper().startswith(TUNABLE)
    }
    return {**kept, **settings}


def write_env_file(path: Path, settings: Mapping[str, str]) -> None:
    """``NAME=value`` lines, readable by the owner only (the file holds the database password)."""
    for name, value in settings.items():
        if "\n" in value or "'" in value:
            raise ValueError(f"{name}: a value with a newline or a quote cannot go into {path}")
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{name}='{value}'\n" for name, value in sorted(settings.items())))


class _Heartbeats:
    """The heartbeat prober, started and stopped around the run; counts every beat it wrote."""

    def __init__(self, mysql: MySQLSettings, interval_ms: float) -> None:
        self.settings = HeartbeatSettings(
            enabled=True,
            database=HEARTBEAT_DATABASE,
            table=HEARTBEAT_TABLE,
            row_id=HEARTBEAT_ROW_ID,
            interval_ms=interval_ms,
            user=None,
            password=None,
        )
        self.mysql = mysql
        self.beats = 0
        self._prober: HeartbeatProber | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._prober = HeartbeatProber(self.mysql, self.settings)
        self._thread = start_in_thread(self._prober)

    def stop(self) -> None:
        """Stop the prober and wait for its thread: no beat is written after this returns."""
        if self._prober is None or self._thread is None:
            return
        self._prober.stop()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise DemoError("the heartbeat prober did not stop within 30 s")
        self.beats += self._prober.stats.beats
        self._prober = self._thread = None


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
            web_port, worker_metrics_port, connector_metrics_port = free_port(), free_port(), free_port()
            settings = {
                "FRESHKEY_MYSQL_HOST": db.host,
                "FRESHKEY_MYSQL_PORT": str(db.port),
                "FRESHKEY_MYSQL_USER": db.user,
                "FRESHKEY_MYSQL_PASSWORD": db.password,
                "FRESHKEY_KAFKA_BOOTSTRAP": broker.bootstrap,
                "FRESHKEY_KAFKA_PARTITIONS": str(partitions),
                "FRESHKEY_KAFKA_CHANGE_TOPIC": CHANGE_TOPIC,
                "FRESHKEY_REDIS_URL": cache.url,
                "FRESHKEY_REDIS_KEY_PREFIX": PREFIX,
                "FRESHKEY_BINDINGS": str(root / "bindings.yaml"),
                "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(root / "checkpoint.json"),
                "FRESHKEY_WORKER_DATA_DIR": str(root / "worker"),
                "FRESHKEY_WORKER_WEB_PORT": str(web_port),
                "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(worker_metrics_port),
                "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(connector_metrics_port),
                # The worker's SLA finds the heartbeat's namespace through this table's binding, and
                # expects a beat every interval.
                "FRESHKEY_HEARTBEAT_DATABASE": HEARTBEAT_DATABASE,
                "FRESHKEY_HEARTBEAT_TABLE": HEARTBEAT_TABLE,
                **(
                    {"FRESHKEY_HEARTBEAT_INTERVAL_MS": f"{heartbeat_interval_ms:g}"}
                    if heartbeat_interval_ms
                    else {}
                ),
            }
            write_env_file(root / ENV_FILE, settings)
            env = private_env(os.environ, settings)
            base = f"http://127.0.0.1:{web_port}"
            endpoints = Endpoints(
                dashboard=f"{base}/dashboard",
                stats=f"{base}/freshkey/stats",
                sla=f"{base}/freshkey/sla",
                worker_metrics=f"http://127.0.0.1:{worker_metrics_port}/metrics",
                connector_metrics=f"http://127.0.0.1:{connector_metrics_port}/metrics",
                env_file=root / ENV_FILE,
                mysql=f"mariadb -h {db.host} -P {db.port} -u {db.admin_user} {DATABASE}",
                workdir=root,
            )
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
            _wait(lambda: fetch_stats(endpoints.stats) is not None, 60, "the worker", alive)
            progress.endpoints(endpoints)
            # Changes committed before the worker's consumer has joined its group wait for the join (5 s
            # on the test broker): the heartbeats start once it consumes, so that their lags, which the
            # SLA judges, are the pipeline's and not its start-up's.
            progress.stage("waiting for the worker to join its consumer group")
            _wait(
                lambda: _consuming(endpoints.sla),
                90,
                "the worker's consumer (a figure for every partition of the change topic)",
                alive,
            )

            admin_mysql = MySQLSettings(
                host=db.host, port=db.port, user=db.admin_user, password=db.admin_password
            )
            heartbeats = _Heartbeats(admin_mysql, heartbeat_interval_ms or 500.0)
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
            redis_sync = stack.enter_context(_redis_sync(cache.url))
            _wait(
                lambda: bool(redis_sync.exists(entry_key(PREFIX, HEARTBEAT_NAMESPACE, [HEARTBEAT_ROW_ID]))),
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
            driven, pace = _drive(
                admin, changes=changes, rate=rate, rows=rows, seed=seed, progress=progress, check=alive
            )
            drive_s = time.monotonic() - started
            machine = MachineLoad.now()

            # Catch-up: no beat after the sentinels, so that the accounting below is exact; the
            # watermarks can only prolong the wait (they under-report on the test broker).
            heartbeats.stop()
            topic_partitions = len(high_watermarks(broker.bootstrap, CHANGE_TOPIC))
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
            tiers = [redis_version_reader(redis_sync)]
            _wait(
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
            highs = high_watermarks(broker.bootstrap, CHANGE_TOPIC)
            _wait(
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
            stats = _settled_stats(endpoints.stats, written)
            accounting = Accounting.from_events(written, stats.get("events", {}))

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


def _consuming(sla_url: str) -> bool:
    """Whether the worker consumes every partition of the change topic (its SLA state knows a figure for
    each); True as well for a worker without the SLA route, which cannot tell."""
    try:
        with urllib.request.urlopen(sla_url, timeout=2) as response:
            state: dict[str, Any] = orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code == 404
    except (OSError, ValueError):
        return False
    return state.get("unknown_partitions") == 0


def _settled_stats(url: str, written: Written) -> dict[str, Any]:
    """The worker's stats once its counts cover every change written (or after :data:`SETTLE_S`)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        stats = fetch_stats(url) or {}
        seen = Accounting.from_events(written, stats.get("events", {})).seen
        if seen >= written.total or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@contextmanager
def _redis_sync(url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        yield client
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
) -> tuple[dict[str, int], Pace]:
    """Inserts, updates and deletes at ``rate`` per second, one autocommitted statement each, each
    changing exactly one row. Returns the counts by kind and how well the rate was held."""
    rng = random.Random(seed)
    live: set[int] = set()
    table = f"{DATABASE}.assets"
    counts = {"inserts": 0, "updates": 0, "deletes": 0}
    behind = 0.0
    start = time.monotonic()
    with conn.cursor() as cur:
        for i in range(changes):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                behind = max(behind, -delay)
            row_id = rng.randrange(rows)
            if row_id not in live:
                modality = rng.choice(MODALITIES)
                kind = "inserts"
                changed = cur.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6))",
                    (row_id, modality, f"{modality} #{row_id} v0", rng.randbytes(32)),
                )
                live.add(row_id)
            elif rng.random() < 0.2:
                kind = "deletes"
                changed = cur.execute(f"DELETE FROM {table} WHERE id = %s", (row_id,))
                live.discard(row_id)
            else:
                kind = "updates"
                changed = cur.execute(
                    f"UPDATE {table} SET content = %s, embedding = %s, updated_at = UTC_TIMESTAMP(6) "
                    "WHERE id = %s",
                    (f"content of {row_id} at change {i}", rng.randbytes(32), row_id),
                )
            if changed != 1:  # the accounting counts one row event per statement
                raise DemoError(f"change {i} ({kind[:-1]} of row {row_id}) changed {changed} rows, not 1")
            counts[kind] += 1
            if i % 50 == 0 or i == changes - 1:
                progress.advance(i + 1, changes)
                check()
    elapsed = time.monotonic() - start
    # The last change is due at (changes - 1) / rate: the rate reached is over the same span.
    achieved = changes / max(elapsed, (changes - 1) / rate, 1e-9)
    return counts, Pace(target_per_s=rate, achieved_per_s=achieved, max_behind_s=behind)


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


__all__ = [
    "BINDINGS",
    "DemoError",
    "DemoResult",
    "Endpoints",
    "Progress",
    "Serve",
    "pymysql",
    "run_demo",
]
