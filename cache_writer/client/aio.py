"""The asyncio application client (see cache_writer.client)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from cache_writer.client.core import (
    ClientBase,
    FillResult,
    Hit,
    Lease,
    Loaded,
    Miss,
    _decode_fill,
    _decode_get,
    _l3_entry,
)
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.layout import signature_key_of
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from schemas.events import KeyValue


class CacheClient(ClientBase):
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
            scripts.GET_OR_LEASE.sha, scripts.GET_OR_LEASE.text, key, secrets.token_hex(8), self.lease_ttl_ms
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
                scripts.FILL.sha, scripts.FILL.text, lease.key, *self._fill_args(lease, value, version, row)
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
