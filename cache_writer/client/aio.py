"""The asyncio application client: carries out :class:`~cache_writer.client.core.ClientCore`'s steps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis

from cache_writer.client.core import ClientCore, FillResult, Hit, Lease, Loaded, Miss, Op, Steps
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from cache_writer.redis.replies import raise_errors
from cache_writer.steps import StepRunner
from schemas.events import KeyValue

T = TypeVar("T")
AsyncLoader = Callable[[], Awaitable[Loaded]]


class CacheClient(ClientCore[RedisClient, aioredis.Redis]):
    """asyncio client over one Redis or a Redis Cluster (``client``). ``l3`` is an optional outer Redis
    read on an L2 miss (and used to fill L2)."""

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
        runner = StepRunner(steps)
        op = runner.next(None)
        while op is not None:
            op = runner.next(await self._do(op, loader))
        return runner.result

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
