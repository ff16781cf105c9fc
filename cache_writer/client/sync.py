"""The blocking application client: carries out :class:`~cache_writer.client.core.ClientCore`'s steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from cache_writer.client.core import ClientCore, FillResult, Hit, Lease, Loaded, Miss, Op, Steps
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.redis.pipeline import SyncRedisClient, run_pipeline_sync
from cache_writer.redis.replies import raise_errors
from schemas.events import KeyValue

T = TypeVar("T")
SyncLoader = Callable[[], Loaded]


class SyncCacheClient(ClientCore):
    """The same protocol for synchronous applications, over redis-py's blocking ``Redis`` or
    ``RedisCluster`` (cluster redirects followed as by the asyncio client)."""

    def __init__(
        self,
        client: SyncRedisClient,
        *,
        prefix: str = "fk",
        l1: L1Cache | None = None,
        l3: redis.Redis | None = None,
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
        reply: Any = None  # a fresh generator takes None first
        while True:
            try:
                op = steps.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = self._do(op, loader)

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
