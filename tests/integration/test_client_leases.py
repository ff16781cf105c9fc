"""Leases against stale fills, L1 kept honest by broadcasts, on a real Redis (invariants 3 and 9)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import ClusterNode, PipelineCommand
from redis.exceptions import AskError

from cache_writer import CacheAction, RedisTier
from cache_writer.client import CacheClient, FillResult, Hit, Miss, SyncCacheClient
from cache_writer.entries import parse_entry
from cache_writer.l1 import InvalidationListener, L1Cache, ThreadedInvalidationListener
from cache_writer.layout import invalidation_channel, signature_key_of
from cache_writer.redis import scripts
from cache_writer.signatures import SignatureRecord
from schemas.model_updates import SemVer, signature_order
from tests.support.cas import run_client_and_tier
from tests.support.slots import Migration

pytestmark = pytest.mark.integration


def run(redis_url: str, body: Callable[..., Awaitable[Any]]) -> Any:
    """``body(client, tier)``: a client with 2 s leases and the tier, under a fresh prefix."""
    return run_client_and_tier(redis_url, lambda client, tier, _: body(client, tier), lease_ttl_ms=2_000)


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


# --- the blocking client on a Redis Cluster ------------------------------------------------------------


SIG = "5" * 64


def _sync_cluster(cluster: Any) -> redis.RedisCluster:
    nodes = [ClusterNode(host, int(port)) for host, port in (s.rsplit(":", 1) for s in cluster.seeds)]
    return redis.RedisCluster(startup_nodes=nodes)


def _signed(key: str, version: int, value: bytes) -> CacheAction:
    return CacheAction("write", key, version, 1, value, signature=SIG)


async def _prepare(cluster: Any, prefix: str, namespace: str, keys: list[str]) -> None:
    """The namespace has a signature and the pipeline has written ``keys`` under it (``"w<i>"``)."""
    tier = RedisTier(cluster.client(), tombstone_ttl_ms=60_000)
    try:
        record = SignatureRecord(SIG, signature_order(SemVer.parse("1.0.0")), b"{}", ("a",))
        assert (await tier.set_signature(prefix, namespace, record)).applied
        await tier.apply([_signed(k, 1, b'"w%d"' % i) for i, k in enumerate(keys)])
    finally:
        await tier.close()


def test_sync_leases_on_a_redis_cluster(redis_cluster: Any) -> None:
    """The blocking client speaks the same protocol on a cluster: one lease holder, fills that a racing
    change voids, hits, on namespaces of every node."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = _sync_cluster(redis_cluster)
    cache = SyncCacheClient(client, prefix=prefix)

    async def change(key: str) -> None:
        tier = RedisTier(redis_cluster.client(), tombstone_ttl_ms=60_000)
        try:
            await tier.apply([W(key, 7, b'"new"')])
        finally:
            await tier.close()

    try:
        for ns in ("alpha", "beta", "gamma"):  # namespaces land on different nodes
            miss = cache.get(ns, [1])
            assert isinstance(miss, Miss) and miss.lease is not None
            again = cache.get(ns, [1])
            assert isinstance(again, Miss) and again.lease is None, "a second reader must not also fill"
            asyncio.run(change(miss.key))
            assert cache.fill(miss.lease, b'"old"', None) is FillResult.LEASE_VOID
            hit = cache.get(ns, [1])
            assert isinstance(hit, Hit) and hit.value == b'"new"' and hit.version == 7
            assert cache.get_or_load(ns, [2], lambda: (b'"two"', 3)) == b'"two"'
            hit2 = cache.get(ns, [2])
            assert isinstance(hit2, Hit) and hit2.version == 3
    finally:
        client.close()


def test_sync_client_reads_and_fills_through_a_live_slot_migration(redis_cluster: Any) -> None:
    """Reads and fills go on while the namespace's slot moves to another node (in batches of 4 keys,
    10 ms apart): every operation succeeds and every value is the right one. Keys whose entry and
    signature key sit on different nodes meanwhile get TRYAGAIN until both have moved; moved keys ASK;
    after the move the client's stale slot map gets MOVED."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    namespace = "moving"
    client = _sync_cluster(redis_cluster)
    cache = SyncCacheClient(client, prefix=prefix)
    keys = [cache.key(namespace, [i]) for i in range(40)]
    asyncio.run(_prepare(redis_cluster, prefix, namespace, keys[:20]))
    for i in range(20, 40):  # the other half filled by the client after a miss
        assert cache.get_or_load(namespace, [i], lambda i=i: (b'"f%d"' % i, 1)) == b'"f%d"' % i  # type: ignore[misc]
    expected = {i: (b'"w%d"' if i < 20 else b'"f%d"') % i for i in range(40)}
    migration = Migration.plan(client, keys[0])
    moved = threading.Event()

    def migrate() -> None:
        migration.begin()
        migration.move_keys(4, 0.01)
        migration.finish()
        moved.set()

    errors: list[BaseException] = []
    wrong: list[str] = []
    rounds = after = 0
    mover = threading.Thread(target=migrate)
    mover.start()
    try:
        while after < 3:
            last = moved.is_set()
            for i in random.Random(rounds).sample(range(40), 40):
                try:
                    value = cache.get_or_load(namespace, [i], lambda: (b'"reloaded"', 1))
                except Exception as exc:
                    errors.append(exc)
                    continue
                if value != expected[i]:
                    wrong.append(f"row {i}: {value!r}")
            rounds += 1
            after += last
    finally:
        mover.join()
        client.close()
    assert errors == [] and wrong == []
    assert migration.moved_keys == 41, "40 entries and the signature key moved"
    assert cache.counts["leases"] == 20, "no read during the migration needed a fill"
    assert cache.redirects.moved > 0 and cache.redirects.ask + cache.redirects.tryagain > 0, cache.redirects
    assert rounds > 3


@contextlib.contextmanager
def _half_moved(
    cluster: Any, client: redis.RedisCluster, namespace: str, target: str | None = None
) -> Iterator[tuple[SyncCacheClient, list[str]]]:
    """A blocking client on ``client``, and 8 entries of ``namespace`` (under a signature) all moved to
    ``target`` while the slot still belongs to its source; the slot is given to the target on exit."""
    cache = SyncCacheClient(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    keys = [cache.key(namespace, [i]) for i in range(8)]
    asyncio.run(_prepare(cluster, cache.prefix, namespace, keys))
    migration = Migration.plan(client, keys[0], target)
    migration.begin()
    try:
        migration.move_keys(limit=None)
        yield cache, keys
    finally:
        migration.finish()


def test_sync_client_follows_ask_while_the_slot_is_half_moved_and_a_client_that_does_not_fails(
    redis_cluster: Any,
) -> None:
    """Every key of the namespace is on the importing node, the slot still the source's: each read is an
    ASK. The client follows it; the same read without following the redirect fails (negative control).
    Once the slot has moved, the client's stale slot map is corrected by a MOVED."""
    with contextlib.closing(_sync_cluster(redis_cluster)) as client:
        with _half_moved(redis_cluster, client, "halfway") as (cache, keys):
            hits = [cache.get("halfway", [i]) for i in range(8)]
            raw = client.pipeline(transaction=False).send_cluster_commands(
                [PipelineCommand(("HGET", keys[0], "d"), position=0)],
                raise_on_error=False,
                allow_redirections=False,
            )
        assert all(isinstance(h, Hit) and h.value == b'"w%d"' % i for i, h in enumerate(hits)), hits
        assert cache.redirects.ask >= 8
        assert isinstance(raw[0], AskError), f"without following ASK the read fails: {raw[0]!r}"
        before = cache.redirects.moved
        assert isinstance(cache.get("halfway", [0]), Hit)
        assert cache.redirects.moved == before + 1, "the stale slot map is corrected by the MOVED"
        assert cache.get_or_load("halfway", [99], lambda: (b'"new"', 1)) == b'"new"'


def test_sync_client_follows_ask_to_a_node_that_just_joined_where_redis_py_fails(redis_cluster: Any) -> None:
    """Growing the cluster: the slot goes to a master that joined without slots and without the scripts.
    The client reaches it on the ASK (a node its slot map does not know), loads the scripts there and
    reads. redis-py's own redirect handling (what the blocking client used before) cannot reach it."""
    if redis_cluster.local is None:
        pytest.skip("adding a node needs the harness's own cluster (FRESHKEY_TEST_REDIS_CLUSTER is external)")
    new_node = redis_cluster.local.add_node()
    with (
        contextlib.closing(_sync_cluster(redis_cluster)) as client,
        _half_moved(redis_cluster, client, "grown", new_node) as (cache, keys),
    ):
        hits = [cache.get("grown", [i]) for i in range(8)]
        stock: Any
        try:
            stock = client.evalsha(scripts.GET_OR_LEASE.sha, 2, keys[0], signature_key_of(keys[0]), "t", 2000)
        except Exception as exc:
            stock = exc
    assert all(isinstance(h, Hit) and h.value == b'"w%d"' % i for i, h in enumerate(hits)), hits
    assert cache.redirects.ask >= 8 and cache.redirects.noscript >= 1, cache.redirects
    assert isinstance(stock, Exception), (
        f"redis-py reached the new node by itself ({stock!r}): its own redirect handling may do now"
    )


def test_sync_client_reloads_its_scripts_after_a_script_flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    cache = SyncCacheClient(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    try:
        assert cache.get_or_load("ns", [1], lambda: (b'"a"', 1)) == b'"a"'
        before = cache.redirects.noscript
        client.script_flush()
        hit = cache.get("ns", [1])
        assert isinstance(hit, Hit) and hit.value == b'"a"'
        assert cache.redirects.noscript == before + 1, "refused once, reloaded, sent again"
    finally:
        client.close()
