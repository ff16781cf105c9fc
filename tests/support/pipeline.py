"""The pipeline harness: connector and worker as real child processes on the test services, per test.

Every pipeline gets its own database, topics, consumer group, Redis key prefix and checkpoint file, so
tests never see each other's data, against private or external services alike.

Several workers of one pipeline run as one consumer group: ``start("worker")`` is the first, and any
other name that starts with ``worker`` (``worker-2``, ``worker-3``...) is one more process of the same
app id with its own web port, data directory and metrics port (``web_ports[name]``, ``stats(name)``).
Every process gets free ports for its metrics (``FRESHKEY_TELEMETRY_*PROMETHEUS_PORT`` in ``env``), never
the defaults a user's processes take.
With ``redis_cluster=True`` the Redis URL is a seed of a Redis Cluster: the processes get
``FRESHKEY_REDIS_CLUSTER=true`` and the harness reads the cache through cluster clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import SecretStr

from cache_writer.entries import Entry, read_namespace
from connectors.checkpoint import CheckpointStore
from connectors.database import read_table
from connectors.settings import MySQLSettings
from pipeline.demo.catchup import connector_reached, fetch_stats, high_watermarks, worker_reached
from pipeline.embedded import free_port, preexec_die_with_parent
from pipeline.verify.judge import Verification, VerifyReport, verify_namespace
from pipeline.verify.run import run_verification
from schemas import parse_bindings
from tests.conftest import MySQLService

TABLE_DDL = """
CREATE TABLE {db}.assets (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
)
"""


def session_timeout_s() -> str:
    """The workers' ``FRESHKEY_WORKER_SESSION_TIMEOUT_S``: 2 s on the private Tansu broker, like ``freshkey
    demo`` (Tansu holds a group's join for half the session timeout: each worker start and rebalance
    waits 1 s instead of 3, and a killed member is given up after 2 s instead of 6); 6 s against an
    external broker (``FRESHKEY_TEST_KAFKA``), Apache Kafka's smallest by default."""
    return "6" if os.environ.get("FRESHKEY_TEST_KAFKA") else "2"


class Pipeline:
    """Connector and worker as real child processes, killable with -9 and restartable."""

    def __init__(
        self,
        mysql: MySQLService,
        kafka: str,
        redis_url: str,
        workdir: Path,
        *,
        version_column: bool,
        value_columns: bool = True,
        binding_extra: str = "",
        redis_cluster: bool = False,
    ) -> None:
        tag = uuid.uuid4().hex[:10]
        self.mysql = mysql
        self.database = f"freshkey_test_{tag}"
        self.namespace = f"assets_{tag}"
        self.prefix = f"t{tag}"
        self.change_topic = f"freshkey.changes.{tag}"
        self.dead_letter_topic = f"freshkey.dead-letters.{tag}"
        self.model_update_topic = f"freshkey.model-updates.{tag}"
        self.hotness_topic = f"freshkey.hotness.{tag}"
        self.app_id = f"freshkey-test-{tag}"
        self.workdir = workdir
        self.kafka = kafka
        self.redis_url = redis_url
        self.redis_cluster = redis_cluster
        self.web_port = free_port()
        self.web_ports: dict[str, int] = {"worker": self.web_port}
        binding = f"  - table: {self.database}.assets\n    namespace: {self.namespace}\n"
        if value_columns:
            binding += "    value_columns: [modality, content, embedding, updated_at]\n"
        binding += binding_extra
        if version_column:
            binding += "    version_column: updated_at\n    commit_time_column: updated_at\n"
        self.bindings_text = "bindings:\n" + binding
        (workdir / "bindings.yaml").write_text(self.bindings_text)
        self.env = {
            **os.environ,
            "FRESHKEY_MYSQL_HOST": mysql.host,
            "FRESHKEY_MYSQL_PORT": str(mysql.port),
            "FRESHKEY_MYSQL_USER": mysql.user,
            "FRESHKEY_MYSQL_PASSWORD": mysql.password,
            "FRESHKEY_MYSQL_SERVER_ID": str(10_000 + int(tag[:4], 16)),
            "FRESHKEY_KAFKA_BOOTSTRAP": kafka,
            "FRESHKEY_KAFKA_CHANGE_TOPIC": self.change_topic,
            "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": self.dead_letter_topic,
            "FRESHKEY_KAFKA_MODEL_UPDATE_TOPIC": self.model_update_topic,
            "FRESHKEY_KAFKA_HOTNESS_TOPIC": self.hotness_topic,
            "FRESHKEY_WORKER_DEVICE": "cpu",
            "FRESHKEY_KAFKA_PARTITIONS": "3",
            "FRESHKEY_REDIS_URL": redis_url,
            "FRESHKEY_REDIS_KEY_PREFIX": self.prefix,
            "FRESHKEY_BINDINGS": str(workdir / "bindings.yaml"),
            "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(workdir / "checkpoint.json"),
            "FRESHKEY_WORKER_APP_ID": self.app_id,
            "FRESHKEY_WORKER_DATA_DIR": str(workdir / "worker"),
            "FRESHKEY_WORKER_WEB_PORT": str(self.web_port),
            "FRESHKEY_WORKER_SESSION_TIMEOUT_S": session_timeout_s(),
            # Metrics on free ports, not the defaults (9464, 9465): tests can run side by side, and a
            # process left over elsewhere cannot take a test's metrics port.
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(free_port()),
        }
        if redis_cluster:
            self.env["FRESHKEY_REDIS_CLUSTER"] = "true"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {"connector": 0, "worker": 0}
        self._worker_env: dict[str, dict[str, str]] = {}
        with mysql.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.database}")
            cur.execute(TABLE_DDL.format(db=self.database))
        self.conn = mysql.connect(self.database)
        self.redis: redis.Redis | redis.RedisCluster = (
            redis.RedisCluster.from_url(redis_url) if redis_cluster else redis.Redis.from_url(redis_url)
        )

    # -- processes -------------------------------------------------------------------------------------
    def start(self, name: str, **extra_env: str) -> None:
        """Start ``connector``, ``worker`` or one more worker of the group (``worker-<n>``); return once
        the connector wrote its first checkpoint / the worker's web server answers (a worker may not have
        joined the group yet)."""
        self.launch(name, **extra_env)
        if name == "connector":
            self.wait(lambda: self.checkpoint_path.exists(), 60, "the connector's first checkpoint")
        else:
            self.wait(lambda: self.stats(name) is not None, 60, f"the web server of {name}")

    def launch(self, name: str, **extra_env: str) -> None:
        """Start the process and return at once (:meth:`start` waits for it)."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} already running"
        command = "worker" if name.startswith("worker") else name
        self.starts[name] = self.starts.get(name, 0) + 1
        log = (self.workdir / f"{name}.{self.starts[name]}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "pipeline", command],
            env={**self.env, **self._own_env(name), **extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(),
        )
        log.close()

    def _own_env(self, name: str) -> dict[str, str]:
        """What sets one more worker of the group apart from the first: its web port, data directory
        and metrics port (kept across restarts, so a restarted worker answers where it did)."""
        if name in ("connector", "worker") or not name.startswith("worker"):
            return {}
        if name not in self._worker_env:
            self.web_ports[name] = free_port()
            self._worker_env[name] = {
                "FRESHKEY_WORKER_WEB_PORT": str(self.web_ports[name]),
                "FRESHKEY_WORKER_DATA_DIR": str(self.workdir / name),
                "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            }
        return self._worker_env[name]

    @property
    def workers(self) -> list[str]:
        """The worker processes started so far (running or not), by name."""
        return [name for name in self.procs if name.startswith("worker")]

    @property
    def checkpoint_path(self) -> Path:
        return self.workdir / "checkpoint.json"

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, name: str) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and proc.returncode not in (-9, 0):
                raise AssertionError(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
        """Poll ``predicate`` until true; ``what`` (or what it returns, read at the timeout) says what for."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self.check_alive()
            if time.monotonic() > deadline:
                said = what() if callable(what) else what
                raise AssertionError(f"timed out waiting for {said}\n{self.logs()}")
            time.sleep(0.05)

    def stats(self, name: str = "worker") -> dict[str, Any] | None:
        """``/freshkey/stats`` of a worker (None while it does not answer)."""
        stats: dict[str, Any] | None = self.page(name, "/freshkey/stats")
        return stats

    def page(self, name: str, path: str) -> Any:
        """A JSON page of a worker's web server, parsed (None while it does not answer)."""
        return fetch_stats(f"http://127.0.0.1:{self.web_ports[name]}{path}")

    # -- database and cache ----------------------------------------------------------------------------
    def sql(self, statement: str, args: Any = None) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()

    def master_position(self) -> tuple[str, int]:
        file, pos = self.sql("SHOW MASTER STATUS")[0][:2]
        return str(file), int(pos)

    def key(self, row_id: int) -> str:
        return f"{self.prefix}:{{{self.namespace}}}:{row_id}"

    def entry(self, row_id: int) -> Entry | None:
        from cache_writer.entries import parse_entry

        return parse_entry(self.key(row_id), self.redis.hgetall(self.key(row_id)))  # type: ignore[arg-type]

    def entries(self) -> dict[str, Entry]:
        async def read() -> dict[str, Entry]:
            client = self.async_redis()
            try:
                return await read_namespace(client, self.prefix, self.namespace)
            finally:
                await client.aclose()

        return asyncio.run(read())

    def verify(self) -> VerifyReport:
        binding = parse_bindings(self.bindings_text).bindings[0]
        settings = MySQLSettings(
            host=self.mysql.host,
            port=self.mysql.port,
            user=self.mysql.admin_user,
            password=SecretStr(self.mysql.admin_password),
        )
        rows = list(read_table(settings, self.database, "assets"))
        return verify_namespace(binding, rows, self.entries(), prefix=self.prefix, key_columns=("id",))

    def run_verification(self, window_ms: float = 1500.0) -> Verification:
        """``freshkey verify``'s engine (``pipeline.verify.run.run_verification``) on L2: every row against
        its entry, each mismatch re-read after ``window_ms`` (in flight or stale)."""
        binding = parse_bindings(self.bindings_text).bindings[0]
        settings = MySQLSettings(
            host=self.mysql.host,
            port=self.mysql.port,
            user=self.mysql.admin_user,
            password=SecretStr(self.mysql.admin_password),
        )

        async def run() -> Verification:
            client = self.async_redis()
            try:
                return await run_verification(
                    settings, [binding], [("redis", client)], prefix=self.prefix, window_ms=window_ms
                )
            finally:
                await client.aclose()

        return asyncio.run(run())

    def async_redis(self) -> aioredis.Redis | aioredis.RedisCluster:
        """A new asyncio client of the pipeline's Redis (a cluster client on a cluster); the caller closes
        it."""
        if self.redis_cluster:
            return aioredis.RedisCluster.from_url(self.redis_url)
        return aioredis.Redis.from_url(self.redis_url)

    def wait_consistent(self, timeout: float = 90) -> VerifyReport:
        """Wait until every row is in the cache as in the database (the pipeline caught up)."""
        report = self.verify()
        deadline = time.monotonic() + timeout
        while report.stale or report.missing:
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"not consistent after {timeout}s: {report}\n{self.logs()}")
            time.sleep(0.2)
            report = self.verify()
        return report

    def wait_caught_up(self, timeout: float = 90) -> None:
        """The connector's checkpoint is at the binlog end and the worker is past every high watermark."""
        target = self.master_position()
        store = CheckpointStore(self.checkpoint_path)
        self.wait(lambda: connector_reached(store.load(), target), timeout, "the connector to reach the end")
        highs = high_watermarks(self.kafka, self.change_topic)
        self.wait(lambda: worker_reached(self.stats(), self.change_topic, highs), timeout, "the worker")

    def close(self) -> None:
        """The end of a test: every process still running is killed (-9, its whole process group), the
        clients are closed and the database dropped. Not stopped gracefully: what the processes would
        still do (commit offsets, save a checkpoint) goes with the test's own topics, group, key prefix
        and database, and a worker takes 1.5-2.5 s to stop (tests that need a clean stop call
        :meth:`stop` themselves)."""
        running = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in running:
            proc.kill()  # a process started elsewhere (a test's own command) may lead no process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in running:
            proc.wait(timeout=10)
        self.conn.close()
        self.redis.close()
        with self.mysql.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {self.database}")
