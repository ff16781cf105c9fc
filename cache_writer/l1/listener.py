"""Keeping L1 caches honest: the broadcast of every applied change, and the listeners that apply it.

On a Redis Cluster a listener subscribes on **every primary that serves slots**, not on one node. A
script's PUBLISH reaches the subscribers of its own node directly and every other node over the cluster
bus, and the bus is not reliable: when a node stalls for more than half ``cluster-node-timeout`` its
peers drop their bus links to it and whatever those links had buffered is lost, with no error to any
subscriber (a node stopped for 1.8 s with a 2 s node timeout: its subscribers missed 18 of 1,370
messages published on another node; ``tests/integration/test_cluster_pubsub_loss.py``). Subscribed on
every primary, a listener hears each announcement from the node whose script made it, so a lost bus
link costs a duplicate, not an invalidation. Duplicates are harmless: write and tombstone floors only
rise, and a signature announcement already seen in this subscription is not applied twice (a late
copy of an older switch would otherwise re-announce the old signature). The set of primaries is
checked every ``topology_check_s``: when it changes (a failover, a master that got its first slot) the
caches are flushed and stop serving until the listener is subscribed on every primary again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from cache_writer.l1.cache import L1Cache
from cache_writer.layout import parse_entry_key

log = logging.getLogger(__name__)

STOP_WAIT_S = 5.0
"""Longest :meth:`InvalidationListener.stop` waits for the cancelled listener (the threaded one joins
as long)."""


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


LISTEN_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
"""What ends a subscription and is retried with backoff: a connection or server error, or a cluster
client that cannot reach any node to learn the slots (not a RedisError in redis-py)."""


class TopologyChanged(Exception):
    """The cluster's primaries are not those the listener is subscribed on."""


def cluster_primaries(nodes: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """``host:port`` of every primary that serves slots, from a parsed ``CLUSTER NODES`` (redis-py's
    ``cluster_nodes()``): the nodes whose scripts may publish. A primary only suspected of failing
    (``fail?``) stays in: its subscription fails, if it is down, and the caches are flushed."""
    primaries = set()
    for name, node in nodes.items():
        flags = set(str(node.get("flags", "")).split(","))
        if "master" in flags and not flags & {"fail", "handshake", "noaddr"} and node.get("slots"):
            primaries.add(name)
    return frozenset(primaries)


class _Subscription:
    """One generation of a listener's subscriptions (one per primary, or one on a plain client): the
    caches serve once every subscription is confirmed; a signature announcement is applied once."""

    def __init__(self, caches: list[L1Cache], expected: int) -> None:
        self.caches = caches
        self.expected = expected
        self.confirmed: set[int] = set()
        self.announced: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def on_message(self, index: int, message: dict[str, Any]) -> bool:
        """Apply one Pub/Sub message of subscription ``index``; True when it was the last confirmation
        needed (the caches were flushed and serve from now on)."""
        kind = message["type"]
        if kind == "message":
            data = message["data"]
            parsed = parse_broadcast(data)
            if parsed is not None:
                for cache in self.caches:
                    cache.on_broadcast(*parsed)
                return False
            cutover = parse_signature_broadcast(data)
            if cutover is not None:
                with self.lock:
                    if cutover in self.announced:
                        return False  # the same switch heard again through another primary
                    self.announced.add(cutover)
                for cache in self.caches:
                    cache.on_signature(*cutover)
            return False
        if kind == "subscribe":
            with self.lock:
                if index in self.confirmed:
                    return False
                self.confirmed.add(index)
                if len(self.confirmed) < self.expected:
                    return False
                mark(self.caches, healthy=True)
                return True
        return False


def _resolve(client: Any, names: frozenset[str]) -> list[Any]:
    nodes = [client.get_node(node_name=name) for name in sorted(names)]
    missing = [name for name, node in zip(sorted(names), nodes, strict=True) if node is None]
    if missing:
        raise TopologyChanged(f"primaries {', '.join(missing)} are not in the client's slot map yet")
    return nodes


class InvalidationListener:
    """Subscribes to the invalidation channel and keeps one or more L1 caches in step (asyncio).

    ``client`` may be a ``RedisCluster``: the listener then subscribes on every primary (module
    docstring). On any connection error the caches are flushed and marked unhealthy, and the listener
    reconnects with backoff; once subscribed again (everywhere) they are flushed once more and serve.
    """

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        channel: str,
        caches: list[L1Cache],
        *,
        health_check_interval_s: float = 1.0,
        topology_check_s: float = 1.0,
    ) -> None:
        self._client = client
        self._channel = channel
        self._caches = caches
        self._interval = health_check_interval_s
        self._topology_s = topology_check_s
        self._task: asyncio.Task[None] | None = None
        self._backoff = 0.05
        self.subscribed = asyncio.Event()
        self.reconnects = 0
        self.primaries: frozenset[str] = frozenset()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="l1-invalidations")

    async def stop(self) -> None:
        """Cancel the listener and wait for it, at most :data:`STOP_WAIT_S` (as the threaded listener's
        join): a Redis call that does not give way to the cancel (a connection to a node that went
        silent) must not hold up the application's shutdown. The caches stop serving either way."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=STOP_WAIT_S)
            if not done:
                log.warning(
                    "the L1 invalidation listener did not stop within %.0f s of its cancel (a Redis call "
                    "that ignores it); left to end on its own",
                    STOP_WAIT_S,
                )
            elif not task.cancelled() and task.exception() is not None:
                log.warning("the L1 invalidation listener ended with %r", task.exception())
        mark(self._caches, healthy=False)

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except LISTEN_ERRORS as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            except TopologyChanged as exc:
                log.warning("%s: L1 flushed until subscribed on every primary", exc)
            finally:
                self.subscribed.clear()
                mark(self._caches, healthy=False)
            self.reconnects += 1
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, 2.0)

    async def _cluster_primaries(self, client: aioredis.RedisCluster) -> frozenset[str]:
        return cluster_primaries(await client.cluster_nodes())

    async def _listen(self) -> None:
        client = self._client
        tasks: list[asyncio.Task[None]] = []
        pubsubs: list[Any]
        if isinstance(client, aioredis.RedisCluster):
            primaries = await self._cluster_primaries(client)
            try:
                nodes = _resolve(client, primaries)
            except TopologyChanged:
                await client.nodes_manager.initialize()
                nodes = _resolve(client, primaries)
            pubsubs = [client.pubsub(node=node) for node in nodes]
            self.primaries = primaries
        else:
            pubsubs = [client.pubsub()]
        subscription = _Subscription(self._caches, len(pubsubs))
        try:
            for pubsub in pubsubs:
                await pubsub.subscribe(self._channel)
            if isinstance(client, aioredis.RedisCluster):
                tasks.append(asyncio.create_task(self._watch(client, self.primaries)))
            tasks += [asyncio.create_task(self._read(p, i, subscription)) for i, p in enumerate(pubsubs)]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                task.result()
        finally:
            for pubsub in pubsubs:
                with contextlib.suppress(redis.RedisError, OSError):
                    await pubsub.aclose()

    async def _read(self, pubsub: Any, index: int, subscription: _Subscription) -> None:
        while True:
            message = await pubsub.get_message(timeout=self._interval)
            if message is None:
                await pubsub.ping()
                continue
            if subscription.on_message(index, message):
                self.subscribed.set()
                self._backoff = 0.05

    async def _watch(self, client: aioredis.RedisCluster, primaries: frozenset[str]) -> None:
        while True:
            await asyncio.sleep(self._topology_s)
            now = await self._cluster_primaries(client)
            if now != primaries:
                raise TopologyChanged(_change(primaries, now))


def _change(before: frozenset[str], now: frozenset[str]) -> str:
    parts = [f"+{name}" for name in sorted(now - before)] + [f"-{name}" for name in sorted(before - now)]
    return f"cluster primaries changed ({' '.join(parts)})"


class ThreadedInvalidationListener:
    """The same for synchronous applications: daemon threads with blocking Pub/Sub connections, one per
    primary on a ``RedisCluster`` (module docstring)."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        channel: str,
        caches: list[L1Cache],
        *,
        topology_check_s: float = 1.0,
    ) -> None:
        self._client = client
        self._channel = channel
        self._caches = caches
        self._topology_s = topology_check_s
        self._stop = threading.Event()
        self._generation = threading.Event()
        self._backoff = 0.05
        self.subscribed = threading.Event()
        self.reconnects = 0
        self.primaries: frozenset[str] = frozenset()
        self._thread = threading.Thread(target=self._run, name="l1-invalidations", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._generation.set()
        self._thread.join(timeout=5)
        mark(self._caches, healthy=False)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except LISTEN_ERRORS as exc:
                log.warning("invalidation channel lost (%s): L1 flushed until resubscribed", exc)
            except TopologyChanged as exc:
                log.warning("%s: L1 flushed until subscribed on every primary", exc)
            if self._stop.is_set():
                break
            self.reconnects += 1
            self._stop.wait(self._backoff)
            self._backoff = min(self._backoff * 2, 2.0)

    def _listen(self) -> None:
        client = self._client
        generation = self._generation = threading.Event()
        if self._stop.is_set():
            return
        primaries: frozenset[str] | None = None
        if isinstance(client, redis.RedisCluster):
            primaries = cluster_primaries(client.cluster_nodes())
            try:
                nodes = _resolve(client, primaries)
            except TopologyChanged:
                client.nodes_manager.initialize()
                nodes = _resolve(client, primaries)
            pubsubs: list[Any] = [client.pubsub(node=node) for node in nodes]  # type: ignore[no-untyped-call,unused-ignore]
            self.primaries = primaries
        else:
            pubsubs = [client.pubsub()]  # type: ignore[no-untyped-call,unused-ignore]
        subscription = _Subscription(self._caches, len(pubsubs))
        errors: list[BaseException] = []
        readers = [
            threading.Thread(
                target=self._read, args=(p, i, subscription, generation, errors), daemon=True,
                name=f"l1-invalidations-{i}",
            )
            for i, p in enumerate(pubsubs)
        ]  # fmt: skip
        try:
            for reader in readers:
                reader.start()
            while not generation.wait(self._topology_s):
                if primaries is not None:
                    now = cluster_primaries(client.cluster_nodes())  # type: ignore[union-attr]
                    if now != primaries:
                        raise TopologyChanged(_change(primaries, now))
            if errors:
                raise errors[0]
        finally:
            generation.set()
            for reader in readers:
                reader.join(timeout=5)
            self.subscribed.clear()
            mark(self._caches, healthy=False)
            for pubsub in pubsubs:
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()

    def _read(
        self,
        pubsub: Any,
        index: int,
        subscription: _Subscription,
        generation: threading.Event,
        errors: list[BaseException],
    ) -> None:
        try:
            pubsub.subscribe(self._channel)
            while not generation.is_set():
                message = pubsub.get_message(timeout=0.5)
                if message is None:
                    pubsub.ping()
                    continue
                if subscription.on_message(index, message) and not generation.is_set():
                    self.subscribed.set()
                    self._backoff = 0.05
        except LISTEN_ERRORS as exc:
            errors.append(exc)
        finally:
            generation.set()
