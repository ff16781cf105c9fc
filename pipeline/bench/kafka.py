"""Kafka helpers of ``freshkey bench pipeline``: read what the connector produced, and copy it.

The worker benchmarks drain a topic filled with byte-for-byte copies of the connector's messages, each
in the partition the connector chose (so one row's changes keep their order). The copies are produced
from this process with their delivery reports, which give the exact last offset of every partition:
the Tansu broker's high watermarks are not usable for that (measured here: after 20,000 messages over
4 partitions it reported 4,814 for every partition, whatever each really held).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import KafkaError, Message, Producer


@dataclass(frozen=True)
class Copy:
    """One message to reproduce: its partition, key and value."""

    partition: int
    key: bytes | None
    value: bytes | None


class KafkaBenchError(RuntimeError):
    """Reading or producing the bench's messages failed; the message says what was expected."""


def read_messages(
    bootstrap: str,
    topic: str,
    partitions: int,
    start: Mapping[int, int],
    *,
    want: int,
    key_prefix: bytes,
    end: Mapping[int, int] | None = None,
    timeout_s: float = 60.0,
) -> tuple[list[Copy], dict[int, int]]:
    """Read ``topic`` from the ``start`` offsets (partition -> offset, 0 when absent); the messages whose
    key starts with ``key_prefix`` (in each partition's order; others, such as warm-up rows, are
    skipped) and the offsets to read from next time.

    Without ``end``: until ``want`` such messages are found (the topic must hold nothing after them).
    With ``end`` (partition -> offset to stop before, from an earlier read): exactly that range, which
    must hold ``want`` of them. KafkaBenchError otherwise, or after ``timeout_s``."""
    found, following = asyncio.run(
        _read(bootstrap, topic, partitions, start, end, want, key_prefix, timeout_s)
    )
    if len(found) != want:
        raise KafkaBenchError(
            f"found {len(found)} messages with keys {key_prefix!r} in {topic} from {dict(start)} "
            f"to {dict(following)}, {want} expected"
        )
    return found, following


async def _read(
    bootstrap: str,
    topic: str,
    partitions: int,
    start: Mapping[int, int],
    end: Mapping[int, int] | None,
    want: int,
    key_prefix: bytes,
    timeout_s: float,
) -> tuple[list[Copy], dict[int, int]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    found: list[Copy] = []
    following = {p: start.get(p, 0) for p in range(partitions)}

    def done() -> bool:
        if end is None:
            return len(found) >= want
        return all(following[p] >= end.get(p, 0) for p in range(partitions))

    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        for tp in assigned:
            consumer.seek(tp, following[tp.partition])
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise KafkaBenchError(
                    f"read {len(found)} of the {want} expected messages with keys {key_prefix!r} from "
                    f"{topic} in {timeout_s:.0f} s (offsets {following}, end {end})"
                )
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for tp, messages in batches.items():
                stop = None if end is None else end.get(tp.partition, 0)
                for message in messages:
                    if stop is not None and message.offset >= stop:
                        break
                    following[tp.partition] = message.offset + 1
                    if message.key is not None and message.key.startswith(key_prefix):
                        found.append(Copy(tp.partition, message.key, message.value))
    finally:
        await consumer.stop()
    return found, following


def produce_copies(
    bootstrap: str, topic: str, copies: Iterable[Copy], timeout_s: float = 120.0
) -> dict[int, int]:
    """Produce ``copies`` to ``topic`` (each to its partition, in order; idempotent, acks=all) and
    return partition -> offset of the last one Kafka acknowledged there."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    last: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err: KafkaError | None, message: Message) -> None:
        if err is not None:
            errors.append(str(err))
            return
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None and offset > last.get(partition, -1):
            last[partition] = offset

    for count, copy in enumerate(copies):
        while True:
            try:
                producer.produce(
                    topic, value=copy.value, key=copy.key, partition=copy.partition, on_delivery=delivered
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        if count % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining or errors:
        raise KafkaBenchError(
            f"copying into {topic}: {remaining} message(s) unacknowledged after {timeout_s:.0f} s, "
            f"{len(errors)} failed ({errors[:3]})"
        )
    return last
