"""Has the pipeline caught up? Decided by sentinel rows seen in every tier; watermarks are a hint only.

Catch-up is decided by something that cannot be early: after the last change, :class:`SentinelRows`
rewrites one row per partition of the change topic (rows of the heartbeat table, chosen so that their
Kafka keys land on every partition). One row's changes stay in binlog order on one partition and the
worker applies a partition in order, so once every tier holds each sentinel at (at least) the version
just written, every change committed before it is in every tier too.

The broker's high watermarks (:func:`high_watermarks`, :func:`worker_reached`) are only a hint: the
test broker under-reports them (it answers the last batch's base offset + 1), so a worker "past every
high watermark" may still be a batch per partition behind. They can only make a wait longer, never
end it early.

Used by ``freshkey demo``, the pipeline harness of the tests and the verifier's in-flight re-check: a
check made before the pipeline caught up would count in-flight changes as stale.
"""

from __future__ import annotations

import urllib.request
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from cache_writer import entry_key
from connectors.checkpoint import BinlogPosition
from schemas import column_version, message_key


def fetch_stats(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The worker's ``/freshkey/stats`` JSON, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data: dict[str, Any] = orjson.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def high_watermarks(bootstrap: str, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Partition -> offset of the next message to be written, as the broker reports it (a hint: the
    test broker under-reports it, see the module docstring)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "freshkey-watermarks"})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def connector_reached(checkpoint: BinlogPosition | None, target: tuple[str, int]) -> bool:
    return checkpoint is not None and (checkpoint.file, checkpoint.pos) >= target


def worker_reached(stats: dict[str, Any] | None, topic: str, highs: dict[int, int]) -> bool:
    """Whether the worker acknowledged every partition up to ``highs`` (a hint: see the module)."""
    offsets = (stats or {}).get("offsets", {})
    return all(high == 0 or offsets.get(f"{topic}/{p}", -1) + 1 >= high for p, high in highs.items())


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of a keyed message under librdkafka's default partitioner (``consistent_random``:
    CRC-32 of the key modulo the partition count), the one the connector's producer uses (it sets no
    ``partitioner``). tests/integration/test_demo.py checks this against the real producer."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return zlib.crc32(key) % partitions


@dataclass(frozen=True)
class Sentinel:
    """One sentinel row as written: the partition its changes go to, its row id, the cache entry that
    holds it and the version written (the row's ``beat_at`` in epoch µs)."""

    partition: int
    row_id: int
    entry: str
    version: int


VersionReader = Callable[[str], int | None]
"""Reads one tier's version of an entry key (None: no such entry)."""


class SentinelRows:
    """Rows of the heartbeat table (``id INT PRIMARY KEY, beat_at DATETIME(6)``), one per partition of
    the change topic, each written after the last change and looked for in every tier.

    Row ids are the smallest ids from ``first_id`` on whose message key falls on each partition
    (:func:`partition_of`); keep ``first_id`` clear of the heartbeat prober's row.
    """

    def __init__(
        self,
        *,
        database: str,
        table: str,
        namespace: str,
        prefix: str,
        partitions: int,
        first_id: int = 1_000_000,
    ) -> None:
        self.database = database
        self.table = table
        self.namespace = namespace
        self.prefix = prefix
        self.ids: dict[int, int] = {}
        row_id = first_id
        while len(self.ids) < partitions:
            partition = partition_of(message_key(database, table, {"id": row_id}), partitions)
            self.ids.setdefault(partition, row_id)
            row_id += 1

    def write(self, conn: Any) -> list[Sentinel]:
        """Rewrite every sentinel row in one autocommitted statement (one transaction, one row event
        each) and return them with the versions the database gave them."""
        ids = sorted(self.ids.values())
        table = f"`{self.database}`.`{self.table}`"
        with conn.cursor() as cur:
            values = ", ".join(["(%s, UTC_TIMESTAMP(6))"] * len(ids))
            cur.execute(f"REPLACE INTO {table} (id, beat_at) VALUES {values}", ids)
            marks = ", ".join(["%s"] * len(ids))
            cur.execute(f"SELECT id, beat_at FROM {table} WHERE id IN ({marks})", ids)
            written = {int(row_id): column_version(beat_at) for row_id, beat_at in cur.fetchall()}
        return [
            Sentinel(partition, row_id, entry_key(self.prefix, self.namespace, [row_id]), written[row_id])
            for partition, row_id in sorted(self.ids.items())
        ]

    @staticmethod
    def missing(sentinels: Sequence[Sentinel], tiers: Sequence[VersionReader]) -> list[Sentinel]:
        """The sentinels some tier does not hold yet at (at least) their written version."""
        return [
            s
            for s in sentinels
            if any((version := read(s.entry)) is None or version < s.version for read in tiers)
        ]


def redis_version_reader(client: Any) -> VersionReader:
    """A :data:`VersionReader` over a blocking redis-py client: the entry hash's ``v`` field (an entry
    or a tombstone; either carries the version it was written with)."""

    def read(key: str) -> int | None:
        raw = client.hget(key, "v")
        return None if raw is None else int(raw)

    return read
