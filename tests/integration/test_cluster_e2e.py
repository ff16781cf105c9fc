"""The whole worker on a Redis Cluster, end to end: ``FRESHKEY_REDIS_CLUSTER=true`` on the session's
3-master cluster (``redis_cluster``), changes through the real connector and worker, an application
reading with leases and an L1 kept honest by the broadcast, a model cutover and a slot migration, all
under a steady writer; 0 stale.

The namespace is semantic (rows keyed by the semantic key of their ``content``), so a model update moves
every key. The run:

1. connector and worker on the cluster; model 1 published and active; 40 rows inserted and cached;
2. the application starts (its own thread and event loop): one ``RedisCluster`` client for
   ``CacheClient`` (reads through L1 and L2, a lease on a miss, a fill from the database, hit counts for
   the prewarm) and another for ``InvalidationListener``, subscribed on every primary. A blocking
   application reads too: ``SyncCacheClient`` and ``ThreadedInvalidationListener`` on blocking
   ``RedisCluster`` clients, with their own L1. One subscriber per node (plain clients) logs the
   broadcast as well. Redis Cluster forwards every PUBLISH to every node over the cluster bus, which
   drops what a link held when a node stalls (``test_cluster_pubsub_loss.py``): how many announcements
   each node's log is short of all of them is printed, not asserted; the L1s, whose listeners hear every
   primary, must hold nothing stale;
3. the writer changes rows at ``RATE`` a second from now to the end; the readers read random rows;
4. the namespace's slot (entries, tombstones, the signature hash) migrates to another master under
   that load, in small batches, as ``redis-cli --cluster reshard`` does: the worker and the readers
   follow MOVED and ASK;
5. model 2 is published (the readers pause meanwhile, as an application reloads its model); the
   cutover prewarms the hot rows and switches the signature, announced on the channel: the L1 drops
   every model-1 entry (both applications), and no model-1 key is served from then on;
6. the writer stops, the pipeline catches up: ``run_verification`` (SLA window) on the cluster finds
   0 stale entries, the L1 holds nothing L2 does not (0 stale in L1), and in no node's log did a key's
   announced version go backwards.

The slot migration's negative control is ``test_redis_cluster.py``'s (a client that does not follow ASK
loses writes); the lease's is ``freshkey demo --race --no-leases`` and ``test_client_leases.py``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors
import pytest
import redis
import redis.asyncio as aioredis

from cache_writer.client import CacheClient, FillResult, Hit, SyncCacheClient
from cache_writer.entries import parse_entry
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import InvalidationListener, L1Cache, ThreadedInvalidationListener
from cache_writer.layout import entry_key, invalidation_channel, signature_key
from cache_writer.semantic import KeyHashWeights
from pipeline.plan import row_value, row_version
from schemas import Binding, parse_bindings, row_to_json
from tests.conftest import MySQLService, RedisClusterService
from tests.support.models import SEMANTIC, make_weights, publish, semantic_row_key, wait_cutover
from tests.support.pipeline import Pipeline
from tests.support.slots import Migration
from tests.support.workload import INSERT, BroadcastLog, SteadyWriter, order_violations

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = range(1, 41)
CHANGED = range(1, 31)
"""The rows the writer changes; the others only get read (so they are hot at the cutover: the rows of
hot keys that changed since are gone from their keys, and are not prewarmed)."""
STEADY = range(31, 41)
RATE = 30.0
"""Changes a second; each moves a row's semantic key (the old key tombstoned, the new one written)."""
READERS = 3
WINDOW_MS = 1500.0
WORKER_ENV = {"FRESHKEY_MODEL_PREWARM_TOP_N": "10", "FRESHKEY_SLA_WINDOW_MS": str(WINDOW_MS)}


class ClusterApp:
    """An application on the cluster: readers through L1 and L2 with leases, on their own event loop.

    ``weights`` is the model the readers key with (switched by the test after a cutover); :meth:`pause`
    stops the readers but keeps the L1 listening, :meth:`stop` ends everything.
    """

    def __init__(self, p: Pipeline, binding: Binding, weights: KeyHashWeights) -> None:
        self.p = p
        self.binding = binding
        self.weights = weights
        self.l1 = L1Cache(max_entries=10_000, max_bytes=64 * 1024 * 1024, ttl_s=600)
        self.counts: Counter[str] = Counter()
        """The readers' own counts; :attr:`cache_counts` has the client's (hits per tier, fills)."""
        self.cache_counts: Counter[str] = Counter()
        self.listener_nodes: list[str] = []
        self.errors: list[str] = []
        self._reading = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Semaphore(0)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="cluster-app", daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(30), f"the application did not start: {self.errors}"
        assert not self.errors, self.errors

    def read(self) -> None:
        self._reading.set()

    def pause(self) -> None:
        """Until every reader finished its current read."""
        self._reading.clear()
        for _ in range(READERS):
            assert self._idle.acquire(timeout=30), "a reader did not pause"

    def stop(self) -> None:
        self._stop.set()
        self._reading.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the test
            self.errors.append(repr(exc))
            self._ready.set()

    async def _run(self) -> None:
        client = self.p.async_redis()
        listener_client = self.p.async_redis()
        assert isinstance(listener_client, aioredis.RedisCluster)
        await listener_client.initialize()
        channel = invalidation_channel(self.p.prefix)
        listener = InvalidationListener(listener_client, channel, [self.l1])
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 10)
        self.listener_nodes = sorted(listener.primaries)
        cache = CacheClient(client, prefix=self.p.prefix, l1=self.l1, hits=HitRecorder(self.p.prefix))
        self.cache_counts = cache.counts
        try:
            readers = [asyncio.create_task(self._reader(cache, n)) for n in range(READERS)]
            self._ready.set()
            await asyncio.gather(*readers)
        finally:
            await listener.stop()
            await client.aclose()
            await listener_client.aclose()

    def _load(self, conn: Any, row_id: int) -> dict[str, Any] | None:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SELECT * FROM assets WHERE id = %s", (row_id,))
            row = cur.fetchone()
        return None if row is None else row_to_json(row)

    async def _reader(self, cache: CacheClient, n: int) -> None:
        rng = random.Random(100 + n)
        conn = await asyncio.to_thread(self.p.mysql.connect, self.p.database)
        try:
            while not self._stop.is_set():
                if not self._reading.is_set():
                    self._idle.release()
                    await asyncio.to_thread(self._reading.wait)
                    continue
                try:
                    await self._read_one(cache, conn, rng)
                except Exception as exc:  # counted and shown: the test fails on any
                    self.errors.append(f"reader {n}: {exc!r}")
                await asyncio.sleep(rng.uniform(0.005, 0.03))
        finally:
            await asyncio.to_thread(conn.close)

    async def _read_one(self, cache: CacheClient, conn: Any, rng: random.Random) -> None:
        row_id = rng.choice(ROWS if rng.random() < 0.5 else STEADY)
        row = await asyncio.to_thread(self._load, conn, row_id)
        if row is None:
            return
        key = semantic_row_key(self.weights, str(row["content"]))
        result = await cache.get(self.binding.namespace, [key])
        self.counts["reads"] += 1
        if isinstance(result, Hit):
            return
        if result.lease is None:
            self.counts["lease_waits"] += 1
            return
        # The window in which a change can slip in between the read and the fill.
        await asyncio.sleep(rng.uniform(0, 0.05))
        outcome = await cache.fill(
            result.lease, row_value(self.binding, row), row_version(self.binding, row), row=[row_id]
        )
        self.counts["fills" if outcome is FillResult.FILLED else "fills_refused"] += 1


@pytest.fixture
def cluster_pipeline(
    mysql_service: MySQLService, kafka_bootstrap: str, redis_cluster: RedisClusterService, tmp_path: Path
) -> Iterator[Pipeline]:
    workdir = tmp_path / "pipeline"
    workdir.mkdir()
    p = Pipeline(
        mysql_service,
        kafka_bootstrap,
        redis_cluster.url,
        workdir,
        version_column=True,
        binding_extra=SEMANTIC,
        redis_cluster=True,
    )
    try:
        yield p
    finally:
        p.close()


def node_logs(p: Pipeline, cluster: redis.RedisCluster) -> list[BroadcastLog]:
    """One subscriber per master (plain clients), each logging the invalidation channel."""
    logs = []
    for node in cluster.get_primaries():  # type: ignore[no-untyped-call]
        log = BroadcastLog(redis.Redis(host=node.host, port=node.port), invalidation_channel(p.prefix))
        log.start()
        logs.append(log)
    return logs


class BlockingApp:
    """A synchronous application on the cluster: ``SyncCacheClient`` and ``ThreadedInvalidationListener``
    on blocking ``RedisCluster`` clients, sharing one L1; the test calls :meth:`read` itself."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.l1 = L1Cache(max_entries=1_000, max_bytes=8 * 1024 * 1024, ttl_s=600)
        self._client = redis.RedisCluster.from_url(p.redis_url)
        self._listener_client = redis.RedisCluster.from_url(p.redis_url)
        self.listener = ThreadedInvalidationListener(
            self._listener_client, invalidation_channel(p.prefix), [self.l1]
        )
        self.cache = SyncCacheClient(self._client, prefix=p.prefix, l1=self.l1)

    def start(self) -> None:
        self.listener.start()
        assert self.listener.subscribed.wait(10), "the blocking listener did not subscribe"

    def read(self, namespace: str, weights: KeyHashWeights, contents: dict[int, str]) -> int:
        """Read every row of ``contents`` (row -> content) twice; how many reads were L1 hits."""
        hits = 0
        for _ in range(2):
            for content in contents.values():
                result = self.cache.get(namespace, [semantic_row_key(weights, content)])
                hits += isinstance(result, Hit) and result.tier == "l1"
        return hits

    def stop(self) -> None:
        self.listener.stop()
        self._client.close()
        self._listener_client.close()


def l1_stale(l1: L1Cache, p: Pipeline, active: str) -> list[str]:
    """L1 entries L2 would not serve now: another signature, a newer version or a tombstone there."""
    found = []
    for key, held in l1.items():
        entry = parse_entry(key, p.redis.hgetall(key))  # type: ignore[arg-type]
        if held.signature != active or entry is None or entry.tombstone or entry.version > held.version:
            found.append(key)
    return found


@pytest.mark.timeout(400)
def test_the_worker_on_a_redis_cluster_with_leases_l1_a_cutover_and_a_slot_migration(
    cluster_pipeline: Pipeline, redis_cluster: RedisClusterService
) -> None:
    p = cluster_pipeline
    binding = parse_bindings(p.bindings_text).bindings[0]
    assert isinstance(p.redis, redis.RedisCluster)
    started = time.monotonic()
    p.start("connector")
    p.start("worker", **WORKER_ENV)
    path1, weights1 = make_weights(p, 11)
    path2, weights2 = make_weights(p, 12)
    publish(p, "1.0.0", path1)
    wait_cutover(p, 1)
    for row in ROWS:
        p.sql(INSERT, (row, f"setup {row}"))
    first = {
        row: entry_key(p.prefix, p.namespace, [semantic_row_key(weights1, f"setup {row}")]) for row in ROWS
    }
    p.wait(lambda: all(p.redis.exists(k) for k in first.values()), 60, "the rows under model 1")

    logs = node_logs(p, p.redis)
    app = ClusterApp(p, binding, weights1)
    blocking = BlockingApp(p)
    steady = {row: f"setup {row}" for row in STEADY}
    writer = SteadyWriter(lambda: p.mysql.connect(p.database), CHANGED, rate=RATE, present=CHANGED)
    try:
        app.start()
        blocking.start()
        assert blocking.read(p.namespace, weights1, steady) == len(steady), "no L1 hit in the blocking app"
        app.read()
        writer.start()
        time.sleep(3.0)

        # The namespace's slot moves under load.
        async def plan() -> Migration:
            client = p.async_redis()
            assert isinstance(client, aioredis.RedisCluster)
            try:
                await client.initialize()
                return Migration.plan(client, signature_key(p.prefix, p.namespace))
            finally:
                await client.aclose()

        migration = asyncio.run(plan())
        moved_at = time.monotonic()
        migration.begin()
        migration.move_keys(batch=4, pause_s=0.02)
        migration.finish()
        migration_s = time.monotonic() - moved_at
        assert migration.owner_seen_by_every_node() == {migration.target}
        time.sleep(2.0)

        # The cutover under the writer's load; the readers pause while the application changes model.
        app.pause()
        publish(p, "2.0.0", path2)
        report = wait_cutover(p, 2)
        active = report["signature"]
        p.wait(
            lambda: not l1_stale(app.l1, p, active) and not l1_stale(blocking.l1, p, active),
            10,
            "the L1s to drop every model-1 entry",
        )
        blocking_hits = blocking.read(p.namespace, weights2, steady)
        app.weights = weights2
        app.read()
        time.sleep(3.0)

        writer.stop()
        assert not writer.errors, writer.errors
        app.pause()
        p.wait_caught_up(timeout=90)
        time.sleep(WINDOW_MS / 1000)
        verification = p.run_verification(WINDOW_MS)
        stale_l1 = l1_stale(app.l1, p, active) + l1_stale(blocking.l1, p, active)
        # Pub/Sub reaches the other nodes over the cluster bus, a little later than the node published
        # on: give the last announcements time to arrive everywhere before comparing what each heard.
        settle_from = time.monotonic()
        while time.monotonic() - settle_from < 3.0 and len({len(log.snapshot()) for log in logs}) > 1:
            time.sleep(0.1)
        settled_s = time.monotonic() - settle_from
        for log in logs:
            log.stop()
        announced = [log.snapshot() for log in logs]
        violations = [v for node in announced for v in order_violations(node)]
        everything = {(a.kind, a.version, a.key) for node in announced for a in node}
        short = [len(everything - {(a.kind, a.version, a.key) for a in node}) for node in announced]
        stats = p.stats() or {}
        result = verification.reports[0]
        print(
            f"\ncluster end to end: {len(logs)} masters, writer {writer.total} changes at {RATE:.0f}/s"
            f" (c {writer.committed['c']} / u {writer.committed['u']} / d {writer.committed['d']});"
            f" slot {migration.slot} moved {migration.source} -> {migration.target} under load in"
            f" {migration_s:.1f} s ({migration.moved_keys} keys); cutover to model 2: {report.get('mode')},"
            f" prewarm {report.get('prewarm')}\n"
            f"application: {dict(app.counts)}, client {dict(app.cache_counts)}; L1 entries {len(app.l1)},"
            f" blocking app: L1 entries {len(blocking.l1)}, L1 hits after the cutover {blocking_hits};"
            f" stale in the L1s {len(stale_l1)};"
            f" listener subscribed on {app.listener_nodes}\n"
            f"announcements per node: {[len(a) for a in announced]}, short of all {len(everything)}:"
            f" {short} (after {settled_s:.1f} s for the last to arrive); order violations {len(violations)};"
            f" worker events {stats.get('events')}; tiers {stats.get('tiers')}\n"
            f"verify on the cluster: rows {result.rows}, checked {result.checked}, stale {result.stale},"
            f" in flight {result.in_flight}, missing {result.missing};"
            f" total {time.monotonic() - started:.0f} s"
        )
        assert not app.errors, app.errors[:5]
        assert result.stale == 0 and result.unverifiable is None, result.to_json()
        assert result.checked > 0
        assert not stale_l1, stale_l1[:5]
        assert all(log.disconnects == 0 for log in logs)
        assert not violations, violations[:5]
        # TRYAGAIN during the migration is a wait, not a refusal (it once dead-lettered a change here)
        assert "dead_lettered" not in (stats.get("events") or {}), stats.get("events")
        assert app.cache_counts["hits_l2"] > 0 and app.cache_counts["hits_l1"] > 0
        assert report["prewarm"]["written"] > 0, "no hot row was prewarmed under model 2"
        assert blocking.listener.subscribed.is_set() and blocking_hits > 0
    finally:
        writer.stop()
        app.stop()
        blocking.stop()
        for log in logs:
            log.stop()
