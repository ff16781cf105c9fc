"""The application side: read through the tiers, and fill after a miss only under a valid lease.

``get`` reads L1 (in-process) -> L2 (Redis) -> L3 (an optional second Redis); a miss returns a
:class:`Lease` when this caller is the one to fill the key (one holder per key at a time: stampede
protection) or ``lease=None`` when another caller already is (wait briefly, or read through without
filling). ``fill`` lands only if no pipeline write or invalidation touched the key since the lease was
issued (checked atomically in Redis: both remove the lease): the stale-fill race of cache-aside, where
a reader's database read happens before a change and its fill after the change's invalidation, cannot
leave old data behind. ``get_or_load`` wraps the whole dance around a loader.

Schema signatures (invariant 7): ``get`` reads the entry and the namespace's active signature in one
script; an entry built under another signature is a miss (and hands out a lease). The lease carries the
active signature, ``fill`` stamps it on the entry and lands only while it is still the active one.

Hotness: with ``hits=`` (a :class:`~cache_writer.hotness.HitRecorder`), every hit is counted by entry
key and the counts are flushed to Redis for the pipeline's prewarm (``cache_writer.hotness``).

:class:`CacheClient` is for asyncio applications, :class:`SyncCacheClient` for the rest; both speak the
Redis layout in the README.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
import redis.asyncio as aioredis

from cache_writer.hotness import HitRecorder
from cache_writer.keys import entry_key, signature_key_of
from cache_writer.l1 import L1Cache
from cache_writer.redis_cluster import RedisClient, run_pipeline
from cache_writer.redis_tier import _script
from schemas import row_key
from schemas.events import KeyValue

GET_OR_LEASE_SCRIPT, GET_OR_LEASE_SHA = _script("get_or_lease.lua")
FILL_SCRIPT, FILL_SHA = _script("fill_with_lease.lua")


@dataclass(frozen=True, slots=True)
class Hit:
    value: bytes
    version: int
    tier: str
    signature: str = ""
    """The signature the entry was built under (the namespace's active one when read; '' none)."""


@dataclass(frozen=True, slots=True)
class Lease:
    key: str
    token: str
    held_version: int | None
    """The version the key held when the lease was issued (a tombstone's), None when absent."""
    signature: str = ""
    """The namespace's active signature when the lease was issued: the fill is made under it."""
    outer_fenced: bool = False
    """An outer tier (L3) is fenced by the pipeline: it may hold stale entries, do not read it."""


@dataclass(frozen=True, slots=True)
class Miss:
    key: str
    lease: Lease | None
    """None: another caller holds the lease for this key."""


class FillResult(StrEnum):
    FILLED = "filled"
    LEASE_VOID = "lease-void"
    """A write or invalidation reached the key after the lease was issued, or the lease expired."""
    STALE = "stale"
    """The key already holds a newer version than the row that was read."""
    SIGNATURE = "signature"
    """The namespace's signature changed since the lease was issued (a model cutover): the value was
    built under the old one and is not stored."""


Loaded = tuple[bytes, int | None] | None
"""What a loader returns: (value JSON, row version or None) or None when the row does not exist."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode_get(key: str, reply: Sequence[Any]) -> Hit | Miss:
    status = int(reply[0])
    signature = _text(reply[3]) if len(reply) > 3 else ""
    if status == 1:
        return Hit(bytes(reply[2]), int(reply[1]), "l2", signature)
    held = int(reply[2]) if reply[2] not in (b"", "") else None
    if status == 0:
        fenced = len(reply) > 4 and _text(reply[4]) != ""
        return Miss(key, Lease(key, _text(reply[1]), held, signature, outer_fenced=fenced))
    return Miss(key, None)


def _decode_fill(reply: Sequence[Any]) -> FillResult:
    if int(reply[0]) == 1:
        return FillResult.FILLED
    reason = _text(reply[1])
    if reason == "signature":
        return FillResult.SIGNATURE
    return FillResult.STALE if reason == "stale" else FillResult.LEASE_VOID


def _l3_entry(fields: dict[bytes, bytes], signature: str) -> tuple[int, bytes] | None:
    """A live L3 entry built under ``signature`` (the active one in L2), else None."""
    if b"v" in fields and b"d" in fields and b"tomb" not in fields:
        if fields.get(b"s", b"").decode() != signature:
            return None
        return int(fields[b"v"]), fields[b"d"]
    return None


class _Base:
    def __init__(
        self,
        *,
        prefix: str,
        l1: L1Cache | None,
        lease_ttl_ms: int,
        entry_ttl_ms: int | None,
        hits: HitRecorder | None = None,
    ) -> None:
        if lease_ttl_ms <= 0:
            raise ValueError("lease_ttl_ms must be positive")
        self.prefix = prefix
        self.l1 = l1
        self.lease_ttl_ms = lease_ttl_ms
        self._entry_ttl = str(entry_ttl_ms or 0)
        self.counts: Counter[str] = Counter()
        self.hits = hits

    def key(self, namespace: str, key_values: Sequence[KeyValue]) -> str:
        return entry_key(self.prefix, namespace, key_values)

    def _from_l1(self, key: str) -> Hit | None:
        if self.l1 is None:
            return None
        entry = self.l1.get(key)
        if entry is None:
            return None
        return Hit(entry.value, entry.version, "l1", entry.signature)

    def _count(self, key: str, result: Hit | Miss) -> None:
        self.counts["reads"] += 1
        if isinstance(result, Hit):
            self.counts[f"hits_{result.tier}"] += 1
            if self.hits is not None:
                self.hits.record(key)
        else:
            self.counts["misses"] += 1
            self.counts["leases" if result.lease else "lease_waits"] += 1

    def _fill_args(
        self, lease: Lease, value: bytes, version: int | None, row: Sequence[KeyValue] | None
    ) -> list[Any]:
        return [
            lease.token,
            value,
            "" if version is None else str(version),
            self._entry_ttl,
            lease.signature,
            row_key(row) if row is not None else "",
        ]

    def _keep_in_l1(self, lease: Lease, value: bytes, version: int | None) -> None:
        if self.l1 is not None:
            # The version a fill lands with is the row's, or the one the key held (tombstone) or 0.
            landed = version if version is not None else (lease.held_version or 0)
            self.l1.put(lease.key, landed, value, lease.signature)


class CacheClient(_Base):
    """asyncio client. ``l3`` is an optional outer Redis read on an L2 miss (and used to fill L2)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "fk",
        l1: L1Cache | None = None,
        l3: aioredis.Redis | None = None,
        lease_ttl_ms: int = 2_000,
        entry_ttl_ms: int | None = None,
        hits: HitRecorder | None = None,
    ) -> None:
        super().__init__(
            prefix=prefix, l1=l1, lease_ttl_ms=lease_ttl_ms, entry_ttl_ms=entry_ttl_ms, hits=hits
        )
        self.redis = client
        self.l3 = l3

    async def _evalsha(self, sha: str, script: str, key: str, *args: Any) -> Any:
        keys = (key, signature_key_of(key))
        if isinstance(self.redis, aioredis.RedisCluster):
            # redis-py's own ASK handling breaks under concurrency during a slot migration;
            # run_pipeline follows MOVED/ASK itself and reloads scripts on the node that lacks them.
            (reply,) = await run_pipeline(self.redis, [("EVALSHA", sha, 2, *keys, *args)], scripts=(script,))
            if isinstance(reply, Exception):
                raise reply
            return reply
        try:
            return await self.redis.evalsha(sha, 2, *keys, *args)
        except redis.exceptions.NoScriptError:
            await self.redis.script_load(script)
            return await self.redis.evalsha(sha, 2, *keys, *args)

    async def get(self, namespace: str, key_values: Sequence[KeyValue]) -> Hit | Miss:
        """The entry from L1, L2 (then L3), or a miss with or without a lease.

        An L2 entry is a hit only when it was built under the namespace's active signature.
        """
        key = self.key(namespace, key_values)
        result = self._from_l1(key) or await self._get_l2(key)
        self._count(key, result)
        if self.hits is not None and self.hits.due():
            await self.hits.flush(self.redis)
        return result

    async def _get_l2(self, key: str) -> Hit | Miss:
        reply = await self._evalsha(
            GET_OR_LEASE_SHA, GET_OR_LEASE_SCRIPT, key, secrets.token_hex(8), self.lease_ttl_ms
        )
        result = _decode_get(key, reply)
        if isinstance(result, Hit):
            if self.l1 is not None:
                self.l1.put(key, result.version, result.value, result.signature)
            return result
        if self.l3 is not None and result.lease is not None and not result.lease.outer_fenced:
            fields = await self.l3.hgetall(key)
            outer = _l3_entry(fields, result.lease.signature)  # type: ignore[arg-type]
            if outer is not None and await self.fill(result.lease, outer[1], outer[0]) is FillResult.FILLED:
                return Hit(outer[1], outer[0], "l3", result.lease.signature)
        return result

    async def fill(
        self,
        lease: Lease,
        value: bytes,
        version: int | None = None,
        row: Sequence[KeyValue] | None = None,
    ) -> FillResult:
        """Fill after a miss. ``version``: the row's version when the binding has a version column;
        ``row``: the row's key column values (recorded in the entry, so a prewarm can reload it)."""
        outcome = _decode_fill(
            await self._evalsha(
                FILL_SHA, FILL_SCRIPT, lease.key, *self._fill_args(lease, value, version, row)
            )
        )
        self.counts[f"fill_{outcome.value}"] += 1
        if outcome is FillResult.FILLED:
            self._keep_in_l1(lease, value, version)
        return outcome

    async def get_or_load(
        self,
        namespace: str,
        key_values: Sequence[KeyValue],
        loader: Callable[[], Awaitable[Loaded]],
        *,
        wait_s: float = 0.01,
        attempts: int = 5,
    ) -> bytes | None:
        """The value from the cache, else from ``loader`` (filled under a lease when this caller holds it).

        When another caller holds the lease, wait ``wait_s`` and look again, up to ``attempts`` times,
        then read through (load without filling).
        """
        for _ in range(attempts):
            result = await self.get(namespace, key_values)
            if isinstance(result, Hit):
                return result.value
            if result.lease is not None:
                loaded = await loader()
                if loaded is None:
                    return None
                await self.fill(result.lease, loaded[0], loaded[1])
                return loaded[0]
            await asyncio.sleep(wait_s)
        self.counts["read_through"] += 1
        loaded = await loader()
        return None if loaded is None else loaded[0]


class SyncCacheClient(_Base):
    """The same protocol for synchronous applications (redis-py's blocking client)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "fk",
        l1: L1Cache | None = None,
        l3: redis.Redis | None = None,
        lease_ttl_ms: int = 2_000,
        entry_ttl_ms: int | None = None,
        hits: HitRecorder | None = None,
    ) -> None:
        super().__init__(
            prefix=prefix, l1=l1, lease_ttl_ms=lease_ttl_ms, entry_ttl_ms=entry_ttl_ms, hits=hits
        )
        self.redis = client
        self.l3 = l3

    def _evalsha(self, sha: str, script: str, key: str, *args: Any) -> Any:
        keys = (key, signature_key_of(key))
        try:
            return self.redis.evalsha(sha, 2, *keys, *args)
        except redis.exceptions.NoScriptError:
            self.redis.script_load(script)
            return self.redis.evalsha(sha, 2, *keys, *args)

    def get(self, namespace: str, key_values: Sequence[KeyValue]) -> Hit | Miss:
        key = self.key(namespace, key_values)
        result = self._from_l1(key) or self._get_l2(key)
        self._count(key, result)
        if self.hits is not None and self.hits.due():
            self.hits.flush_sync(self.redis)
        return result

    def _get_l2(self, key: str) -> Hit | Miss:
        reply = self._evalsha(
            GET_OR_LEASE_SHA, GET_OR_LEASE_SCRIPT, key, secrets.token_hex(8), self.lease_ttl_ms
        )
        result = _decode_get(key, reply)
        if isinstance(result, Hit):
            if self.l1 is not None:
                self.l1.put(key, result.version, result.value, result.signature)
            return result
        if self.l3 is not None and result.lease is not None and not result.lease.outer_fenced:
            outer = _l3_entry(self.l3.hgetall(key), result.lease.signature)  # type: ignore[arg-type]
            if outer is not None and self.fill(result.lease, outer[1], outer[0]) is FillResult.FILLED:
                return Hit(outer[1], outer[0], "l3", result.lease.signature)
        return result

    def fill(
        self,
        lease: Lease,
        value: bytes,
        version: int | None = None,
        row: Sequence[KeyValue] | None = None,
    ) -> FillResult:
        outcome = _decode_fill(
            self._evalsha(FILL_SHA, FILL_SCRIPT, lease.key, *self._fill_args(lease, value, version, row))
        )
        self.counts[f"fill_{outcome.value}"] += 1
        if outcome is FillResult.FILLED:
            self._keep_in_l1(lease, value, version)
        return outcome

    def get_or_load(
        self,
        namespace: str,
        key_values: Sequence[KeyValue],
        loader: Callable[[], Loaded],
        *,
        wait_s: float = 0.01,
        attempts: int = 5,
    ) -> bytes | None:
        for _ in range(attempts):
            result = self.get(namespace, key_values)
            if isinstance(result, Hit):
                return result.value
            if result.lease is not None:
                loaded = loader()
                if loaded is None:
                    return None
                self.fill(result.lease, loaded[0], loaded[1])
                return loaded[0]
            time.sleep(wait_s)
        self.counts["read_through"] += 1
        loaded = loader()
        return None if loaded is None else loaded[0]
