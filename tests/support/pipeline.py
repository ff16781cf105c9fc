"""The pipeline harness: connector and worker as real child processes on the test services, per test.

Every pipeline gets its own database, topics, consumer group, Redis key prefix and checkpoint file, so
tests never see each other's data, against private or external services alike.
"""

from __future__ import annotations

import asyncio
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

from cache_writer.entries import Entry, read_namespace
from connectors.checkpoint import CheckpointStore
from connectors.database import read_table
from connectors.settings import MySQLSettings
from pipeline.demo.catchup import connector_reached, fetch_stats, high_watermarks, worker_reached
from pipeline.embedded import free_port, preexec_die_with_parent
from pipeline.verify.judge import VerifyReport, verify_namespace
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
        self.web_port = free_port()
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
            "FRESHKEY_WORKER_SESSION_TIMEOUT_S": "6",
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts = {"connector": 0, "worker": 0}
        with mysql.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.database}")
            cur.execute(TABLE_DDL.format(db=self.database))
        self.conn = mysql.connect(self.database)
        self.redis = redis.Redis.from_url(redis_url)

    # -- processes -------------------------------------------------------------------------------------
    def start(self, name: str, **extra_env: str) -> None:
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} already running"
        self.starts[name] += 1
        log = (self.workdir / f"{name}.{self.starts[name]}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "pipeline", name],
            env={**self.env, **extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(),
        )
        log.close()
        if name == "connector":
            self.wait(lambda: self.checkpoint_path.exists(), 60, "the connector's first checkpoint")
        else:
            self.wait(lambda: self.stats() is not None, 60, "the worker's web server")

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

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def stats(self) -> dict[str, Any] | None:
        return fetch_stats(f"http://127.0.0.1:{self.web_port}/freshkey/stats")

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
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(self.redis_url)
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
            password=self.mysql.admin_password,  # type: ignore[arg-type]
        )
        rows = list(read_table(settings, self.database, "assets"))
        return verify_namespace(binding, rows, self.entries(), prefix=self.prefix, key_columns=("id",))

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
        for name in list(self.procs):
            self.stop(name)
        self.conn.close()
        self.redis.close()
        with self.mysql.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {self.database}")
