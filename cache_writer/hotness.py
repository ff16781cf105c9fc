"""Hit counts from the application clients, for the pipeline's prewarm of hot entries.

The simplest robust path: a client counts its hits in memory (:class:`HitRecorder`) and, every
``flush_every`` hits or ``flush_interval_s``, appends them to one Redis Stream with one ``XADD``::

    <prefix>:hits    XADD MAXLEN ~ <maxlen> *  h <JSON {"<entry key>": [hits, last hit ms], ...}>

The application needs nothing but its Redis connection, a flush costs one command per batch of hits,
and a failed flush only loses counts (a heuristic), never a read. The pipeline's workers read the stream
in a consumer group (:func:`read_hits`, :func:`ack_hits`) and fold the counts into a Faust table
(``pipeline.hotness``). Counts are at least once: a worker that dies before it acknowledges a message
reads it again; hotness tolerates that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

from cache_writer.layout import hits_stream

log = logging.getLogger(__name__)

HITS_FIELD = "h"


class HitRecorder:
    """Thread-safe hit counts by entry key, flushed to :func:`hits_stream` in batches."""

    def __init__(
        self,
        prefix: str,
        *,
        flush_every: int = 1000,
        flush_interval_s: float = 1.0,
        max_keys: int = 100_000,
        maxlen: int = 100_000,
    ) -> None:
        if flush_every < 1 or flush_interval_s <= 0 or max_keys < 1 or maxlen < 1:
            raise ValueError("flush_every, flush_interval_s, max_keys and maxlen must be positive")
        self.stream = hits_stream(prefix)
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self.max_keys = max_keys
        self.maxlen = maxlen
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._pending = 0
        self._last_flush = time.monotonic()
        self.flushed = 0
        self.dropped = 0

    def record(self, key: str, hits: int = 1) -> None:
        now_ms = int(time.time() * 1000)
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                if len(self._counts) >= self.max_keys:
                    self.dropped += hits  # bounded memory: the flush is due anyway
                    return
                self._counts[key] = [hits, now_ms]
            else:
                entry[0] += hits
                entry[1] = now_ms
            self._pending += hits

    def due(self) -> bool:
        """Whether :meth:`flush` should run now (enough hits, or enough time since the last one)."""
        with self._lock:
            if not self._counts:
                return False
            return (
                self._pending >= self.flush_every
                or time.monotonic() - self._last_flush >= self.flush_interval_s
            )

    def drain(self) -> dict[str, list[int]]:
        """The counts since the last drain (and forget them)."""
        with self._lock:
            counts, self._counts = self._counts, {}
            self._pending = 0
            self._last_flush = time.monotonic()
            return counts

    def _message(self, counts: dict[str, list[int]]) -> dict[str, bytes]:
        return {HITS_FIELD: orjson.dumps(counts)}

    async def flush(self, client: aioredis.Redis | aioredis.RedisCluster) -> int:
        """Append the counts to the stream; returns how many keys were sent (0 when it failed)."""
        counts = self.drain()
        try:
            if counts:
                await client.xadd(self.stream, self._message(counts), maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
        except (redis.RedisError, OSError) as exc:
            return self._lost(exc)
        return self._sent(counts)

    def flush_sync(self, client: redis.Redis | redis.RedisCluster) -> int:
        """:meth:`flush` for a blocking client."""
        counts = self.drain()
        try:
            if counts:
                client.xadd(self.stream, self._message(counts), maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
        except (redis.RedisError, OSError) as exc:
            return self._lost(exc)
        return self._sent(counts)

    def _sent(self, counts: dict[str, list[int]]) -> int:
        self.flushed += len(counts)
        return len(counts)

    def _lost(self, exc: BaseException) -> int:
        log.warning("hit counts not recorded (%s)", exc)
        return 0


def parse_hits(fields: dict[bytes, bytes]) -> dict[str, tuple[int, int]]:
    """The counts of one stream message: entry key -> (hits, last hit ms); {} for a malformed one."""
    try:
        data = orjson.loads(fields.get(HITS_FIELD.encode(), b"{}"))
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, tuple[int, int]] = {}
    for key, value in data.items():
        if (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            out[str(key)] = (value[0], value[1])
    return out


async def read_hits(
    client: aioredis.Redis | aioredis.RedisCluster, prefix: str, group: str, consumer: str, *, count: int
) -> list[tuple[bytes, dict[str, tuple[int, int]]]]:
    """Up to ``count`` new messages of :func:`hits_stream` for ``consumer`` of the consumer ``group``
    (created, with the stream, when missing): ``(message id, counts)`` each, to :func:`ack_hits` once
    they are safe elsewhere. Messages that are not hit counts come with empty counts."""
    stream = hits_stream(prefix)
    for attempt in range(2):
        try:
            replies: Any = await client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=None)
            break
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) or attempt:
                raise
            await _create_group(client, stream, group)
    return [
        (message_id, parse_hits(fields))
        for _stream, messages in replies or []
        for message_id, fields in messages
    ]


async def ack_hits(
    client: aioredis.Redis | aioredis.RedisCluster, prefix: str, group: str, ids: Sequence[bytes]
) -> None:
    """Acknowledge messages :func:`read_hits` gave ``group``: they are not read again."""
    if ids:
        await client.xack(hits_stream(prefix), group, *ids)


async def _create_group(client: aioredis.Redis | aioredis.RedisCluster, stream: str, group: str) -> None:
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):  # another worker created it meanwhile: fine
            raise
