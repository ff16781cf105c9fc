"""The compare-and-set scenarios of invariants 1 and 2, shared by the Redis tier and Redis Cluster tests.

Each scenario is a list of cache actions whose last one must be refused (a replay, a reordered or a late
write); :func:`check_scenario` applies it through the tier and, on a neighbouring key, through
:func:`naive_apply` (a writer without version checks) and asserts that the tier ends at the expected
entry while the naive writer does not: the same check fails without the protection.

:func:`run_client_and_tier` gives a test an application client and the worker's tier on one Redis, under
a prefix of its own.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from cache_writer import CacheAction, Outcome, RedisTier
from cache_writer.client import CacheClient
from cache_writer.entries import Entry, parse_entry
from cache_writer.layout import invalidation_channel


def W(key: str, version: int, value: bytes) -> CacheAction:
    """A write of ``value`` at ``version``."""
    return CacheAction("write", key, version, 1, value)


def D(key: str, version: int) -> CacheAction:
    """An invalidation (a delete's tombstone) at ``version``."""
    return CacheAction("invalidate", key, version, 1)


async def naive_apply(client: Any, actions: Sequence[CacheAction]) -> None:
    """Protection off: what a writer without version checks does (a Redis or a Redis Cluster client)."""
    for a in actions:
        if a.kind == "write":
            await client.hset(a.key, mapping={"v": a.version, "d": a.value or b""})
            await client.hdel(a.key, "tomb")
        else:
            await client.delete(a.key)


async def read_entry(client: Any, key: str) -> Entry | None:
    """The entry at ``key`` as the tier stores it, or None."""
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
"""The (version, value) each scenario must end at; a tombstone has no value."""


def shuffled_batches(
    keys: Sequence[str], versions: int, seed: int, batches: int = 8
) -> list[list[CacheAction]]:
    """Versions 1..``versions`` of every key (every 7th an invalidation, the others writes of ``v<n>``),
    dealt at random into ``batches`` batches and shuffled within each: applied concurrently, they reach
    Redis in any order, and every key must end at version ``versions``."""
    rng = random.Random(seed)
    dealt: list[list[CacheAction]] = [[] for _ in range(batches)]
    for key in keys:
        for version in range(1, versions + 1):
            action = D(key, version) if version % 7 == 0 else W(key, version, b"v%d" % version)
            rng.choice(dealt).append(action)
    for batch in dealt:
        rng.shuffle(batch)
    return dealt


async def check_scenario(tier: RedisTier, client: Any, name: str) -> None:
    """Apply :data:`SCENARIOS` ``name`` on a fresh key (one hash tag: a cluster runs it on one node)
    through ``tier`` and through the naive writer; the tier ends at :data:`EXPECTED` and refuses the last
    action, the naive writer ends elsewhere."""
    key = f"test:{{{uuid.uuid4().hex}}}:1"
    actions = [CacheAction(a.kind, key, a.version, a.commit_ts_us, a.value) for a in SCENARIOS[name]]
    naive_key = key + ":naive"
    naive_actions = [CacheAction(a.kind, naive_key, a.version, a.commit_ts_us, a.value) for a in actions]
    results = await tier.apply(actions)
    await naive_apply(client, naive_actions)
    entry, naive = await read_entry(client, key), await read_entry(client, naive_key)
    version, value = EXPECTED[name]
    assert entry is not None and (entry.version, entry.value) == (version, value)
    assert results[-1].outcome is Outcome.NOT_NEWER
    assert naive is None or (naive.version, naive.value) != (version, value), (
        "the naive writer should go wrong"
    )


def run_client_and_tier(
    redis_url: str, body: Callable[[CacheClient, RedisTier, str], Awaitable[Any]], **client_options: Any
) -> Any:
    """Run ``body(client, tier, prefix)`` to completion: an application :class:`CacheClient` (with
    ``client_options``) and the worker's :class:`RedisTier` (broadcasting on the prefix's invalidation
    channel) on ``redis_url``, under a fresh key prefix; both closed afterwards."""
    prefix = f"t{uuid.uuid4().hex[:8]}"

    async def main() -> Any:
        client = aioredis.Redis.from_url(redis_url)
        tier = RedisTier(
            aioredis.Redis.from_url(redis_url), tombstone_ttl_ms=60_000, channel=invalidation_channel(prefix)
        )
        try:
            return await body(CacheClient(client, prefix=prefix, **client_options), tier, prefix)
        finally:
            await tier.close()
            await client.aclose()

    return asyncio.run(main())
