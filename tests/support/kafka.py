"""Reading a whole topic back, for assertions (aiokafka: fast against the local broker)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 30
) -> list[tuple[bytes | None, bytes]]:
    """All messages of ``topic`` in (partition, offset) order once at least ``expect`` are there."""

    async def read() -> list[tuple[bytes | None, bytes]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        messages: list[tuple[int, int, bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout
        try:
            while len(messages) < expect and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    messages.extend((m.partition, m.offset, m.key, m.value or b"") for m in records)
        finally:
            await consumer.stop()
        if len(messages) < expect:
            raise AssertionError(f"only {len(messages)} of {expect} messages on {topic} after {timeout}s")
        return [(k, v) for _, _, k, v in sorted(messages, key=lambda m: (m[0], m[1]))]

    return asyncio.run(read())


# --- raw traffic for the poison tests: topics, producing any bytes, reading back with offsets ------------

_LIBRDKAFKA_LOG = logging.getLogger("tests.kafka_tools.librdkafka")
"""librdkafka's own lines (a broker gone at teardown...) go to logging, which pytest captures, instead
of onto stderr."""

LARGE_MESSAGE_BYTES = 16 * 1024 * 1024
"""Client-side message limit of the test producer and consumer: well above the 5 MB poison messages (the
clients' defaults, about 1 MB, would refuse them before the broker sees them)."""


def create_topics(bootstrap: str, partitions: Mapping[str, int], timeout: float = 30) -> None:
    """Create each topic with its partition count; an existing topic is left as it is.

    A worker started without the connector needs its change and dead-letter topics: Faust does not
    create a topic it only consumes, and a topic auto-created by a producer gets the broker's default
    partition count.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_LIBRDKAFKA_LOG)
    futures = admin.create_topics(
        [NewTopic(name, count, 1) for name, count in partitions.items()], request_timeout=timeout
    )
    for future in futures.values():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class RawProducer:
    """A librdkafka producer for arbitrary bytes (the test's own, with a 16 MiB message limit).

    :meth:`send` returns only once the broker acknowledged every message, with each message's
    ``(partition, offset)``, so a test can tell which dead letter belongs to which message.
    """

    def __init__(self, bootstrap: str, *, max_message_bytes: int = LARGE_MESSAGE_BYTES) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "message.max.bytes": max_message_bytes,
                "linger.ms": 0,
                "acks": "all",
            },
            logger=_LIBRDKAFKA_LOG,
        )

    def send(
        self, topic: str, messages: Sequence[tuple[bytes | None, bytes | None]], timeout: float = 60
    ) -> list[tuple[int, int]]:
        """Produce ``(key, value)`` messages in order (a None value is a Kafka tombstone); their
        ``(partition, offset)`` once all are acked."""
        where: list[tuple[int, int] | None] = [None] * len(messages)
        errors: list[str] = []

        def delivered(index: int) -> Callable[[Any, Any], None]:
            def report(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(f"message {index}: {error}")
                else:
                    where[index] = (message.partition(), message.offset())

            return report

        for index, (key, value) in enumerate(messages):
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, on_delivery=delivered(index))
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._producer.poll(0.1)
        remaining = self._producer.flush(timeout)
        if remaining or errors or any(w is None for w in where):
            raise AssertionError(f"producing to {topic}: {remaining} not delivered; {errors[:5]}")
        return [w for w in where if w is not None]


@dataclass(frozen=True, slots=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def read_to_end(bootstrap: str, topic: str, *, timeout: float = 30) -> list[Record]:
    """Every message of ``topic`` up to the end offsets it has when called, in (partition, offset) order."""

    async def read() -> list[Record]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=LARGE_MESSAGE_BYTES,
            fetch_max_bytes=4 * LARGE_MESSAGE_BYTES,
        )
        await consumer.start()
        records: list[Record] = []
        try:
            if topic not in await consumer.topics():  # also loads the topic's metadata
                raise AssertionError(f"topic {topic} does not exist")
            partitions = [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
            positions = {tp: 0 for tp in partitions}
            deadline = time.monotonic() + timeout
            while any(positions[tp] < ends[tp] for tp in partitions):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topic}: read {positions} of {ends} after {timeout}s")
                batch = await consumer.getmany(timeout_ms=500)
                for tp, messages in batch.items():
                    for m in messages:
                        if m.offset < ends[tp]:
                            records.append(Record(m.partition, m.offset, m.key, m.value or b""))
                        positions[tp] = max(positions[tp], m.offset + 1)
        finally:
            await consumer.stop()
        return sorted(records, key=lambda r: (r.partition, r.offset))

    return asyncio.run(read())


def read_records(bootstrap: str, topic: str, *, expect: int, timeout: float = 30) -> list[Record]:
    """Every message of ``topic`` with its partition and offset, in (partition, offset) order: read until
    at least ``expect`` came and then a fetch brought nothing more (end offsets are not asked: the test
    broker under-reports them). A producer's retry may have written a change twice, so stopping at
    ``expect`` could leave a partition's last messages unread."""

    async def read() -> list[Record]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    records.extend(Record(m.partition, m.offset, m.key, m.value or b"") for m in messages)
                if not batch and len(records) >= expect:
                    break
        finally:
            await consumer.stop()
        if len(records) < expect:
            raise AssertionError(f"only {len(records)} of {expect} messages on {topic} after {timeout}s")
        return sorted(records, key=lambda r: (r.partition, r.offset))

    return asyncio.run(read())


def committed_offsets(bootstrap: str, group: str, topic: str, timeout: float = 10) -> dict[int, int]:
    """The consumer group's committed offset per partition of ``topic`` (-1001: nothing committed).

    Reads the offsets only (an OffsetFetch): this client never joins the group.
    """
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False},
        logger=_LIBRDKAFKA_LOG,
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        committed = consumer.committed([ConfluentPartition(topic, p) for p in partitions], timeout=timeout)
        return {tp.partition: tp.offset for tp in committed}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 10) -> dict[int, int]:
    """The broker's end offset (next offset to be written) per partition of ``topic``. Some brokers
    report less than the log end (Tansu: the last record batch's base offset + 1), never more: a group
    committed below it is certainly behind."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "freshkey-test-ends"}, logger=_LIBRDKAFKA_LOG
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        return {
            p: int(consumer.get_watermark_offsets(ConfluentPartition(topic, p), timeout=timeout)[1])
            for p in partitions
        }
    finally:
        consumer.close()
