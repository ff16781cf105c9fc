"""An L2 that comes back with an older data set: a Redis restarted from a snapshot taken before the latest
changes holds entries older than the database, and nothing about them says so. The worker finds it by the
server's identity (``RedisTier.incarnation``: the ``run_id`` its data set was last seen under) and fences
every namespace, so those entries are never served again.

Real servers: a private redis-server with its own directory (restarted on the same port, it loads the
snapshot ``SAVE`` wrote there), the session's MariaDB and Kafka broker, a connector and a worker as child
processes. Staleness is judged as ``freshkey verify`` judges it (an entry of a signature that is not the
active one is never served).

An outer tier (L3) restored that way is skipped, flushed and trusted again, as after an outage.

Negative controls: the same scenarios with ``FRESHKEY_REDIS_FENCE_ON_RESTORE=false`` end with the restored
entry served, stale (L2), and still held (L3).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis as redis_sync

from pipeline.embedded.redis import LocalRedis
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService

pytestmark = pytest.mark.integration

INSERT = (
    "INSERT INTO assets (id, modality, content, embedding, updated_at) "
    "VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))"
)
UPDATE = "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s"
WINDOW_MS = 1000.0


def _restore_an_older_snapshot(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path, *, fence: bool
) -> tuple[int, str]:
    """Run the scenario; (stale entries as freshkey verify counts them, the pipeline's logs)."""
    workdir = tmp_path / "redis"
    server = LocalRedis(workdir=workdir).start()
    p = Pipeline(mysql_service, kafka_bootstrap, server.url, tmp_path, version_column=False)
    try:
        env = {"FRESHKEY_REDIS_FENCE_ON_RESTORE": "true" if fence else "false"}
        p.start("connector", **env)
        p.start("worker", **env)
        p.sql(INSERT, (1, "before the snapshot"))
        p.wait_consistent()
        time.sleep(1.5)  # the worker has recorded the server's identity (at its start, then every second)
        with redis_sync.Redis.from_url(server.url) as client:
            assert client.save()  # dump.rdb: the entry as it is now
        p.sql(UPDATE, ("after the snapshot", 1))
        p.wait_consistent()

        port = server.port
        server.stop()
        server = LocalRedis(workdir=workdir, port=port).start()  # loads dump.rdb: the older entry is back
        entry = p.entries()[f"{p.prefix}:{{{p.namespace}}}:1"]
        assert "before the snapshot" in str(entry.value), entry

        if fence:
            p.wait(lambda: "fencing every namespace" in p.logs(), 20, "the worker's fence")
        else:
            said = "not fenced (FRESHKEY_REDIS_FENCE_ON_RESTORE=false)"
            p.wait(lambda: said in p.logs(), 20, "the warning")
        verification = p.run_verification(WINDOW_MS)
        p.check_alive()
        return verification.stale, p.logs()
    finally:
        p.close()
        server.stop()


def test_a_redis_restored_from_an_older_snapshot_is_fenced(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    stale, logs = _restore_an_older_snapshot(mysql_service, kafka_bootstrap, tmp_path, fence=True)
    assert stale == 0, logs
    print("\nL2 restored from an older snapshot: fenced, 0 stale")


def test_without_the_fence_the_restored_entry_is_served_stale(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    stale, _ = _restore_an_older_snapshot(mysql_service, kafka_bootstrap, tmp_path, fence=False)
    assert stale == 1, "the negative control: without the fence the restored entry is served"


def test_a_redis_that_came_back_empty_is_not_fenced(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A restart without a snapshot loses every entry: nothing is stale, so nothing is fenced (the cache
    stays warm-able, no epoch moves), while the identity is recorded again."""
    server = LocalRedis(workdir=tmp_path / "redis").start()
    p = Pipeline(mysql_service, kafka_bootstrap, server.url, tmp_path, version_column=False)
    try:
        p.start("connector")
        p.start("worker")
        p.sql(INSERT, (1, "one"))
        p.wait_consistent()
        port = server.port
        server.stop()
        server = LocalRedis(workdir=tmp_path / "redis2", port=port).start()  # no snapshot: empty
        p.sql(INSERT, (2, "two"))
        p.wait(lambda: f"{p.prefix}:{{{p.namespace}}}:2" in p.entries(), 60, "row 2 in the new Redis")

        async def recorded() -> bytes | None:
            client = p.async_redis()
            try:
                value: bytes | None = await client.get(f"{p.prefix}:incarnation")
                return value
            finally:
                await client.aclose()

        p.wait(lambda: asyncio.run(recorded()) is not None, 10, "the identity recorded again")
        assert "fencing every namespace" not in p.logs()
    finally:
        p.close()
        server.stop()


def _restore_l3(mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path, *, fence: bool) -> bytes:
    """An outer tier (L3) restarted from a snapshot older than its entries; what it holds for row 1 after
    the worker had the time to act on it (b"" for no entry)."""
    l2 = LocalRedis(workdir=tmp_path / "l2").start()
    workdir = tmp_path / "l3"
    l3 = LocalRedis(workdir=workdir).start()
    p = Pipeline(mysql_service, kafka_bootstrap, l2.url, tmp_path, version_column=False)
    key = f"{p.prefix}:{{{p.namespace}}}:1"

    def l3_value() -> bytes:
        with redis_sync.Redis.from_url(l3.url) as client:
            value = client.hget(key, "d")  # the entry's data (cache_writer.entries)
        return value or b""

    try:
        env = {"FRESHKEY_REDIS_L3_URL": l3.url, "FRESHKEY_REDIS_FENCE_ON_RESTORE": str(fence).lower()}
        p.start("connector")
        p.start("worker", **env)
        p.sql(INSERT, (1, "before the snapshot"))
        p.wait(lambda: b"before the snapshot" in l3_value(), 60, "row 1 in L3")
        time.sleep(1.5)  # the worker has recorded L3's identity
        with redis_sync.Redis.from_url(l3.url) as client:
            assert client.save()
        p.sql(UPDATE, ("after the snapshot", 1))
        p.wait(lambda: b"after the snapshot" in l3_value(), 60, "the update in L3")

        port = l3.port
        l3.stop()
        l3 = LocalRedis(workdir=workdir, port=port).start()  # the older entry is back in L3
        assert b"before the snapshot" in l3_value()
        if fence:
            p.wait(lambda: "flushed before it is trusted again" in p.logs(), 20, "the fence of L3")
            p.wait(lambda: "answers again: flushed" in p.logs(), 30, "L3 flushed and trusted again")
        else:
            said = "not fenced (FRESHKEY_REDIS_FENCE_ON_RESTORE=false)"
            p.wait(lambda: said in p.logs(), 20, "the warning")
            time.sleep(3)  # as long as the fenced case takes to flush: the older entry stays all along
        p.check_alive()
        return l3_value()
    finally:
        p.close()
        l3.stop()
        l2.stop()


def test_an_l3_restored_from_an_older_snapshot_is_flushed_before_it_is_trusted(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    assert b"before the snapshot" not in _restore_l3(mysql_service, kafka_bootstrap, tmp_path, fence=True)


def test_without_the_fence_the_restored_l3_keeps_the_older_entry(
    mysql_service: MySQLService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    held = _restore_l3(mysql_service, kafka_bootstrap, tmp_path, fence=False)
    assert b"before the snapshot" in held, "the negative control: L3 still holds the restored entry"
