"""L1: an in-process cache tier, bounded by entries and bytes, with a TTL, kept honest by broadcasts.

Every write and tombstone the pipeline applies to Redis is announced on ``<prefix>:invalidations`` in
the same atomic script (``w|i <version> <key>``). :class:`InvalidationListener` feeds those messages to
:meth:`L1Cache.on_broadcast`, which drops entries that are not newer and raises a per-key *floor*: a
later :meth:`L1Cache.put` of an older version (a reader that read Redis before the change and puts after
the broadcast) is refused. If the broadcast connection drops, the L1 is flushed and serves nothing until
it is subscribed again (invariant 9: when it cannot vouch for its entries, it does not serve them).

A model cutover is announced on the same channel as ``a <signature> <prefix>:{<namespace>}:`` by the
script that switches the namespace's signature (``set_signature.lua``): :meth:`L1Cache.on_signature`
drops the namespace's entries and remembers the signature, and a later :meth:`L1Cache.put` of an entry
read under another signature (a reader that read Redis before the switch) is refused (invariant 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from cachetools import TTLCache

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class L1Entry:
    version: int
    value: bytes
    signature: str = ""


class L1Cache:
    """Thread-safe. ``max_entries`` and ``max_bytes`` both bound it: an entry is charged
    ``max(len(value) + 64, max_bytes // max_entries)`` against ``max_bytes``."""

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        ttl_s: float = 300.0,
        floor_ttl_s: float = 60.0,
        max_floors: int = 1_000_000,
    ) -> None:
        if max_entries < 1 or max_bytes < max_entries:
            raise ValueError("need max_entries >= 1 and max_bytes >= max_entries")
        self._min_charge = max_bytes // max_entries
        self._entries: TTLCache[str, L1Entry] = TTLCache(maxsize=max_bytes, ttl=ttl_s, getsizeof=self._charge)
        self._floors: TTLCache[str, int] = TTLCache(maxsize=max_floors, ttl=floor_ttl_s)
        self._signatures: dict[str, str] = {}
        self._lock = threading.Lock()
        self._healthy = False
        self.flushes = 0

    def _charge(self, entry: L1Entry) -> int:
        return max(len(entry.value) + 64, self._min_charge)

    @property
    def healthy(self) -> bool:
        """True while subscribed to the broadcast; an unhealthy L1 answers every get with a miss."""
        return self._healthy

    def get(self, key: str) -> L1Entry | None:
        if not self._healthy:
            return None
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, version: int, value: bytes, signature: str = "") -> bool:
        """Keep ``value`` unless an equal-or-newer entry is there or a broadcast made it stale.

        ``signature``: the one the entry was read under; refused when a cutover announced another one
        for its namespace since this cache was last flushed.
        """
        if not self._healthy:
            return False
        with self._lock:
            if version < self._floors.get(key, 0):
                return False
            announced = self._signatures.get(_namespace_of(key))
            if announced is not None and announced != signature:
                return False
            current = self._entries.get(key)
            if current is not None and current.version >= version:
                return False
            try:
                self._entries[key] = L1Entry(version, value, signature)
            except ValueError:  # larger than the whole cache
                return False
            return True

    def on_broadcast(self, kind: str, version: int, key: str) -> None:
        """A write (``w``) of ``version``: older entries go. A tombstone (``i``): entries up to it go."""
        floor = version + 1 if kind == "i" else version
        with self._lock:
            if floor > self._floors.get(key, 0):
                self._floors[key] = floor
            current = self._entries.get(key)
            if current is not None and current.version < floor:
                del self._entries[key]

    def on_signature(self, namespace_prefix: str, signature: str) -> None:
        """A cutover: ``namespace_prefix`` (``<prefix>:{<namespace>}:``) now has ``signature``; its
        entries go, and only entries read under that signature may come in again."""
        with self._lock:
            self._signatures[namespace_prefix] = signature
            for key in [k for k in self._entries if k.startswith(namespace_prefix)]:
                del self._entries[key]

    def flush(self) -> None:
        with self._lock:
            self._entries.clear()
            self._signatures.clear()  # unknown again: the next read tells (entries are gone anyway)
            self.flushes += 1

    def mark(self, healthy: bool) -> None:
        """Called by the listener: flushing on every change of state, since messages may be missed."""
        self.flush()
        self._healthy = healthy

    def items(self) -> list[tuple[str, L1Entry]]:
        """A snapshot of the live entries (for verification)."""
        with self._lock:
            return list(self._entries.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _namespace_of(key: str) -> str:
    end = key.find("}:")
    return key[: end + 2] if end >= 0 else ""


def parse_signature_broadcast(message: bytes | str) -> tuple[str, str] | None:
    """``a <signature> <namespace prefix>`` -> (namespace prefix, signature); None for other messages."""
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split(" ", 2)
    if len(parts) != 3 or parts[0] != "a" or not parts[2].endswith("}:"):
        return None
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


def parse_broadcast(message: bytes | str) -> tuple[str, int, str] | None:
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split(" ", 2)
    if len(parts) != 3 or parts[0] not in ("w", "i") or not parts[1].isdecimal():
        return None
    return parts[0], int(parts[1]), parts[2]


class InvalidationListener:
    """Subscribes to the invalidation channel and keeps one or more L1 caches in step (asyncio).

    On any connection error the caches are flushed and marked unhealthy, and the listener reconnects
    with backoff; after it is subscribed again they are flushed once more and serve again.
    """

    def __init__(
        self,
        client: aioredis.Redis,
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
        for cache in self._caches:
            cache.mark(False)

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
                    if message["type"] == "subscribe":
                        for cache in self._caches:
                            cache.mark(True)
                        self.subscribed.set()
                        backoff = 0.05
                    elif message["type"] == "message":
                        dispatch_broadcast(message["data"], self._caches)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            finally:
                self.subscribed.clear()
                for cache in self._caches:
                    cache.mark(False)
                with contextlib.suppress(redis.RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


class ThreadedInvalidationListener:
    """The same for synchronous applications: a daemon thread with a blocking Pub/Sub connection."""

    def __init__(self, client: redis.Redis, channel: str, caches: list[L1Cache]) -> None:
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
        for cache in self._caches:
            cache.mark(False)

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
                    if message["type"] == "subscribe":
                        for cache in self._caches:
                            cache.mark(True)
                        self.subscribed.set()
                        backoff = 0.05
                    elif message["type"] == "message":
                        dispatch_broadcast(message["data"], self._caches)
            except (redis.RedisError, OSError) as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            finally:
                self.subscribed.clear()
                for cache in self._caches:
                    cache.mark(False)
                pubsub.close()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)
