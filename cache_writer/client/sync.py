"""The blocking application client: carries out :class:`~cache_writer.client.core.ClientCore`'s steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from cache_writer.client.core import ClientCore, FillResult, Hit, Lease, Loaded, Miss, Op, Steps
from cache_writer.redis.pipeline import SyncRedisClient, run_pipeline_sync
from cache_writer.redis.replies import raise_errors
from cache_writer.steps import StepRunner
from schemas.events import KeyValue

T = TypeVar("T")
SyncLoader = Callable[[], Loaded]


class SyncCacheClient(ClientCore[SyncRedisClient, redis.Redis]):
    """The same protocol for synchronous applications, over redis-py's blocking ``Redis`` or
    ``RedisCluster`` (cluster redirects followed as by the asyncio client)."""

    def get(self, namespace: str, key_values: Sequence[KeyValue]) -> Hit | Miss:
        """See :meth:`ClientCore.get_steps`."""
        return self._run(self.get_steps(namespace, key_values))

    def fill(
        self, lease: Lease, value: bytes, version: int | None = None, row: Sequence[KeyValue] | None = None
    ) -> FillResult:
        """See :meth:`ClientCore.fill_steps`."""
        return self._run(self.fill_steps(lease, value, version, row))

    def get_or_load(
        self,
        namespace: str,
        key_values: Sequence[KeyValue],
        loader: SyncLoader,
        *,
        wait_s: float = 0.01,
        attempts: int = 5,
    ) -> bytes | None:
        """See :meth:`ClientCore.get_or_load_steps`."""
        return self._run(
            self.get_or_load_steps(namespace, key_values, wait_s=wait_s, attempts=attempts), loader
        )

    def _run(self, steps: Steps[T], loader: SyncLoader | None = None) -> T:
        runner = StepRunner(steps)
        op = runner.next(None)
        while op is not None:
            op = runner.next(self._do(op, loader))
        return runner.result

    def _do(self, op: Op, loader: SyncLoader | None) -> Any:
        if op.name == "script":
            command, script = op.args
            return raise_errors(
                run_pipeline_sync(self.redis, [command], scripts=(script,), stats=self.redirects)
            )[0]
        if op.name == "outer" and self.l3 is not None:
            return self.l3.hgetall(op.args[0])
        if op.name == "load" and loader is not None:
            return loader()
        if op.name == "wait":
            time.sleep(op.args[0])
        elif op.name == "flush_hits" and self.hits is not None:
            self.hits.flush_sync(self.redis)
        return None
