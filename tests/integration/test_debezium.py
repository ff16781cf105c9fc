"""The same row changes, once as freshkey's own events and once as Debezium events, cached alike.

The real connector and worker (cache A) stream a table of every column type through updates, a primary
key change and deletes. From the same binlog rows, :class:`tests.support.debezium.DebeziumEncoder`
writes the Debezium MySQL messages the documentation describes (``source.pos`` at the rows event's
start, deletes followed by tombstones, a key change as delete + tombstone + create), which
``schemas.debezium.decode_any`` decodes (the first test hands the decoded events to a second real worker
on a topic of its own, cache B; the last one runs a worker with ``FRESHKEY_WORKER_INPUT=debezium`` on the
Debezium topic itself, cache C). Both caches must equal the database and each other entry by entry. Then
mixed replays: a second batch of changes reaches B half as freshkey events and half as Debezium events,
and each source's events are replayed into the other cache; every later change must win, so both
caches still equal the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from confluent_kafka import Producer
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from cache_writer.entries import Entry, read_namespace
from connectors.database import column_types
from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import free_port
from schemas import ChangeEvent, decode, encode, message_key
from schemas.debezium import DebeziumOptions, DebeziumTopics, Skip, decode_any
from schemas.values import ColumnType, binlog_column_types, binlog_row_to_json
from tests.support.debezium import DebeziumEncoder
from tests.support.kafka import create_topics, read_topic
from tests.support.pipeline import Pipeline
from tests.support.processes import start_freshkey, wait_for_stats
from tests.support.type_matrix import (
    ROWS,
    admin_settings,
    binlog_stream,
    create_table,
    insert_rows,
    matrix_of,
    mismatches,
    rotate_rows,
    wait_equal,
)

pytestmark = pytest.mark.integration

PREFIX = "dbserver1"


@dataclass
class Cache:
    """A cache tier's namespace: the prefix its worker writes under."""

    prefix: str
    namespace: str
    redis_url: str

    def entries(self) -> dict[str, Entry]:
        async def read() -> dict[str, Entry]:
            client = aioredis.Redis.from_url(self.redis_url)
            try:
                found = await read_namespace(client, self.prefix, self.namespace)
            finally:
                await client.aclose()
            return {key.split(":", 2)[2]: entry for key, entry in found.items()}

        return asyncio.run(read())


class SecondWorker:
    """Another real ``freshkey worker`` process on the pipeline's services, with its own change topic,
    consumer group and key prefix."""

    def __init__(self, p: Pipeline, workdir: Path, *, name: str = "b", **extra_env: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.topic = f"{p.change_topic}.{name}{tag}"
        self.prefix = f"{p.prefix}{name}"
        self.port = free_port()
        self.log = workdir / f"worker-{name}.log"
        self.env = {
            **p.env,
            "FRESHKEY_KAFKA_CHANGE_TOPIC": self.topic,
            "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": f"{p.dead_letter_topic}.b{tag}",
            "FRESHKEY_REDIS_KEY_PREFIX": self.prefix,
            "FRESHKEY_WORKER_APP_ID": f"{p.env['FRESHKEY_WORKER_APP_ID']}-{name}",
            "FRESHKEY_WORKER_DATA_DIR": str(workdir / f"worker-{name}"),
            "FRESHKEY_WORKER_WEB_PORT": str(self.port),
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            **extra_env,
        }
        create_topics(p.kafka, {self.topic: 3})
        self.proc = start_freshkey(["worker"], self.env, self.log)
        wait_for_stats(self.proc, self.port, self.log)

    def stop(self) -> None:
        """At the end of the test: killed (-9, its process group), like the harness's processes in
        ``Pipeline.close``; its topic, group and key prefix go with the test."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def second_worker(tmp_path: Path) -> Iterator[Callable[..., SecondWorker]]:
    started: list[SecondWorker] = []

    def start(p: Pipeline, **kwargs: str) -> SecondWorker:
        worker = SecondWorker(p, tmp_path, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@dataclass(frozen=True)
class Message:
    """One Kafka message with where its change sits in the binlog (start and end of its rows event)."""

    key: bytes | None
    value: bytes | None
    start: int
    end: int


def debezium_messages(p: Pipeline, start: tuple[str, int], encoder: DebeziumEncoder) -> list[Message]:
    """The Debezium messages of every change to ``assets`` from ``start`` to the binlog's end, built
    from the binlog rows the documented way (see the module docstring)."""
    mysql = p.mysql
    stream = binlog_stream(mysql, start, p.database, "assets")
    refine = column_types(admin_settings(mysql), p.database, "assets")
    messages: list[Message] = []
    try:
        for event in stream:
            types = binlog_column_types(event.columns, refine)
            end = int(event.packet.log_pos)
            begin = end - int(event.event_size)  # what Debezium calls pos: where the rows event starts
            for index, row in enumerate(event.rows):
                source = {
                    "file": stream.log_file,
                    "pos": begin,
                    "row": index,
                    "server_id": int(event.packet.server_id),
                    "ts_ms": int(event.timestamp) * 1000,
                    "snapshot": "false",
                    "gtid": None,
                }

                emit = _emitter(p, encoder, messages, types, source, begin, end)
                if isinstance(event, UpdateRowsEvent):
                    before = binlog_row_to_json(row["before_values"], types, row.get("before_none_sources"))
                    after = binlog_row_to_json(row["after_values"], types, row.get("after_none_sources"))
                    if before["id"] != after["id"]:  # a key change: delete, tombstone, create
                        emit("d", before, None)
                        emit("c", None, after)
                    else:
                        emit("u", before, after)
                elif isinstance(event, WriteRowsEvent):
                    emit("c", None, binlog_row_to_json(row["values"], types, row.get("none_sources")))
                else:
                    emit("d", binlog_row_to_json(row["values"], types, row.get("none_sources")), None)
    finally:
        stream.close()
    return messages


def _emitter(
    p: Pipeline,
    encoder: DebeziumEncoder,
    messages: list[Message],
    types: dict[str, ColumnType],
    source: dict[str, Any],
    begin: int,
    end: int,
) -> Callable[[str, Any, Any], None]:
    """Appends the Debezium message(s) of one row change: the change, and a tombstone after a delete."""

    def emit(op: str, before: Any, after: Any) -> None:
        key, value = encoder.message(
            p.database,
            "assets",
            types,
            ("id",),
            op=op,
            before=before,
            after=after,
            source=source,
            prefix=PREFIX,
        )
        messages.append(Message(key, value, begin, end))
        if op == "d":  # Debezium's tombstone for log compaction
            messages.append(Message(key, None, begin, end))

    return emit


def freshkey_messages(p: Pipeline, expect: int) -> list[Message]:
    """freshkey's own messages on the change topic, with their rows event's end position."""
    found = []
    for key, value in read_topic(p.kafka, p.change_topic, expect=expect):
        event = decode(value)
        if isinstance(event, ChangeEvent) and event.source.table == "assets":
            found.append(Message(key, value, 0, event.source.pos))
    return found


def translate(p: Pipeline, messages: list[Message]) -> tuple[list[Message], int]:
    """Debezium messages decoded by ``decode_any`` (as the worker will) and re-encoded as freshkey events
    for worker B; returns them and the number of skipped messages (tombstones)."""
    options = DebeziumOptions(input="debezium", topics=DebeziumTopics(pattern=rf"{PREFIX}\..*"))
    types: dict[tuple[str, str], dict[str, ColumnType]] = {}

    def lookup(db: str, table: str) -> dict[str, ColumnType]:
        if (db, table) not in types:
            types[db, table] = column_types(admin_settings(p.mysql), db, table)
        return types[db, table]

    topic = f"{PREFIX}.{p.database}.assets"
    translated, skipped = [], 0
    for m in messages:
        result = decode_any(topic, m.key, m.value, options, column_types=lookup)
        if isinstance(result, Skip):
            skipped += 1
            continue
        assert isinstance(result, ChangeEvent), result
        key = message_key(result.source.db, result.source.table, result.key)
        translated.append(Message(key, encode(result), m.start, m.end))
    return translated, skipped


def produce(bootstrap: str, topic: str, messages: list[Message]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    for m in messages:
        producer.produce(topic, key=m.key, value=m.value)
    assert producer.flush(30) == 0


def _wait_cache(p: Pipeline, cache: Cache, deleted: set[int], timeout: float = 60) -> None:
    """Like ``tests.support.type_matrix.wait_equal``, for a cache under another prefix."""
    original = p.prefix
    p.prefix = cache.prefix
    try:
        wait_equal(p, deleted, timeout)
    finally:
        p.prefix = original


def _same_caches(a: Cache, b: Cache) -> tuple[int, int]:
    """Entry by entry: the same keys, each a tombstone in both or the same value; (entries, tombstones)."""
    first, second = a.entries(), b.entries()
    assert first.keys() == second.keys(), (sorted(first), sorted(second))
    for key, entry in first.items():
        other = second[key]
        assert entry.tombstone == other.tombstone, key
        assert entry.value == other.value, (key, entry.value, other.value)
    return len(first), sum(1 for e in first.values() if e.tombstone)


def _changes_seen(url: str) -> int:
    """Change events a worker has taken (c, u, d and r), applied or not."""
    events = (fetch_stats(url) or {}).get("events", {})
    return sum(int(events.get(op, 0)) for op in ("c", "u", "d", "r"))


def _outcome(url: str, name: str) -> int:
    stats = fetch_stats(url) or {}
    return int(stats.get("outcomes", {}).get(f"redis:{name}", 0))


def test_freshkey_and_debezium_events_of_the_same_changes_give_the_same_cache(
    make_pipeline: Callable[..., Pipeline], second_worker: Callable[..., SecondWorker]
) -> None:
    p = make_pipeline(value_columns=False)
    matrix = matrix_of(p)
    create_table(p, matrix)
    p.start("connector")
    p.start("worker")
    b = second_worker(p)
    cache_a = Cache(p.prefix, p.namespace, p.redis_url)
    cache_b = Cache(b.prefix, p.namespace, p.redis_url)
    start = p.master_position()

    # Batch 1: writes, updates of every column, a primary key change, deletes.
    insert_rows(p, matrix)
    rotate_rows(p, matrix)
    p.sql(f"UPDATE {p.database}.assets SET id = 50 WHERE id = 5")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id IN (2, 3)")
    deleted = {2, 3, 5}
    wait_equal(p, deleted)

    own = freshkey_messages(p, expect=2 * ROWS + 2 + 2)
    dbz = debezium_messages(p, start, DebeziumEncoder())
    translated, skipped = translate(p, dbz)
    assert len(translated) == len(own) == 2 * ROWS + 4 and skipped == 3  # three deletes, three tombstones
    produce(p.kafka, b.topic, translated)
    _wait_cache(p, cache_b, deleted)
    entries, tombstones = _same_caches(cache_a, cache_b)
    assert (entries, tombstones) == (ROWS + 1, 3)
    assert not mismatches(p, deleted)

    # Batch 2, across a cut: the same rows change on both sides of it.
    before_batch = p.master_position()
    p.sql(f"UPDATE {p.database}.assets SET vc = 'before the cut', i = 7 WHERE id IN (1, 4)")
    p.sql(f"INSERT INTO {p.database}.assets (id) VALUES (7), (8)")
    cut = p.master_position()[1]
    p.sql(f"UPDATE {p.database}.assets SET vc = 'after the cut', i = 8 WHERE id IN (1, 4, 7)")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 8")
    p.sql(f"UPDATE {p.database}.assets SET id = 9 WHERE id = 7")
    deleted |= {7, 8}
    wait_equal(p, deleted)
    own_2 = [m for m in freshkey_messages(p, expect=len(own) + 10) if m.end > before_batch[1]]
    raw_2 = debezium_messages(p, before_batch, DebeziumEncoder())
    dbz_2, skipped_2 = translate(p, raw_2)
    assert len(own_2) == len(dbz_2) == 10

    # B: freshkey's own events up to the cut, Debezium's after it (each row in binlog order).
    mixed = [m for m in own_2 if m.end <= cut] + [m for m in dbz_2 if m.start >= cut]
    assert len(mixed) == 10
    produce(p.kafka, b.topic, mixed)
    _wait_cache(p, cache_b, deleted)

    # Replays from the other source: Debezium's events of everything into A (all older or equal there:
    # refused), freshkey's own of everything into B (newer or equal versions of the same data).
    url_a = f"http://127.0.0.1:{p.web_port}/freshkey/stats"
    applied_a = (_outcome(url_a, "applied"), _outcome(url_a, "tombstoned"))
    seen_a = _changes_seen(url_a)
    produce(p.kafka, p.change_topic, translated + dbz_2)
    p.wait(lambda: _changes_seen(url_a) >= seen_a + len(translated) + len(dbz_2), 60, "A to take the replays")
    assert (_outcome(url_a, "applied"), _outcome(url_a, "tombstoned")) == applied_a, (
        "a replayed Debezium event changed cache A"
    )
    url_b = f"http://127.0.0.1:{b.port}/freshkey/stats"
    seen_b = _changes_seen(url_b)
    produce(p.kafka, b.topic, own + own_2)
    p.wait(lambda: _changes_seen(url_b) >= seen_b + len(own) + len(own_2), 60, "B to take the replays")
    _wait_cache(p, cache_b, deleted)
    assert not mismatches(p, deleted)
    entries, tombstones = _same_caches(cache_a, cache_b)
    print(
        f"\nfreshkey vs Debezium: {len(own) + len(own_2)} freshkey events, {len(dbz) + len(raw_2)} "
        f"Debezium messages ({skipped + skipped_2} tombstones skipped), {entries} entries equal in both "
        f"caches ({tombstones} tombstones), 0 differences; after mixed replays still equal to the database"
    )


def test_a_worker_reads_debezium_topics_directly(
    make_pipeline: Callable[..., Pipeline], second_worker: Callable[..., SecondWorker]
) -> None:
    """``FRESHKEY_WORKER_INPUT=debezium``: a worker subscribed to Debezium's topic (by pattern) takes the
    documented messages themselves, tombstones included, and builds the same cache as freshkey's own
    connector and worker."""
    p = make_pipeline(value_columns=False)
    matrix = matrix_of(p)
    create_table(p, matrix)
    p.start("connector")
    p.start("worker")
    topic = f"{PREFIX}.{p.database}.assets"
    create_topics(p.kafka, {topic: 3})
    c = second_worker(
        p,
        name="c",
        FRESHKEY_WORKER_INPUT="debezium",
        FRESHKEY_KAFKA_DEBEZIUM_TOPICS="regex:" + re.escape(f"{PREFIX}.{p.database}.") + ".*",
    )
    start = p.master_position()
    insert_rows(p, matrix)
    p.sql(f"UPDATE {p.database}.assets SET id = 50 WHERE id = 5")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id IN (2, 3)")
    deleted = {2, 3, 5}
    wait_equal(p, deleted)
    messages = debezium_messages(p, start, DebeziumEncoder())
    assert any(m.value is None for m in messages), "the deletes' tombstones are among them"
    produce(p.kafka, topic, messages)
    cache_c = Cache(c.prefix, p.namespace, p.redis_url)
    _wait_cache(p, cache_c, deleted)
    entries, tombstones = _same_caches(Cache(p.prefix, p.namespace, p.redis_url), cache_c)
    assert (entries, tombstones) == (ROWS + 1, 3)  # every row once, the moved key twice; 3 tombstones
    stats = fetch_stats(f"http://127.0.0.1:{c.port}/freshkey/stats") or {}
    assert stats["events"].get("skipped", 0) == sum(m.value is None for m in messages)
    assert stats["events"].get("dead_lettered", 0) == 0
