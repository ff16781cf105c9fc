"""Leases against stale fills, L1 kept honest by broadcasts, on a real Redis (invariants 3 and 9)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from cache_writer import CacheAction, RedisTier
from cache_writer.client import CacheClient, FillResult, Hit, Miss, SyncCacheClient
from cache_writer.entries import parse_entry
from cache_writer.l1 import InvalidationListener, L1Cache, ThreadedInvalidationListener
from cache_writer.layout import invalidation_channel

pytestmark = pytest.mark.integration


def run(redis_url: str, body: Callable[..., Awaitable[Any]]) -> Any:
    prefix = f"t{uuid.uuid4().hex[:8]}"

    async def main() -> Any:
        client = aioredis.Redis.from_url(redis_url)
        tier = RedisTier(
            aioredis.Redis.from_url(redis_url), tombstone_ttl_ms=60_000, channel=invalidation_channel(prefix)
        )
        try:
            return await body(CacheClient(client, prefix=prefix, lease_ttl_ms=2_000), tier)
        finally:
            await tier.close()
            await client.aclose()

    return asyncio.run(main())


def W(key: str, version: int, value: bytes) -> CacheAction:
    return CacheAction("write", key, version, 1, value)


def D(key: str, version: int) -> CacheAction:
    return CacheAction("invalidate", key, version, 1)


def test_a_fill_after_a_racing_change_is_refused(redis_url: str) -> None:
    """Reader misses and reads the DB (old row); the change lands; the reader's fill must not.

    The same race without leases (plain cache-aside) is shown leaving stale entries end to end in
    tests/integration/test_race.py."""

    async def body(client: CacheClient, tier: RedisTier) -> None:
        miss = await client.get("ns", [1])
        assert isinstance(miss, Miss) and miss.lease is not None
        await tier.apply([W(miss.key, 7, b'"new"')])  # the pipeline's write of the newer row
        assert await client.fill(miss.lease, b'"old"', None) is FillResult.LEASE_VOID
        hit = await client.get("ns", [1])
        assert isinstance(hit, Hit) and hit.value == b'"new"' and hit.version == 7

        miss2 = await client.get("ns", [2])
        assert isinstance(miss2, Miss) and miss2.lease is not None
        await tier.apply([D(miss2.key, 9)])  # an invalidation voids it too
        assert await client.fill(miss2.lease, b'"old"', None) is FillResult.LEASE_VOID
        entry = parse_entry(miss2.key, await tier.client.hgetall(miss2.key))
        assert entry is not None and entry.tombstone

    run(redis_url, body)


def test_one_lease_holder_at_a_time_and_fills_land_when_nothing_raced(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier) -> None:
        first = await client.get("ns", [5])
        second = await client.get("ns", [5])
        assert isinstance(first, Miss) and first.lease is not None
        assert isinstance(second, Miss) and second.lease is None, "a second reader must not also fill"
        assert await client.fill(first.lease, b'{"a":1}', 3) is FillResult.FILLED
        hit = await client.get("ns", [5])
        assert isinstance(hit, Hit) and hit.version == 3 and hit.value == b'{"a":1}'
        assert await client.fill(first.lease, b'{"a":2}', 4) is FillResult.LEASE_VOID, "a lease fills once"
        # the pipeline's next write is newer than the filled version and lands
        assert (await tier.apply([W(hit_key := client.key("ns", [5]), 4, b'{"a":9}')]))[
            0
        ].outcome.value == "applied"
        assert parse_entry(hit_key, await tier.client.hgetall(hit_key)).value == b'{"a":9}'  # type: ignore[union-attr]

    run(redis_url, body)


def test_a_fill_older_than_the_tombstone_is_stale_and_the_same_version_lands(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier) -> None:
        key = client.key("ns", [8])
        await tier.apply([D(key, 10)])
        miss = await client.get("ns", [8])
        assert isinstance(miss, Miss) and miss.lease is not None and miss.lease.held_version == 10
        assert await client.fill(miss.lease, b'"v5"', 5) is FillResult.STALE
        assert await client.fill(miss.lease, b'"v10"', 10) is FillResult.FILLED

    run(redis_url, body)


def test_leases_expire(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier) -> None:
        client.lease_ttl_ms = 50
        miss = await client.get("ns", [3])
        assert isinstance(miss, Miss) and miss.lease is not None
        await asyncio.sleep(0.15)
        assert await client.fill(miss.lease, b'"late"', None) is FillResult.LEASE_VOID
        again = await client.get("ns", [3])
        assert isinstance(again, Miss) and again.lease is not None, "an expired lease is handed out again"

    run(redis_url, body)


def test_l1_follows_broadcasts_and_refuses_older_puts(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier) -> None:
        l1 = L1Cache(max_entries=100, max_bytes=100_000)
        client.l1 = l1
        listener = InvalidationListener(aioredis.Redis.from_url(redis_url), tier.channel or "", [l1])
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        key = client.key("ns", [1])
        await tier.apply([W(key, 5, b'"v5"')])
        assert isinstance(await client.get("ns", [1]), Hit)
        assert l1.get(key) is not None and l1.get(key).version == 5  # type: ignore[union-attr]
        await tier.apply([W(key, 6, b'"v6"')])
        await _until(lambda: l1.get(key) is None)
        assert not l1.put(key, 5, b'"v5"'), "a reader that read v5 before the broadcast must not put it"
        hit = await client.get("ns", [1])
        assert isinstance(hit, Hit) and hit.tier == "l2" and hit.value == b'"v6"'
        assert l1.get(key).version == 6  # type: ignore[union-attr]
        await tier.apply([D(key, 7)])
        await _until(lambda: l1.get(key) is None)
        assert not l1.put(key, 7, b'"v6"'), "nothing at or below a tombstone's version"
        await listener.stop()

    run(redis_url, body)


def test_l1_is_flushed_and_stops_serving_when_its_broadcast_connection_is_cut(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier) -> None:
        l1 = L1Cache(max_entries=100, max_bytes=100_000)
        listener_client = aioredis.Redis.from_url(redis_url, client_name="freshkey-l1-test")
        listener = InvalidationListener(
            listener_client, tier.channel or "", [l1], health_check_interval_s=0.1
        )
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        assert l1.put("k", 1, b"x") and l1.get("k") is not None
        flushes = l1.flushes
        killed = await tier.client.client_kill_filter(_type="pubsub")
        assert killed >= 1
        await _until(lambda: l1.flushes > flushes)
        assert l1.get("k") is None
        await asyncio.wait_for(_wait_resubscribed(listener), 10)
        assert l1.healthy and l1.get("k") is None, "flushed, then serving again once resubscribed"
        assert listener.reconnects >= 1
        await listener.stop()

    run(redis_url, body)


async def _wait_resubscribed(listener: InvalidationListener) -> None:
    await _until(lambda: listener.reconnects > 0 and listener.subscribed.is_set(), 10.0)


async def _until(predicate: Callable[[], bool], within_s: float = 5.0) -> None:
    """Poll a condition that no event signals (cache state changed by another task)."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def test_sync_client_and_threaded_listener(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    l1 = L1Cache(max_entries=10, max_bytes=10_000)
    listener = ThreadedInvalidationListener(
        redis.Redis.from_url(redis_url), invalidation_channel(prefix), [l1]
    )
    listener.start()
    assert listener.subscribed.wait(5)
    client = SyncCacheClient(r, prefix=prefix, l1=l1)
    calls = []

    def loader() -> tuple[bytes, int | None]:
        calls.append(1)
        return b'"loaded"', 2

    assert client.get_or_load("ns", [1], loader) == b'"loaded"'
    assert client.get_or_load("ns", [1], loader) == b'"loaded"'
    assert len(calls) == 1, "the second read is a hit"
    assert client.counts["hits_l1"] == 1
    key = client.key("ns", [1])

    async def change() -> None:
        tier = RedisTier(
            aioredis.Redis.from_url(redis_url), tombstone_ttl_ms=1000, channel=invalidation_channel(prefix)
        )
        await tier.apply([D(key, 3)])
        await tier.close()

    asyncio.run(change())
    deadline = time.monotonic() + 5
    while l1.get(key) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert l1.get(key) is None
    listener.stop()
    r.close()


def test_an_invalidation_voids_the_lease_even_when_it_changes_nothing(redis_url: str) -> None:
    """A replayed or same-version invalidation still means the row changed around then: the lease
    a reader got before it must not fill (the delete-after-update case of column versions)."""

    async def body(client: CacheClient, tier: RedisTier) -> None:
        key = client.key("ns", [4])
        await tier.apply([D(key, 5)])
        miss = await client.get("ns", [4])
        assert isinstance(miss, Miss) and miss.lease is not None
        results = await tier.apply([D(key, 5)])
        assert results[0].outcome.value == "not_newer"
        assert await client.fill(miss.lease, b'"read before the change"', 5) is FillResult.LEASE_VOID

    run(redis_url, body)


def test_leases_on_a_redis_cluster(redis_cluster: Any) -> None:
    """The same protocol on a 3-master cluster: keys of a namespace, its tombstones, leases and
    signature record share one hash slot, so every script runs on one node."""
    prefix = f"t{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        client = redis_cluster.client()
        tier = RedisTier(
            redis_cluster.client(), tombstone_ttl_ms=60_000, channel=invalidation_channel(prefix)
        )
        cache = CacheClient(client, prefix=prefix)
        try:
            for ns in ("alpha", "beta", "gamma"):  # namespaces land on different nodes
                miss = await cache.get(ns, [1])
                assert isinstance(miss, Miss) and miss.lease is not None
                await tier.apply([W(miss.key, 7, b'"new"')])
                assert await cache.fill(miss.lease, b'"old"', None) is FillResult.LEASE_VOID
                hit = await cache.get(ns, [1])
                assert isinstance(hit, Hit) and hit.value == b'"new"'
                other = await cache.get(ns, [2])
                assert isinstance(other, Miss) and other.lease is not None
                assert await cache.fill(other.lease, b'"two"', 3) is FillResult.FILLED
                hit2 = await cache.get(ns, [2])
                assert isinstance(hit2, Hit) and hit2.version == 3
        finally:
            await tier.close()
            await client.aclose()

    asyncio.run(main())
