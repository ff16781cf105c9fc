"""The Redis tier on a real Redis Cluster: CAS scenarios, hash-tag placement, scans over every primary,
a slot migration under load (MOVED/ASK), and a lost script cache on one node.

The cluster is the session's ``redis_cluster`` (3 private masters, or ``FRESHKEY_TEST_REDIS_CLUSTER``).
The migration tests move one namespace's slot with the same commands ``redis-cli --cluster reshard``
sends: ``CLUSTER SETSLOT <slot> IMPORTING/MIGRATING``, ``MIGRATE ... KEYS`` in batches, then
``CLUSTER SETSLOT <slot> NODE`` on every node.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import ClusterNode as SyncClusterNode
from redis.exceptions import AskError, ClusterError, MovedError

from cache_writer import CacheAction, Outcome, RedisTier
from cache_writer.entries import Entry, read_namespace
from cache_writer.layout import namespace_pattern
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedirectStats, run_pipeline, run_pipeline_sync
from cache_writer.redis.tier import connect
from cache_writer.settings import RedisSettings
from tests.support.cas import SCENARIOS, D, W, check_scenario, read_entry, shuffled_batches
from tests.support.processes import gone
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.services import RedisClusterService
from tests.support.slots import Migration, node_admin

pytestmark = pytest.mark.integration


def run(
    cluster: RedisClusterService, body: Callable[[RedisTier, aioredis.RedisCluster], Awaitable[Any]]
) -> Any:
    async def main() -> Any:
        client = cluster.client()
        tier = RedisTier(client, tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            return await body(tier, client)
        finally:
            await tier.close()

    return asyncio.run(main())


def _namespaces_per_node(client: aioredis.RedisCluster, per_node: int = 1) -> dict[str, list[str]]:
    """Fresh namespace names, ``per_node`` of them on each primary (by their hash tag's slot)."""
    found: dict[str, list[str]] = {node.name: [] for node in client.get_primaries()}
    while any(len(names) < per_node for names in found.values()):
        namespace = f"ns{uuid.uuid4().hex[:10]}"
        node = client.get_node_from_key(f"fk:{{{namespace}}}:x")
        assert node is not None
        if len(found[node.name]) < per_node:
            found[node.name].append(namespace)
    return found


# --- the CAS scenarios of test_redis_tier, on the cluster ----------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_versions_only_go_forward_on_a_cluster(redis_cluster: RedisClusterService, name: str) -> None:
    run(redis_cluster, lambda tier, client: check_scenario(tier, client, name))


def test_concurrent_batches_spanning_every_node_end_at_the_newest_version(
    redis_cluster: RedisClusterService,
) -> None:
    """Batches mixing namespaces of every primary (one pipeline per node), applied concurrently."""

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> list[Entry | None]:
        namespaces = [ns for names in _namespaces_per_node(client, 2).values() for ns in names]
        keys = [f"test:{{{ns}}}:{i}" for ns in namespaces for i in range(5)]
        batches = shuffled_batches(keys, 30, seed=7)
        await asyncio.gather(*(tier.apply(batch) for batch in batches))
        big = f"test:{{{namespaces[0]}}}:big"
        await tier.apply([W(big, 2**64 - 1, b"max"), W(big, 2**64 - 2, b"older")])
        return [await read_entry(client, key) for key in [*keys, big]]

    *entries, big = run(redis_cluster, body)
    for entry in entries:
        assert entry is not None and entry.version == 30 and entry.value == b"v30"
    assert big is not None and big.version == 2**64 - 1 and big.value == b"max"


def test_connect_from_settings_gives_a_cluster_client(redis_cluster: RedisClusterService) -> None:
    settings = RedisSettings(url=redis_cluster.url, cluster=True)

    async def main() -> tuple[bool, Entry | None]:
        tier = RedisTier.from_settings(settings)
        key = f"fk:{{{uuid.uuid4().hex}}}:1"
        try:
            await tier.load_scripts()
            await tier.apply([W(key, 3, b"x")])
            return isinstance(tier.client, aioredis.RedisCluster), await read_entry(tier.client, key)  # type: ignore[arg-type]
        finally:
            await tier.close()

    is_cluster, entry = asyncio.run(main())
    assert is_cluster and entry is not None and entry.version == 3
    assert isinstance(connect(RedisSettings(url=redis_cluster.url)), aioredis.Redis)


# --- placement and scans -------------------------------------------------------------------------------


def test_a_namespace_lives_in_one_slot_on_one_node(redis_cluster: RedisClusterService) -> None:
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    keys = [f"fk:{{{namespace}}}:{row}" for row in ("1", "2", "a%2Fb/7", "x" * 200)]

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[set[int], dict[str, int]]:
        await tier.apply([W(k, 5, b"v") for k in keys[:2]] + [D(k, 6) for k in keys[2:]])
        slots = {int(await client.cluster_keyslot(k)) for k in keys}
        per_node = {}
        for node in client.get_primaries():
            found: list[bytes] = []
            cursor = 0
            while True:
                cursor, batch = await node.execute_command(
                    "SCAN", cursor, "MATCH", namespace_pattern("fk", namespace), "COUNT", 1000
                )
                found += batch
                if int(cursor) == 0:
                    break
            per_node[node.name] = len(found)
        return slots, per_node

    slots, per_node = run(redis_cluster, body)
    assert len(slots) == 1, slots
    holders = {name: count for name, count in per_node.items() if count}
    assert list(holders.values()) == [len(keys)], f"entries and tombstones must share one node: {per_node}"


def test_read_namespace_finds_entries_on_every_node(redis_cluster: RedisClusterService) -> None:
    async def body(
        tier: RedisTier, client: aioredis.RedisCluster
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, Entry]]]:
        by_node = _namespaces_per_node(client)
        actions = [
            W(f"fk:{{{ns}}}:{i}", 2, b"v") for names in by_node.values() for ns in names for i in range(30)
        ]
        actions += [D(f"fk:{{{ns}}}:t", 9) for names in by_node.values() for ns in names]
        await tier.apply(actions)
        read = {
            ns: await read_namespace(client, "fk", ns, batch=7) for names in by_node.values() for ns in names
        }
        return by_node, read

    by_node, read = run(redis_cluster, body)
    assert len(by_node) >= 3
    for names in by_node.values():
        for ns in names:
            entries = read[ns]
            assert len(entries) == 31
            assert entries[f"fk:{{{ns}}}:t"].tombstone and entries[f"fk:{{{ns}}}:t"].version == 9
            assert all(e.version == 2 and e.value == b"v" for k, e in entries.items() if not k.endswith(":t"))


def test_read_namespace_while_its_slot_is_half_migrated(redis_cluster: RedisClusterService) -> None:
    """Mid-migration a namespace's keys sit on two nodes: a scan of the slot's owner alone misses some."""

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[int, int, int]:
        namespace = f"ns{uuid.uuid4().hex[:10]}"
        keys = [f"fk:{{{namespace}}}:{i}" for i in range(40)]
        await tier.apply([W(k, 1, b"v") for k in keys])
        migration = Migration.plan(client, keys[0])
        migration.begin()
        try:
            migration.move_keys(limit=20)
            entries = await read_namespace(client, "fk", namespace)
            async with migration.source_client() as source:
                owner_only = [k async for k in source.scan_iter(match=f"fk:{{{namespace}}}:*")]
            # Writes keep working on both halves (ASK for the moved keys), and reads see them.
            await tier.apply([W(k, 2, b"w") for k in keys])
            after = await read_namespace(client, "fk", namespace)
        finally:
            migration.finish()
        return len(entries), len(owner_only), sum(e.version == 2 for e in after.values())

    found, owner_only, updated = run(redis_cluster, body)
    assert found == 40
    assert owner_only == 20, "the negative control: the owner alone holds only the unmoved half"
    assert updated == 40


def test_invalidating_a_key_still_on_a_migrating_slots_source(redis_cluster: RedisClusterService) -> None:
    """While its slot migrates, a key not moved yet is served by the source; its invalidation must leave a
    tombstone there. A script that empties the key midway (DEL, then HSET) is stopped by Redis at the
    HSET ("Script attempted to access a non local key"): the DEL has run, the tombstone is missing."""

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[list[Outcome], Entry | None]:
        namespace = f"ns{uuid.uuid4().hex[:10]}"
        keys = [f"fk:{{{namespace}}}:{i}" for i in range(2)]
        await tier.apply([W(k, 1, b"v") for k in keys])
        migration = Migration.plan(client, keys[0])
        migration.begin()
        try:
            results = await tier.apply([D(k, 2) for k in keys])
            entry = await read_entry(client, keys[0])
        finally:
            migration.finish()
        return [r.outcome for r in results], entry

    outcomes, entry = run(redis_cluster, body)
    assert outcomes == [Outcome.APPLIED] * 2
    assert entry is not None and entry.tombstone and entry.version == 2


# --- slot migration under load -------------------------------------------------------------------------


Apply = Callable[[list[CacheAction]], Awaitable[Any]]


@dataclass
class LoadReport:
    batches: int = 0
    writes: int = 0
    errors: list[BaseException] = field(default_factory=list)
    highest: dict[str, int] = field(default_factory=dict)
    """The highest version sent to each key (failed batches included: a lost write is a failure)."""
    final: dict[str, Entry | None] = field(default_factory=dict)
    migration_s: float = 0.0


async def _migrate_under_load(
    client: aioredis.RedisCluster,
    apply: Apply,
    *,
    target: str | None = None,
    writers: int = 3,
    keys_count: int = 40,
    after: int = 30,
) -> tuple[LoadReport, Migration]:
    """Writers apply versioned batches to one namespace, each writer every ~3 ms, while its slot migrates
    in batches of 4 keys, 15 ms apart, and for ``after`` more batches once the slot is the target's.

    Each batch writes a random half of the keys at the next version of a shared counter (every 7th
    version is an invalidation instead). After the move the batches write only the even keys: the odd
    ones end at a version written during the migration, through ASK if the key had already moved.
    """
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    keys = [f"fk:{{{namespace}}}:{i}" for i in range(keys_count)]
    report = LoadReport()
    await apply([W(k, 1, b"v1") for k in keys])
    report.highest = dict.fromkeys(keys, 1)
    versions = itertools.count(2)
    migration = Migration.plan(client, keys[0], target)
    done = asyncio.Event()
    after_done = 0
    rng = random.Random(11)

    async def writer() -> None:
        nonlocal after_done
        while after_done < after:
            moved = done.is_set()
            version = next(versions)
            chosen = rng.sample(keys[::2] if moved else keys, len(keys) // 4 if moved else len(keys) // 2)
            batch = [D(k, version) if version % 7 == 0 else W(k, version, b"v%d" % version) for k in chosen]
            for k in chosen:
                report.highest[k] = max(report.highest[k], version)
            try:
                await apply(batch)
            except Exception as exc:
                report.errors.append(exc)
            report.batches += 1
            report.writes += len(batch)
            if moved:
                after_done += 1
            await asyncio.sleep(0.003)

    async def migrate() -> None:
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.to_thread(migration.begin)
        await asyncio.to_thread(migration.move_keys, 4, 0.015)
        await asyncio.to_thread(migration.finish)
        report.migration_s = time.monotonic() - started
        done.set()

    await asyncio.gather(migrate(), *(writer() for _ in range(writers)))
    for k in keys:
        report.final[k] = await read_entry(client, k)
    return report, migration


def _expected(version: int) -> bytes | None:
    return None if version % 7 == 0 else (b"v%d" % version)


def _check(report: LoadReport, migration: Migration) -> list[str]:
    """What is wrong after a migration under load (empty when all is well)."""
    problems = [f"write failed: {exc!r}" for exc in report.errors[:3]]
    if report.errors:
        problems.append(f"{len(report.errors)} of {report.batches} batches failed")
    for key, version in report.highest.items():
        entry = report.final[key]
        if entry is None or entry.version != version or entry.value != _expected(version):
            got = None if entry is None else (entry.version, entry.value)
            problems.append(f"{key}: ends at {got}, its highest version is {version}")
    owners = migration.owner_seen_by_every_node()
    if owners != {migration.target}:
        problems.append(f"slot {migration.slot} owned by {owners}, expected {migration.target}")
    return problems


async def _warm(client: aioredis.RedisCluster, connections: int = 4) -> None:
    """Open several connections to every primary, as any concurrent use of the client does."""
    for node in client.get_primaries():
        await asyncio.gather(*(node.execute_command("PING") for _ in range(connections)))


def test_slot_migration_under_load_loses_no_write(redis_cluster: RedisClusterService) -> None:
    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[LoadReport, Migration, Any]:
        await _warm(client)
        report, migration = await _migrate_under_load(client, tier.apply)
        return report, migration, tier.redirects

    report, migration, redirects = run(redis_cluster, body)
    assert _check(report, migration) == []
    # The run did go through the migration: writes were redirected both ways, and many ran meanwhile.
    assert redirects.ask > 0 and redirects.moved > 0, redirects
    assert migration.moved_keys == 40
    assert report.batches >= 60, report.batches


def test_a_client_that_does_not_follow_ask_fails_the_same_check(redis_cluster: RedisClusterService) -> None:
    """The negative control: the same run, with a client that follows MOVED but takes ASK as a failure
    (as cluster clients without ASK support do). Writes to keys that had already moved fail with ASK and
    are lost, which the check reports; a key whose lost write was its last one also ends below its
    highest version (whether one does depends on the timing of the migration, so it is not required)."""

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[LoadReport, Migration]:
        async def no_ask_apply(actions: list[CacheAction]) -> None:
            commands = [tier.command(action) for action in actions]
            async with client.pipeline(transaction=False) as pipe:
                for args in commands:
                    pipe.execute_command(*args)
                replies = await pipe.execute(raise_on_error=False, allow_redirections=False)
            failed = []
            for args, reply in zip(commands, replies, strict=True):
                if isinstance(reply, MovedError):
                    await client.execute_command(*args)  # redis-py follows MOVED and updates its slot map
                elif isinstance(reply, Exception):
                    failed.append(reply)
            if failed:
                raise failed[0]

        return await _migrate_under_load(client, no_ask_apply)

    report, migration = run(redis_cluster, body)
    problems = _check(report, migration)
    assert any(isinstance(exc, AskError) for exc in report.errors), report.errors[:3]
    assert any("batches failed" in problem for problem in problems), problems


def test_redis_py_own_ask_handling_fails_where_run_pipeline_does_not(
    redis_cluster: RedisClusterService,
) -> None:
    """Why the tier follows ASK itself: redis-py (8.1) sends ASKING and the redirected command as two
    requests on connections taken from the target's pool; with several idle connections there they
    differ, the target answers MOVED, the source ASK again, until ClusterError('TTL exhausted.').
    A canary: if redis-py is fixed, the stock path passes and this test says so."""

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[Any, list[Outcome]]:
        namespace = f"ns{uuid.uuid4().hex[:10]}"
        keys = [f"fk:{{{namespace}}}:{i}" for i in range(6)]
        await tier.apply([W(k, 1, b"v") for k in keys])
        migration = Migration.plan(client, keys[0])
        migration.begin()
        try:
            migration.move_keys(limit=6)  # every key is on the target, the slot still the source's
            await _warm(client)
            stock: Any = None
            try:
                async with client.pipeline(transaction=False) as pipe:
                    pipe.execute_command(*tier.command(W(keys[0], 2, b"stock")))
                    stock = await pipe.execute()
            except ClusterError as exc:
                stock = exc
            ours = await tier.apply([W(k, 3, b"ours") for k in keys])
        finally:
            migration.finish()
        return stock, [r.outcome for r in ours]

    stock, ours = run(redis_cluster, body)
    assert ours == [Outcome.APPLIED] * 6
    assert isinstance(stock, ClusterError), (
        f"redis-py's own ASK handling worked ({stock!r}): run_pipeline's ASK code may no longer be needed"
    )


def test_slot_migration_to_a_new_empty_node(redis_cluster: RedisClusterService) -> None:
    """Growing the cluster: the slot goes to a master that joined without slots and without the scripts
    (the client does not know it yet; its first ASK brings NOSCRIPT, answered on that node)."""
    if redis_cluster.local is None:
        pytest.skip("adding a node needs the harness's own cluster (FRESHKEY_TEST_REDIS_CLUSTER is external)")
    new_node = redis_cluster.local.add_node()

    async def body(tier: RedisTier, client: aioredis.RedisCluster) -> tuple[LoadReport, Migration, Any]:
        await _warm(client)
        report, migration = await _migrate_under_load(client, tier.apply, target=new_node, writers=2)
        return report, migration, tier.redirects

    report, migration, redirects = run(redis_cluster, body)
    assert _check(report, migration) == []
    assert redirects.ask > 0 and redirects.moved > 0 and redirects.noscript > 0, redirects


# --- lost scripts --------------------------------------------------------------------------------------


def test_a_script_flush_on_one_node_is_recovered_on_that_node(redis_cluster: RedisClusterService) -> None:
    async def body(
        tier: RedisTier, client: aioredis.RedisCluster
    ) -> tuple[list[Outcome], dict[str, bool], int, int]:
        by_node = _namespaces_per_node(client)
        flushed = next(iter(by_node))
        flushed_node = client.get_node(node_name=flushed)
        assert flushed_node is not None
        await flushed_node.execute_command("SCRIPT", "FLUSH")
        actions = [W(f"fk:{{{names[0]}}}:{i}", 4, b"x") for names in by_node.values() for i in range(3)]
        results = await tier.apply(actions)
        loaded = {}
        for node in client.get_primaries():
            exists = await node.execute_command("SCRIPT", "EXISTS", scripts.WRITE.sha, scripts.INVALIDATE.sha)
            loaded[node.name] = all(exists)
        replies = await run_pipeline(client, [("HGET", a.key, "v") for a in actions])
        stored = sum(reply == b"4" for reply in replies)
        return [r.outcome for r in results], loaded, stored, tier.redirects.noscript

    outcomes, loaded, stored, refused = run(redis_cluster, body)
    assert outcomes == [Outcome.APPLIED] * len(outcomes)
    assert stored == len(outcomes)
    assert refused == 3, "only the flushed node's three actions were refused and resent"
    assert all(loaded.values()), loaded


# --- the harness's LocalRedisCluster -------------------------------------------------------------------


def test_local_redis_cluster_starts_over_a_stale_workdir_and_stops_every_node(tmp_path: Path) -> None:
    stale = tmp_path / "node-0"
    stale.mkdir()
    (stale / "nodes.conf").write_text("garbage from an earlier cluster\n")
    cluster = LocalRedisCluster(workdir=tmp_path, masters=2).start()
    try:
        assert len(cluster.nodes) == 2 and cluster.running
        assert cluster.url == f"redis://{cluster.nodes[0]}/0"
        with node_admin(cluster.nodes[1]) as admin:
            info = admin.execute_command("CLUSTER", "INFO").decode()
        assert "cluster_state:ok" in info and "cluster_known_nodes:2" in info
        pids = cluster.pids
    finally:
        cluster.stop()
    assert all(gone(pid) for pid in pids), pids
    assert not cluster.running
    assert (tmp_path / "node-0" / "nodes.conf").is_file(), "a workdir passed in is kept"


def test_the_blocking_pipeline_recovers_a_script_flush_on_one_node_the_same_way(
    redis_cluster: RedisClusterService,
) -> None:
    """run_pipeline_sync answers NOSCRIPT as run_pipeline does: only the refused commands are resent."""
    client = redis.RedisCluster(
        startup_nodes=[SyncClusterNode(h, int(p)) for h, p in (s.rsplit(":", 1) for s in redis_cluster.seeds)]
    )
    try:
        namespaces = _namespaces_per_node(client)  # type: ignore[arg-type]
        client.script_load(scripts.WRITE.text)  # on every primary
        flushed = client.get_node(node_name=next(iter(namespaces)))
        client.get_redis_connection(flushed).script_flush()
        tier = RedisTier(redis_cluster.client(), tombstone_ttl_ms=60_000)
        keys = [f"fk:{{{names[0]}}}:{i}" for names in namespaces.values() for i in range(3)]
        commands = [tier.command(W(key, 4, b"x")) for key in keys]
        stats = RedirectStats()
        replies = run_pipeline_sync(client, commands, scripts=(scripts.WRITE.text,), stats=stats)
        stored = run_pipeline_sync(client, [("HGET", c[3], "v") for c in commands])
    finally:
        client.close()
    assert all(reply[0] == 1 for reply in replies), replies
    assert stored == [b"4"] * len(commands)
    assert stats.noscript == 3, "only the flushed node's three commands were refused and resent"
