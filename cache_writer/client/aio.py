"""The asyncio application client: carries out :class:`~cache_writer.client.core.ClientCore`'s steps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis

from cache_writer.client.core import ClientCore, FillResult, Hit, Lease, Loaded, Miss, Op, Steps
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from cache_writer.redis.replies import raise_errors
from schemas.events import KeyValue

T = TypeVar("T")
AsyncLoader = Callable[[], Awaitable[Loaded]]


class CacheClient(ClientCore):
    """asyncio client over one Redis or a Redis Cluster (``client``). ``l3`` is an optional outer Redis
    read on an L2 miss (and used to fill L2)."""

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
            prefix=prefix,
            l1=l1,
            lease_ttl_ms=lease_ttl_ms,
            entry_ttl_ms=entry_ttl_ms,
            hits=hits,
            has_l3=l3 is not None,
        )
        self.redis = client
        self.l3 = l3

    async def get(self, namespace: str, key_values: Sequence[KeyValue]) -> Hit | Miss:
        """See :meth:`ClientCore.get_steps`."""
        return await self._run(self.get_steps(namespace, key_values))

    async def fill(
        self, lease: Lease, value: bytes, version: int | None = None, row: Sequence[KeyValue] | None = None
    ) -> FillResult:
        """See :meth:`ClientCore.fill_steps`."""
        return await self._run(self.fill_steps(lease, value, version, row))

    async def get_or_load(
        self,
        namespace: str,
        key_values: Sequence[KeyValue],
        loader: AsyncLoader,
        *,
        wait_s: float = 0.01,
        attempts: int = 5,
    ) -> bytes | None:
        """See :meth:`ClientCore.get_or_load_steps`."""
        return await self._run(
            self.get_or_load_steps(namespace, key_values, wait_s=wait_s, attempts=attempts), loader
        )

    async def _run(self, steps: Steps[T], loader: AsyncLoader | None = None) -> T:
        reply: Any = None  # a fresh generator takes None first
        while True:
            try:
                op = steps.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = await self._do(op, loader)

    async def _do(self, op: Op, loader: AsyncLoader | None) -> Any:
        if op.name == "script":
            command, script = op.args
            return raise_errors(
                await run_pipeline(self.redis, [command], scripts=(script,), stats=self.redirects)
            )[0]
        if op.name == "outer" and self.l3 is not None:
            return await self.l3.hgetall(op.args[0])
        if op.name == "load" and loader is not None:
            return await loader()
        if op.name == "wait":
            await asyncio.sleep(op.args[0])
        elif op.name == "flush_hits" and self.hits is not None:
            await self.hits.flush(self.redis)
        return None
