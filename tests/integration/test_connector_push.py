"""Batching without lag: the connector lets librdkafka batch (``linger.ms``) while it reads a backlog and
sends at once when it has read the binlog to its end.

- :meth:`BinlogSource.caught_up` on a real MariaDB: not caught up while a backlog waits behind the
  transaction just read, caught up after the last one;
- :meth:`ChangeProducer.push` on the real broker: with a 1 s linger, a pushed message is acknowledged in
  well under the linger, and the same message without the push waits for it (the check can fail);
- the connector process with a 1 s linger against a quiet database: every change is on the topic in well
  under the linger.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.binlog.source import BinlogSource, Boundary
from connectors.checkpoint import BinlogPosition
from connectors.kafka.producer import ChangeProducer
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import ensure_topics
from connectors.settings import MySQLSettings
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService

pytestmark = pytest.mark.integration

LINGER_MS = 1000.0
"""Far longer than any delivery here: whatever arrives before it was pushed."""


def _position(mysql: MySQLService) -> BinlogPosition:
    conn = mysql.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row: Any = cur.fetchone()
    finally:
        conn.close()
    return BinlogPosition(str(row[0]), int(row[1]))


def test_caught_up_only_after_the_last_transaction_of_a_backlog(mysql_service: MySQLService) -> None:
    db = f"push_{uuid.uuid4().hex[:8]}"
    conn = mysql_service.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {db}")
            cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)")
        start = _position(mysql_service)
        with conn.cursor() as cur:
            for i in range(200):  # 200 transactions (autocommit)
                cur.execute(f"INSERT INTO {db}.t VALUES (%s, %s)", (i, i))
    finally:
        conn.close()
    settings = MySQLSettings(
        host=mysql_service.host,
        port=mysql_service.port,
        user=mysql_service.admin_user,
        password=mysql_service.admin_password,
        server_id=4_000 + uuid.uuid4().int % 1_000,
    )
    source = BinlogSource(settings, [(db, "t")], start=start)
    seen: list[bool] = []
    try:
        for item in source:
            if isinstance(item, Boundary):
                seen.append(source.caught_up())
                if len(seen) == 200:
                    break
    finally:
        source.close()
    assert not seen[0], "199 transactions wait behind the first: not caught up"
    assert seen.count(False) >= 100, f"a backlog read as caught up: {seen.count(True)} of 200"
    assert seen[-1], "after the last transaction the binlog has nothing more: caught up"


def _delivery_ms(producer: ChangeProducer, topic: str, *, push: bool, wait_s: float) -> float | None:
    """Milliseconds from produce() to the acknowledgement, None when none came within ``wait_s``."""
    done: list[float] = []
    sent = time.monotonic()
    producer.produce(topic, b"k", b"v", lambda: done.append(time.monotonic()))
    if push:
        producer.push()
    deadline = sent + wait_s
    while not done and time.monotonic() < deadline:
        producer.serve(0.005)
    return (done[0] - sent) * 1000 if done else None


def test_push_sends_now_what_the_linger_would_hold(kafka_bootstrap: str) -> None:
    tag = uuid.uuid4().hex[:8]
    settings = KafkaSettings(
        bootstrap=kafka_bootstrap,
        change_topic=f"freshkey.changes.push.{tag}",
        dead_letter_topic=f"freshkey.dead-letters.push.{tag}",
        partitions=1,
    )
    ensure_topics(settings)
    producer = ChangeProducer(settings, linger_ms=LINGER_MS)
    try:
        _delivery_ms(producer, settings.change_topic, push=True, wait_s=10)  # connected, producer id known
        pushed = [_delivery_ms(producer, settings.change_topic, push=True, wait_s=1.0) for _ in range(10)]
        held = _delivery_ms(producer, settings.change_topic, push=False, wait_s=0.5)
    finally:
        producer.close(5)
    assert all(ms is not None for ms in pushed), f"a pushed message waited for its linger: {pushed}"
    assert statistics.median(ms for ms in pushed if ms is not None) < 100, pushed
    assert held is None, "without push() the message waits for the linger (else this test proves nothing)"


def test_a_quiet_database_sees_no_linger(make_pipeline: Any) -> None:
    pipeline: Pipeline = make_pipeline()
    pipeline.start("connector", FRESHKEY_CONNECTOR_LINGER_MS=str(LINGER_MS))
    settings = KafkaSettings(bootstrap=pipeline.kafka, change_topic=pipeline.change_topic)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap,
            "group.id": f"push-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        parts = consumer.list_topics(settings.change_topic, timeout=10).topics[settings.change_topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(settings.change_topic, p), timeout=10)[1]
                for p in parts.partitions}  # fmt: skip
        pipeline.sql("INSERT INTO assets VALUES (1, 'text', 'warm', NULL, UTC_TIMESTAMP(6))")
        pipeline.wait(lambda: _topic_size(consumer, settings.change_topic, ends) >= 1, 30, "the first change")
        took: list[float] = []
        for i in range(5):
            before = _topic_size(consumer, settings.change_topic, ends)
            written = time.monotonic()
            pipeline.sql("UPDATE assets SET content = %s WHERE id = 1", (f"v{i}",))
            while _topic_size(consumer, settings.change_topic, ends) <= before:
                assert time.monotonic() - written < 10, "the change never reached the topic"
                time.sleep(0.005)
            took.append((time.monotonic() - written) * 1000)
            time.sleep(0.2)
    finally:
        consumer.close()
    assert statistics.median(took) < LINGER_MS / 4, f"ms from commit to topic: {took}"


def _topic_size(consumer: Consumer, topic: str, start: dict[int, int]) -> int:
    """Messages on the topic since ``start`` (end offsets per partition)."""
    return sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1] - offset
        for p, offset in start.items()
    )
