"""Has the pipeline caught up? Connector checkpoint at the binlog end, worker past every high watermark.

Used by ``freshkey demo``, the verifier's in-flight re-check and the tests: a check made before the
pipeline caught up would count in-flight changes as stale.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from connectors.checkpoint import BinlogPosition


def fetch_stats(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The worker's ``/freshkey/stats`` JSON, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data: dict[str, Any] = orjson.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def high_watermarks(bootstrap: str, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Partition -> offset of the next message to be written."""
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
    offsets = (stats or {}).get("offsets", {})
    return all(high == 0 or offsets.get(f"{topic}/{p}", -1) + 1 >= high for p, high in highs.items())
