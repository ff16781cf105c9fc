"""The Redis tier's compare-and-set on a real Redis, next to a naive writer that shows the checks matter."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache_writer import CacheAction, Outcome, RedisTier
from cache_writer.entries import Entry, parse_entry

pytestmark = pytest.mark.integration


def W(key: str, version: int, value: bytes) -> CacheAction:
    return CacheAction("write", key, version, 1, value)


def D(key: str, version: int) -> CacheAction:
    return CacheAction("invalidate", key, version, 1)


async def naive_apply(client: aioredis.Redis, actions: Sequence[CacheAction]) -> None:
    """Protection off: what a writer without version checks does."""
    for a in actions:
        if a.kind == "write":
            await client.hset(a.key, mapping={"v": a.version, "d": a.value or b""})
            await client.hdel(a.key, "tomb")
        else:
            await client.delete(a.key)


def run(redis_url: str, body: Callable[[RedisTier, aioredis.Redis], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        tier = RedisTier(aioredis.Redis.from_url(redis_url), tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            return await body(tier, tier.client)
        finally:
            await tier.close()

    return asyncio.run(main())


async def _entry(client: aioredis.Redis, key: str) -> Entry | None:
    return parse_entry(key, await client.hgetall(key))


SCENARIOS = {
    "replayed older write": [W("k", 2, b"new"), W("k", 1, b"old")],
    "reordered writes": [W("k", 3, b"newest"), W("k", 2, b"older"), W("k", 1, b"oldest")],
    "late write after delete": [W("k", 1, b"v1"), D("k", 3), W("k", 2, b"v2")],
    "replayed insert after delete": [W("k", 1, b"v1"), D("k", 2), W("k", 1, b"v1")],
}
EXPECTED = {
    "replayed older write": (2, b"new"),
    "reordered writes": (3, b"newest"),
    "late write after delete": (3, None),
    "replayed insert after delete": (2, None),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_versions_only_go_forward_and_a_naive_writer_goes_back(redis_url: str, name: str) -> None:
    key = f"test:{{{uuid.uuid4().hex}}}:1"
    actions = [CacheAction(a.kind, key, a.version, a.commit_ts_us, a.value) for a in SCENARIOS[name]]
    naive_key = key + ":naive"
    naive_actions = [CacheAction(a.kind, naive_key, a.version, a.commit_ts_us, a.value) for a in actions]

    async def body(
        tier: RedisTier, client: aioredis.Redis
    ) -> tuple[Entry | None, Entry | None, list[Outcome]]:
        results = await tier.apply(actions)
        await naive_apply(client, naive_actions)
        return await _entry(client, key), await _entry(client, naive_key), [r.outcome for r in results]

    entry, naive, outcomes = run(redis_url, body)
    version, value = EXPECTED[name]
    assert entry is not None and (entry.version, entry.value) == (version, value)
    assert outcomes[-1] is Outcome.NOT_NEWER
    assert naive is None or (naive.version, naive.value) != (version, value), (
        "the naive writer should go wrong"
    )


def test_versions_compare_as_64_bit_integers_not_strings_or_doubles(redis_url: str) -> None:
    key = f"test:{{{uuid.uuid4().hex}}}:big"
    big = 2**64 - 1

    async def body(tier: RedisTier, client: aioredis.Redis) -> tuple[list[Outcome], Entry | None]:
        results = await tier.apply(
            [W(key, 9, b"a"), W(key, 10, b"b"), W(key, big - 1, b"c"), W(key, big, b"d")]
        )
        results += await tier.apply([W(key, big - 1, b"e"), W(key, 99, b"f")])
        return [r.outcome for r in results], await _entry(client, key)

    outcomes, entry = run(redis_url, body)
    assert outcomes == [Outcome.APPLIED] * 4 + [Outcome.NOT_NEWER] * 2
    assert entry is not None and entry.version == big and entry.value == b"d"


def test_scripts_reload_after_a_script_flush(redis_url: str) -> None:
    key = f"test:{{{uuid.uuid4().hex}}}:1"

    async def body(tier: RedisTier, client: aioredis.Redis) -> Entry | None:
        await client.script_flush()
        await tier.apply([W(key, 1, b"x")])
        return await _entry(client, key)

    entry = run(redis_url, body)
    assert entry is not None and entry.value == b"x"


def test_concurrent_writers_in_any_order_end_at_the_newest_version(redis_url: str) -> None:
    keys = [f"test:{{{uuid.uuid4().hex}}}:{i}" for i in range(20)]
    rng = random.Random(5)
    batches: list[list[CacheAction]] = [[] for _ in range(8)]
    for key in keys:
        for version in range(1, 41):
            action = D(key, version) if version % 7 == 0 else W(key, version, b"v%d" % version)
            rng.choice(batches).append(action)
    for batch in batches:
        rng.shuffle(batch)

    async def body(tier: RedisTier, client: aioredis.Redis) -> list[Entry | None]:
        await asyncio.gather(*(tier.apply(batch) for batch in batches))
        return [await _entry(client, key) for key in keys]

    for entry in run(redis_url, body):
        assert entry is not None and entry.version == 40 and entry.value == b"v40"
