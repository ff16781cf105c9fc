"""The demo's stack: private MariaDB, Redis and Kafka broker, the connector and a worker, on free ports.

:func:`start_stack` starts everything on free local ports (no Docker; the worker's web and both
Prometheus ports included), creates the sample and heartbeat tables, writes the stack's settings to an
env file (mode 0600, for ``freshkey sla|verify --env-file``) and returns once the worker consumes every
partition of the change topic. Everything it starts is registered on the caller's ``ExitStack`` and
stopped with it.

The demo is private: it sets every address, port and path itself and drops the caller's ``FRESHKEY_*``
variables, except those that tune the run rather than point somewhere (:data:`TUNABLE`).
"""

from __future__ import annotations

import os
import subprocess
import sys
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

from connectors.checkpoint import CheckpointStore
from connectors.heartbeat import HeartbeatProber, HeartbeatSettings, start_in_thread
from connectors.settings import MySQLSettings
from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, free_port
from pipeline.embedded.process import terminate

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


class DemoError(RuntimeError):
    """The demo could not finish: a process exited, or a wait ran out (the message says which)."""


class Progress:
    """What the demo reports while it runs (the command line renders it with rich)."""

    def stage(self, text: str) -> None: ...

    def advance(self, done: int, total: int) -> None: ...

    def endpoints(self, endpoints: Endpoints) -> None:
        """The worker answers: its dashboard can be watched from now on."""


@contextmanager
def child_process(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in its own session, output to ``log_path``; on the way out SIGTERM, and SIGKILL after 20 s."""
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
        terminate(proc, timeout=20)


def wait(
    predicate: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], check: Callable[[], None]
) -> float:
    """Poll ``predicate`` (calling ``check`` between polls) until it holds; the seconds it took, or
    :class:`DemoError` naming ``what`` after ``timeout_s``."""
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


class Heartbeats:
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


def consuming(sla_url: str) -> bool:
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


@contextmanager
def redis_sync(url: str) -> Iterator[Any]:
    """A synchronous Redis client of ``url``, closed on the way out."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        yield client
    finally:
        client.close()


@dataclass
class Stack:
    """One demo's running stack: its services, the connector and the worker, and where to reach them."""

    root: Path
    """The work directory: services' data, logs, bindings, checkpoint and the env file."""
    db: LocalMariaDB
    cache: LocalRedis
    broker: LocalKafka
    admin: Any
    """A connection to the database with the admin account (the driver's and the sentinels')."""
    bindings_text: str
    endpoints: Endpoints
    connector: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]

    def alive(self) -> None:
        """Raise :class:`DemoError` with the tail of its log if the connector or the worker has exited."""
        for name, proc in (("connector", self.connector), ("worker", self.worker)):
            if proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-3000:]
                raise DemoError(f"the {name} exited with {proc.returncode}:\n{tail}")

    def admin_mysql(self) -> MySQLSettings:
        """Settings of the database's admin account (the heartbeat prober writes with them)."""
        db = self.db
        return MySQLSettings(host=db.host, port=db.port, user=db.admin_user, password=db.admin_password)


def start_stack(
    stack: ExitStack,
    root: Path,
    *,
    partitions: int,
    invalidate: bool,
    heartbeat_interval_ms: float | None,
    progress: Progress,
) -> Stack:
    """Start the services, create the tables, start the connector and a worker, and wait until the
    worker consumes every partition of the change topic. ``invalidate``: the sample table is bound in
    invalidate mode (``--race``) instead of write. Everything started is stopped with ``stack``."""
    progress.stage("starting MariaDB (binlog on), Redis and the Kafka broker")
    db = stack.enter_context(LocalMariaDB(workdir=root / "mariadb"))
    cache = stack.enter_context(LocalRedis(workdir=root / "redis"))
    broker = stack.enter_context(LocalKafka(workdir=root / "kafka"))
    admin = db.connect(admin=True)
    stack.callback(admin.close)
    with admin.cursor() as cur:
        for statement in filter(str.strip, SCHEMA.split(";")):
            cur.execute(statement)
    bindings_text = BINDINGS.replace("on_change: write", "on_change: invalidate") if invalidate else BINDINGS
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
        # Tansu holds a group's first join for half the session timeout (10 s -> 5 s, 2 s -> 1 s). The
        # heartbeats come from Faust's consumer thread: a worker whose loop was blocked 6 s twice kept its
        # membership at 2 s. Apache Kafka would refuse under 6 s; the demo runs Tansu only.
        "FRESHKEY_WORKER_SESSION_TIMEOUT_S": os.environ.get("FRESHKEY_WORKER_SESSION_TIMEOUT_S", "2"),
        "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(worker_metrics_port),
        "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(connector_metrics_port),
        # The worker's SLA finds the heartbeat's namespace through this table's binding, and expects a
        # beat every interval.
        "FRESHKEY_HEARTBEAT_DATABASE": HEARTBEAT_DATABASE,
        "FRESHKEY_HEARTBEAT_TABLE": HEARTBEAT_TABLE,
        **({"FRESHKEY_HEARTBEAT_INTERVAL_MS": f"{heartbeat_interval_ms:g}"} if heartbeat_interval_ms else {}),
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
    running = Stack(
        root=root,
        db=db,
        cache=cache,
        broker=broker,
        admin=admin,
        bindings_text=bindings_text,
        endpoints=endpoints,
        connector=stack.enter_context(child_process([*cli, "connector"], env, root / "connector.log")),
        worker=stack.enter_context(child_process([*cli, "worker"], env, root / "worker.log")),
    )
    checkpoint = CheckpointStore(root / "checkpoint.json")
    wait(lambda: checkpoint.path.exists(), 60, "the connector", running.alive)
    wait(lambda: fetch_stats(endpoints.stats) is not None, 60, "the worker", running.alive)
    progress.endpoints(endpoints)
    # Changes committed before the worker's consumer has joined its group wait for the join (5 s on the
    # test broker): the heartbeats start once it consumes, so that their lags, which the SLA judges, are
    # the pipeline's and not its start-up's.
    progress.stage("waiting for the worker to join its consumer group")
    wait(
        lambda: consuming(endpoints.sla),
        90,
        "the worker's consumer (a figure for every partition of the change topic)",
        running.alive,
    )
    return running
