"""Hotness of cache entries: hit counts from the clients, in a Faust table, scored for prewarming.

The path of a hit (the simplest that survives restarts of every part):

1. The application's client counts hits by entry key and appends them in batches to the Redis Stream
   ``<prefix>:hits`` (``cache_writer.hotness.HitRecorder``): no Kafka in applications.
2. Each worker reads that stream in the consumer group ``freshkey-hotness`` (:class:`HitForwarder`) and
   forwards the counts, split by namespace, to the hotness topic keyed by namespace; it acknowledges the
   stream messages once Kafka has them (at least once: a count may be counted twice after a crash).
3. The hotness agent folds them into the Faust table ``hotness`` (entry key -> ``"hits,last_hit_ms"``,
   changelog-backed). A namespace's counts all live in the partition of its name, which is also where
   its cutover commands go, so the worker that runs a cutover has the namespace's counts at hand.

Score of an entry with ``hits`` hits, last hit ``age`` seconds ago (``FRESHKEY_HOTNESS_*``)::

    alpha * sigmoid(hits / hit_scale) + (1 - alpha) * exp(-age / tau_s)      alpha 0.7, tau_s 3600
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import orjson

from cache_writer.layout import parse_entry_key
from cache_writer.tier import HitSource
from pipeline.settings import HotnessSettings

log = logging.getLogger(__name__)

HITS_GROUP = "freshkey-hotness"


def hotness_score(hits: int, age_s: float, settings: HotnessSettings) -> float:
    """``alpha * sigmoid(hits / hit_scale) + (1 - alpha) * exp(-max(age, 0) / tau_s)``."""
    x = hits / settings.hit_scale
    sigmoid = 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
    recency = math.exp(-max(age_s, 0.0) / settings.tau_s)
    return settings.alpha * sigmoid + (1.0 - settings.alpha) * recency


def encode_count(hits: int, last_ms: int) -> str:
    return f"{hits},{last_ms}"


def decode_count(value: str | None) -> tuple[int, int]:
    if not value:
        return 0, 0
    hits, _, last = value.partition(",")
    try:
        return int(hits), int(last or 0)
    except ValueError:
        return 0, 0


def merge_count(current: str | None, hits: int, last_ms: int) -> str:
    """The table value after adding ``hits`` (the latest hit time wins)."""
    have, seen = decode_count(current)
    return encode_count(have + hits, max(seen, last_ms))


def top_entries(
    items: Iterable[tuple[str, str]], key_prefix: str, n: int, now_ms: int, settings: HotnessSettings
) -> list[str]:
    """The ``n`` hottest entry keys starting with ``key_prefix`` (ties: the key), hottest first."""
    if n <= 0:
        return []
    scored = (
        (hotness_score(hits, (now_ms - last) / 1000, settings), key)
        for key, value in items
        if key.startswith(key_prefix)
        for hits, last in (decode_count(value),)
    )
    return [key for _, key in heapq.nlargest(n, scored)]


@dataclass(frozen=True, slots=True)
class HitBatch:
    namespace: str
    counts: dict[str, tuple[int, int]]

    def to_json(self, prefix: str) -> bytes:
        return orjson.dumps(
            {"kind": "hits", "prefix": prefix, "namespace": self.namespace, "counts": self.counts}
        )


def split_by_namespace(counts: dict[str, tuple[int, int]], prefix: str) -> list[HitBatch]:
    """Counts of one client flush, split by namespace (keys of other prefixes are dropped)."""
    by_namespace: dict[str, dict[str, tuple[int, int]]] = {}
    for key, count in counts.items():
        parsed = parse_entry_key(key)
        if parsed is None or parsed.prefix != prefix:
            continue
        by_namespace.setdefault(parsed.namespace, {})[key] = count
    return [HitBatch(ns, c) for ns, c in sorted(by_namespace.items())]


Send = Callable[[bytes, bytes], Awaitable[None]]
"""Send one message (key, value) to the hotness topic and wait until Kafka has it."""


class HitForwarder:
    """Moves the clients' hit counts from the Redis Stream to the hotness topic (module docstring)."""

    def __init__(self, tier: HitSource, prefix: str, consumer: str) -> None:
        self.tier = tier
        self.prefix = prefix
        self.consumer = consumer
        self.forwarded = 0

    async def forward(self, send: Send, *, count: int = 100) -> int:
        """Forward up to ``count`` stream messages; returns how many namespace batches were sent. The
        messages are acknowledged once Kafka has every batch of them."""
        messages = await self.tier.read_hits(self.prefix, HITS_GROUP, self.consumer, count=count)
        sent = 0
        for _message_id, counts in messages:
            for batch in split_by_namespace(counts, self.prefix):
                await send(batch.namespace.encode(), batch.to_json(self.prefix))
                sent += 1
        await self.tier.ack_hits(self.prefix, HITS_GROUP, [message_id for message_id, _ in messages])
        self.forwarded += sent
        return sent
