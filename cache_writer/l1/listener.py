"""Keeping L1 caches honest: the broadcast of every applied change, and the listeners that apply it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import redis
import redis.asyncio as aioredis

from cache_writer.l1.cache import L1Cache
from cache_writer.layout import parse_entry_key

log = logging.getLogger(__name__)


def parse_signature_broadcast(message: bytes | str) -> tuple[str, str] | None:
    """``a <signature> <namespace prefix>`` -> (namespace prefix, signature); None for other messages."""
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split(" ", 2)
    if len(parts) != 3 or parts[0] != "a":
        return None
    parsed = parse_entry_key(parts[2])
    if parsed is None or parsed.row != "":
        return None  # not a namespace prefix '<prefix>:{<namespace>}:'
    return parts[2], parts[1]


def dispatch_broadcast(message: bytes | str, caches: list[L1Cache]) -> None:
    """Apply one invalidation-channel message to every cache (unknown messages are ignored)."""
    parsed = parse_broadcast(message)
    if parsed is not None:
        for cache in caches:
            cache.on_broadcast(*parsed)
        return
    cutover = parse_signature_broadcast(message)
    if cutover is not None:
        for cache in caches:
            cache.on_signature(*cutover)


def apply_message(message: dict[str, Any], caches: list[L1Cache]) -> bool:
    """Apply one Pub/Sub message of the invalidation channel; True when it confirms the subscription
    (the caches were flushed while unsubscribed and serve again from now on)."""
    if message["type"] == "subscribe":
        mark(caches, healthy=True)
        return True
    if message["type"] == "message":
        dispatch_broadcast(message["data"], caches)
    return False


def mark(caches: list[L1Cache], *, healthy: bool) -> None:
    """Flush every cache and let it serve (subscribed) or not (the broadcast may have been missed)."""
    for cache in caches:
        cache.mark(healthy)


def parse_broadcast(message: bytes | str) -> tuple[str, int, str] | None:
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split(" ", 2)
    if len(parts) != 3 or parts[0] not in ("w", "i") or not parts[1].isdecimal():
        return None
    return parts[0], int(parts[1]), parts[2]


class InvalidationListener:
    """Subscribes to the invalidation channel and keeps one or more L1 caches in step (asyncio).

    ``client`` may be a ``RedisCluster``: its Pub/Sub connection goes to the node that owns the
    channel's slot, and Redis Cluster forwards every PUBLISH to every node, so the announcements of the
    scripts on any node arrive (tests/integration/test_cluster_e2e.py).

    On any connection error the caches are flushed and marked unhealthy, and the listener reconnects
    with backoff; after it is subscribed again they are flushed once more and serve again.
    """

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        channel: str,
        caches: list[L1Cache],
        *,
        health_check_interval_s: float = 1.0,
    ) -> None:
        self._client = client
        self._channel = channel
        self._caches = caches
        self._interval = health_check_interval_s
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()
        self.reconnects = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="l1-invalidations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        mark(self._caches, healthy=False)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(timeout=self._interval)
                    if message is None:
                        await pubsub.ping()
                        continue
                    if apply_message(message, self._caches):
                        self.subscribed.set()
                        backoff = 0.05
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            finally:
                self.subscribed.clear()
                mark(self._caches, healthy=False)
                with contextlib.suppress(redis.RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


class ThreadedInvalidationListener:
    """The same for synchronous applications: a daemon thread with a blocking Pub/Sub connection (on a
    ``RedisCluster`` too)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, channel: str, caches: list[L1Cache]) -> None:
        self._client = client
        self._channel = channel
        self._caches = caches
        self._stop = threading.Event()
        self.subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="l1-invalidations", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        mark(self._caches, healthy=False)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            pubsub = self._client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self._channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        pubsub.ping()
                        continue
                    if apply_message(message, self._caches):
                        self.subscribed.set()
                        backoff = 0.05
            except (redis.RedisError, OSError) as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            finally:
                self.subscribed.clear()
                mark(self._caches, healthy=False)
                pubsub.close()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)
