"""Concurrent application readers for ``freshkey demo --race``: get -> miss -> read the DB -> fill.

Each reader picks a hot row, reads it through the tiers (an in-process L1 fed by the invalidation
broadcast, then Redis), and on a miss reads the row from the database, waits a random delay (the window
in which a change can slip in) and fills. With leases the fill goes through
:meth:`cache_writer.client.CacheClient.fill`; with ``leases=False`` it is the plain cache-aside "set
after read" (an unconditional HSET), the race freshkey exists to close.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors
import redis.asyncio as aioredis

from cache_writer.client import CacheClient, FillResult, Hit
from cache_writer.l1 import InvalidationListener, L1Cache
from cache_writer.layout import invalidation_channel
from schemas import Binding, column_version, encode_value, row_to_json


@dataclass(frozen=True)
class RaceConfig:
    readers: int = 8
    hot_rows: int = 20
    max_delay_ms: float = 150.0
    """Longest pause between reading the row and filling (GC pauses, slow networks, busy loops)."""
    think_ms: float = 1.0
    """Pause between two reads of one reader (an application does other work between reads)."""
    leases: bool = True
    seed: int = 11


class RaceReaders:
    """Runs the readers on their own event loop in a background thread until :meth:`stop`."""

    def __init__(
        self,
        config: RaceConfig,
        *,
        redis_url: str,
        prefix: str,
        binding: Binding,
        connect_db: Callable[[], Any],
    ) -> None:
        self.config = config
        self.redis_url = redis_url
        self.prefix = prefix
        self.binding = binding
        self.connect_db = connect_db
        self.counts: Counter[str] = Counter()
        self.l1 = L1Cache(max_entries=10_000, max_bytes=64 * 1024 * 1024, ttl_s=600)
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._readers_done = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="race-readers", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"race readers not ready: {self._error!r}")

    def pause(self, timeout_s: float = 30.0) -> None:
        """Stop the readers but keep the L1 listening to broadcasts (so it can be verified live)."""
        self._paused.set()
        if not self._readers_done.wait(timeout_s):
            raise RuntimeError("race readers did not stop")
        if self._error is not None:
            raise RuntimeError(f"a race reader failed: {self._error!r}") from self._error

    def stop(self) -> None:
        """Stop the readers (idempotent); raises if one of them failed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._error is not None:
            raise RuntimeError(f"a race reader failed: {self._error!r}") from self._error

    def summary(self) -> dict[str, int]:
        return {
            "readers": self.config.readers,
            "reads": self.counts["reads"],
            "fills": self.counts["fills"],
            "fills_rejected": self.counts["fills_rejected"],
            "lease_waits": self.counts["lease_waits"],
            "l1_hits": self.counts["hits_l1"],
        }

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            self._readers_done.set()

    async def _run(self) -> None:
        client = aioredis.Redis.from_url(self.redis_url)
        listener = InvalidationListener(
            aioredis.Redis.from_url(self.redis_url), invalidation_channel(self.prefix), [self.l1]
        )
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 10)
        cache = CacheClient(client, prefix=self.prefix, l1=self.l1, lease_ttl_ms=2_000)
        try:
            tasks = [asyncio.create_task(self._reader(cache, i)) for i in range(self.config.readers)]
            self._ready.set()
            while not (self._stop.is_set() or self._paused.is_set()):
                await asyncio.sleep(0.05)
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            # The readers finish their current read and stop by themselves: cancelling one in the
            # middle of a database read or a Redis transaction would leave its connection unusable.
            await asyncio.gather(*tasks, return_exceptions=True)
            self._readers_done.set()
            await asyncio.to_thread(self._stop.wait)
        finally:
            self.counts.update({k: v for k, v in cache.counts.items() if k.startswith("hits_")})
            await listener.stop()
            await client.aclose()

    def _load(self, conn: Any, row_id: int) -> tuple[bytes, int] | None:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(
                f"SELECT * FROM `{self.binding.database}`.`{self.binding.table_name}` WHERE id = %s",
                (row_id,),
            )
            row = cur.fetchone()
        if row is None:
            return None
        data = row_to_json(row)
        projected = (
            data if self.binding.value_columns is None else {c: data[c] for c in self.binding.value_columns}
        )
        version = column_version(data[self.binding.version_column]) if self.binding.version_column else 0
        return encode_value(projected), version

    async def _reader(self, cache: CacheClient, index: int) -> None:
        rng = random.Random(self.config.seed * 1000 + index)
        conn = await asyncio.to_thread(self.connect_db)
        try:
            while not (self._paused.is_set() or self._stop.is_set()):
                row_id = rng.randrange(self.config.hot_rows)
                await asyncio.sleep(rng.uniform(0, 2 * self.config.think_ms) / 1000)
                result = await cache.get(self.binding.namespace, [row_id])
                self.counts["reads"] += 1
                if isinstance(result, Hit):
                    continue
                if result.lease is None and self.config.leases:
                    self.counts["lease_waits"] += 1
                    await asyncio.sleep(0.001)
                    continue
                loaded = await asyncio.to_thread(self._load, conn, row_id)
                await asyncio.sleep(rng.uniform(0, self.config.max_delay_ms) / 1000)
                if loaded is None:
                    continue
                value, version = loaded
                if self.config.leases:
                    assert result.lease is not None
                    outcome = await cache.fill(result.lease, value, version)
                    self.counts["fills" if outcome is FillResult.FILLED else "fills_rejected"] += 1
                else:
                    await self._plain_fill(cache, result.key, value, version)
                    self.counts["fills"] += 1
        finally:
            await asyncio.to_thread(conn.close)

    async def _plain_fill(self, cache: CacheClient, key: str, value: bytes, version: int) -> None:
        """Protection off: what cache-aside without leases does after a miss."""
        async with cache.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"v": version, "d": value})
            pipe.hdel(key, "tomb", "l", "le")
            pipe.persist(key)
            await pipe.execute()
        self.l1.put(key, version, value)
