"""A Debezium topic created after the worker subscribed (a table Debezium starts capturing later).

faust-streaming subscribes to a list of topics, so a worker with ``FRESHKEY_KAFKA_DEBEZIUM_TOPICS=regex:``
resolves the pattern when it starts. With the check on, a new matching topic makes it say which and exit
with status 70; started again, it reads the new topic from its start, and the table's row reaches the
cache. The control runs the same with the check off (``FRESHKEY_KAFKA_DEBEZIUM_TOPIC_CHECK_S=0``): the
worker goes on and the row never reaches the cache (what a worker did before the check).
Real broker, Redis, MariaDB; the Debezium message is written the documented way (schema-less JSON).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer

from cache_writer.layout import entry_key
from pipeline.embedded import free_port
from pipeline.embedded.process import terminate
from tests.support.kafka import create_topics
from tests.support.pipeline import Pipeline
from tests.support.processes import start_freshkey, wait_for_stats

pytestmark = pytest.mark.integration

CHECK_S = 1.0


class DebeziumWorker:
    def __init__(self, p: Pipeline, workdir: Path, pattern: str, check_s: float) -> None:
        tag = uuid.uuid4().hex[:8]
        self.port = free_port()
        self.workdir = workdir
        self.prefix = f"{p.prefix}dz"
        self.env = {
            **p.env,
            "FRESHKEY_WORKER_INPUT": "debezium",
            "FRESHKEY_KAFKA_DEBEZIUM_TOPICS": f"regex:{pattern}",
            "FRESHKEY_KAFKA_DEBEZIUM_TOPIC_CHECK_S": str(check_s),
            "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": f"{p.dead_letter_topic}.dz{tag}",
            "FRESHKEY_REDIS_KEY_PREFIX": self.prefix,
            "FRESHKEY_WORKER_APP_ID": f"{p.env['FRESHKEY_WORKER_APP_ID']}-dz{tag}",
            "FRESHKEY_WORKER_DATA_DIR": str(workdir / "worker-dz"),
            "FRESHKEY_WORKER_WEB_PORT": str(self.port),
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
        }
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / f"worker-dz.{self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        self.proc = start_freshkey(["worker"], self.env, self.log)
        wait_for_stats(self.proc, self.port, self.log)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc, timeout=30)


@pytest.fixture
def debezium_worker(tmp_path: Path) -> Iterator[Callable[..., DebeziumWorker]]:
    started: list[DebeziumWorker] = []

    def make(p: Pipeline, pattern: str, check_s: float) -> DebeziumWorker:
        worker = DebeziumWorker(p, tmp_path, pattern, check_s)
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


def _insert_message(database: str, row_id: int, content: str) -> bytes:
    """A schema-less Debezium MySQL insert (the JSON converter with schemas.enable=false)."""
    return json.dumps(
        {
            "before": None,
            "after": {
                "id": row_id,
                "modality": "text",
                "content": content,
                "embedding": None,
                "updated_at": 1_700_000_000_000_000,  # DATETIME(6): µs since the epoch
            },
            "source": {
                "connector": "mysql",
                "name": "dbserver1",
                "db": database,
                "table": "assets",
                "server_id": 1,
                "file": "mysql-bin.000003",
                "pos": 4000 + row_id,
                "row": 0,
                "ts_ms": int(time.time() * 1000),
                "snapshot": "false",
            },
            "op": "c",
            "ts_ms": int(time.time() * 1000),
        }
    ).encode()


@pytest.mark.parametrize("check", [True, False], ids=["check on", "check off (control)"])
def test_a_new_matching_topic_is_read_after_a_restart(
    make_pipeline: Callable[..., Pipeline], debezium_worker: Callable[..., DebeziumWorker], check: bool
) -> None:
    p = make_pipeline(value_columns=False)
    tag = uuid.uuid4().hex[:6]
    first, later = f"dbz{tag}.{p.database}.other", f"dbz{tag}.{p.database}.assets"
    create_topics(p.kafka, {first: 1})
    worker = debezium_worker(p, re.escape(f"dbz{tag}.{p.database}.") + ".*", CHECK_S if check else 0)
    worker.start()
    assert worker.proc is not None

    created = time.monotonic()
    create_topics(p.kafka, {later: 1})  # Debezium starts capturing assets: its first change
    producer = Producer({"bootstrap.servers": p.kafka})
    producer.produce(later, key=json.dumps({"id": 7}).encode(), value=_insert_message(p.database, 7, "seven"))
    assert producer.flush(10) == 0
    client = redis.Redis.from_url(p.redis_url)
    key = entry_key(worker.prefix, p.namespace, ["7"])

    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(timeout=CHECK_S + 20 if check else 3 * CHECK_S + 2)
    exited_s = time.monotonic() - created
    code = worker.proc.poll()
    if not check:
        assert code is None, f"control: the worker stopped (status {code}) with the check off"
        time.sleep(3)  # it runs on, subscribed without the new topic
        assert client.exists(key) == 0, "control: the row of a topic the worker never subscribed to arrived"
        print(f"\ncheck off: the worker runs on, {later} unread, row 7 not cached after {exited_s + 3:.0f} s")
        return

    text = worker.log.read_text()
    assert code == 70, f"the worker did not exit for the new topic (status {code}):\n{text[-2000:]}"
    assert later in text and "status 70" in text
    worker.start()  # its supervisor starts it again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.exists(key) == 0:
        time.sleep(0.1)
    cached_s = time.monotonic() - created
    tail = worker.log.read_text()[-2000:]
    assert client.hget(key, "d") is not None, f"row 7 never reached the cache:\n{tail}"
    print(
        f"\ncheck on: the worker exited (70) {exited_s:.1f} s after {later} was created; started again,"
        f" row 7 cached {cached_s:.1f} s after"
    )
