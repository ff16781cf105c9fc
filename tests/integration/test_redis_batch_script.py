"""``apply_batch.lua`` against the single-key scripts on a real Redis: the same outcomes, the same hashes.

:meth:`RedisTier.apply` sends the actions of one hash slot as calls of the batch script, which is built
from the two single-key scripts' functions. Here generated sequences of writes and invalidations (equal,
older and newer versions, tombstones, signatures and rows, values of any text, 64-bit versions) go once
through a tier that makes only single-key calls and once through batch calls of random sizes, each into
its own namespace; every answer and every resulting hash (and whether it expires) must be the same. A
sequence applied in another order shows that the comparison catches an order that is not kept.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_writer import CacheAction, Outcome, RedisTier
from cache_writer.layout import entry_key, signature_key
from cache_writer.redis import tier as tier_module
from tests.support.services import RedisClusterService
from tests.support.slots import Migration

pytestmark = pytest.mark.integration

PREFIX = "tb"
SIGNATURES = ("sig-active", "sig-pending", "sig-old", "")
ROWS = 4


def _actions(namespace: str, steps: Sequence[tuple[Any, ...]]) -> list[CacheAction]:
    actions = []
    for kind, row, version, commit, value, signature, row_key in steps:
        key = entry_key(PREFIX, namespace, [row])
        if kind == "i":
            actions.append(CacheAction("invalidate", key, version, commit))
        else:
            actions.append(
                CacheAction(
                    "write",
                    key,
                    version,
                    commit,
                    value.encode(),
                    signature=signature or None,
                    row=row_key or None,
                )
            )
    return actions


_step = st.tuples(
    st.sampled_from(["w", "w", "i"]),
    st.integers(0, ROWS - 1),
    st.one_of(st.integers(1, 6), st.integers(2**64 - 3, 2**64 - 1)),
    st.integers(0, 2**53),
    st.text(max_size=40),  # any text: quotes, backslashes, NUL, astral characters
    st.sampled_from(SIGNATURES),
    st.sampled_from(["", "7", "a/b%2F"]),
)


async def _state(client: aioredis.Redis, namespace: str) -> list[tuple[dict[bytes, bytes], bool]]:
    state = []
    for row in range(ROWS):
        key = entry_key(PREFIX, namespace, [row])
        fields = await client.hgetall(key)
        state.append((fields, await client.pttl(key) > 0))
    return state


async def _run(
    redis_url: str, steps: Sequence[tuple[Any, ...]], split: Sequence[int], script_batch: int, tier_cls: type
) -> tuple[list[list[tuple[Outcome, int | None]]], list[Any]]:
    namespace = uuid.uuid4().hex
    client = aioredis.Redis.from_url(redis_url)
    tier = tier_cls(client, tombstone_ttl_ms=60_000, entry_ttl_ms=3_600_000, script_batch=script_batch)
    try:
        await tier.load_scripts()
        await client.hset(signature_key(PREFIX, namespace), mapping={"s": "sig-active", "ps": "sig-pending"})
        actions = _actions(namespace, steps)
        answers = []
        start = 0
        for size in [*split, len(actions)]:  # the same calls of apply() for both tiers
            chunk = actions[start : start + size] if size else actions[start:]
            start += len(chunk)
            if chunk:
                results = await tier.apply(chunk)
                answers.append([(r.outcome, r.previous_version) for r in results])
        return answers, await _state(client, namespace)
    finally:
        await tier.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(_step, min_size=1, max_size=40),
    split=st.lists(st.integers(0, 20), max_size=3),
    script_batch=st.integers(2, 12),
)
def test_the_batch_script_answers_and_writes_as_the_single_key_scripts(
    redis_url: str, steps: list[tuple[Any, ...]], split: list[int], script_batch: int
) -> None:
    async def both() -> tuple[Any, Any]:
        single = await _run(redis_url, steps, split, 1, RedisTier)
        batched = await _run(redis_url, steps, split, script_batch, RedisTier)
        return single, batched

    single, batched = asyncio.run(both())
    assert batched[0] == single[0], "outcomes"
    assert batched[1] == single[1], "hashes"


def test_a_batch_that_does_not_keep_the_order_is_caught(redis_url: str) -> None:
    """The comparison above can fail: the same actions in another order leave other hashes."""
    steps = [("w", 0, 5, 1, "first", "", ""), ("w", 0, 5, 1, "second, refused", "", "")]
    steps += [("i", 1, 3, 1, "", "", ""), ("w", 1, 4, 1, "after the tombstone", "", "")]

    async def both() -> tuple[Any, Any]:
        single = await _run(redis_url, steps, [], 1, RedisTier)
        reversed_ = await _run(redis_url, list(reversed(steps)), [], 1, RedisTier)
        return single, reversed_

    single, reordered = asyncio.run(both())
    assert reordered[0] != single[0] and reordered[1] != single[1]


def test_an_action_that_fails_in_a_batch_leaves_the_others_applied(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    keys = [entry_key(PREFIX, namespace, [i]) for i in range(6)]

    async def body() -> tuple[list[Any], list[bytes | None]]:
        client = aioredis.Redis.from_url(redis_url)
        tier = RedisTier(client, tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            await client.set(keys[2], "a string, not a hash")
            actions = [CacheAction("write", k, 7, 1, b"v") for k in keys]
            assert tier.batch_command(actions) is not None
            results = await tier.apply(actions)
            stored = [await client.hget(k, "v") if k != keys[2] else None for k in keys]
            return [(r.outcome, r.error) for r in results], stored
        finally:
            await tier.close()

    results, stored = asyncio.run(body())
    assert [outcome for outcome, _ in results] == [Outcome.APPLIED] * 2 + [Outcome.FAILED] + [
        Outcome.APPLIED
    ] * 3
    assert "WRONGTYPE" in (results[2][1] or "")
    assert stored == [b"7", b"7", None, b"7", b"7", b"7"]


def test_values_that_are_not_text_go_as_single_key_calls(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    keys = [entry_key(PREFIX, namespace, [i]) for i in range(5)]
    raw = bytes(range(256))

    async def body() -> tuple[list[Outcome], list[bytes | None], int]:
        client = aioredis.Redis.from_url(redis_url)
        tier = RedisTier(client, tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            actions = [CacheAction("write", k, 3, 1, raw if i == 1 else b"text") for i, k in enumerate(keys)]
            commands = tier._plan(actions)
            results = await tier.apply(actions)
            return [r.outcome for r in results], [await client.hget(k, "d") for k in keys], len(commands)
        finally:
            await tier.close()

    outcomes, values, commands = asyncio.run(body())
    assert commands == len(keys), "one single-key call per action"
    assert outcomes == [Outcome.APPLIED] * len(keys)
    assert values == [b"text", raw, b"text", b"text", b"text"]


def test_the_batch_script_is_reloaded_after_a_script_flush(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    keys = [entry_key(PREFIX, namespace, [i]) for i in range(8)]

    async def body() -> tuple[list[Outcome], int, bool]:
        client = aioredis.Redis.from_url(redis_url)
        tier = RedisTier(client, tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            await client.script_flush()
            results = await tier.apply([CacheAction("write", k, 2, 1, b"v") for k in keys])
            loaded = await client.script_exists(tier_module.BATCH.sha)
            return [r.outcome for r in results], tier.redirects.noscript, bool(loaded[0])
        finally:
            await tier.close()

    outcomes, refused, loaded = asyncio.run(body())
    assert outcomes == [Outcome.APPLIED] * len(keys)
    assert refused == 1, "one batch call refused, reloaded and sent again"
    assert loaded


def test_the_batch_script_is_built_from_the_single_key_scripts() -> None:
    """One copy of each rule: the batch script holds both functions, and each single-key script ends
    with the one call of its own function."""
    text = tier_module.BATCH.text
    assert "local function write_if_newer(" in text and "local function invalidate_if_not_newer(" in text
    assert tier_module.SINGLE_CALL_MARK not in text
    for script in (tier_module.scripts.WRITE, tier_module.scripts.INVALIDATE):
        tail = script.text.split(tier_module.SINGLE_CALL_MARK, 1)[1].strip().splitlines()
        assert len(tail) == 2 and tail[1].startswith("return "), tail


def test_a_slot_mid_migration_goes_as_single_key_calls_in_order(redis_cluster: RedisClusterService) -> None:
    """With half a namespace's keys moved, its batch call is refused with TRYAGAIN (keys on two nodes):
    the actions go again as single-key calls, in order (two versions of one key: the later one stays),
    and the slot's next batches go that way at once (no TRYAGAIN rounds per batch)."""
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    keys = [f"fk:{{{namespace}}}:{i}" for i in range(40)]

    async def body() -> tuple[list[Outcome], list[Outcome], list[bytes | None], int, int, bool]:
        client = redis_cluster.client()
        tier = RedisTier(client, tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            first = await tier.apply([CacheAction("write", k, 1, 1, b"v1") for k in keys])
            assert first[0].outcome is Outcome.APPLIED and tier.redirects.tryagain == 0
            migration = Migration.plan(client, keys[0])
            migration.begin()
            try:
                migration.move_keys(limit=20)
                actions = [CacheAction("write", k, 2, 1, b"v2") for k in keys]
                actions += [
                    CacheAction("write", keys[0], 3, 1, b"v3"),
                    CacheAction("invalidate", keys[1], 3, 1),
                ]
                results = await tier.apply(actions)
                refused = tier.redirects.tryagain
                later = await tier.apply([CacheAction("write", k, 4, 1, b"v4") for k in keys[5:]])
                held = tier.redirects.tryagain == refused
            finally:
                migration.finish()
            stored = [await client.hget(k, "d") for k in keys[:3]]
            return (
                [r.outcome for r in results],
                [r.outcome for r in later],
                stored,
                refused,
                len(results),
                held,
            )
        finally:
            await tier.close()

    outcomes, later, stored, refused, answered, held = asyncio.run(body())
    assert refused >= 1, "the batch call was refused at least once (the situation under test)"
    assert answered == 42 and outcomes == [Outcome.APPLIED] * 42
    assert later == [Outcome.APPLIED] * 35 and held
    assert stored == [b"v3", None, b"v2"]
