"""The Redis tier's compare-and-set on a real Redis, next to a naive writer that shows the checks matter."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache_writer import Outcome, RedisTier
from cache_writer.entries import Entry
from cache_writer.hotness import HitRecorder
from cache_writer.layout import entry_key, latest_verification_key, signature_key
from cache_writer.signatures import SignatureRecord
from schemas.model_updates import SemVer, signature_order
from tests.support.cas import SCENARIOS, D, W, check_scenario, read_entry, shuffled_batches

pytestmark = pytest.mark.integration


def run(redis_url: str, body: Callable[[RedisTier, aioredis.Redis], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        tier = RedisTier(aioredis.Redis.from_url(redis_url), tombstone_ttl_ms=60_000)
        try:
            await tier.load_scripts()
            return await body(tier, tier.client)
        finally:
            await tier.close()

    return asyncio.run(main())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_versions_only_go_forward_and_a_naive_writer_goes_back(redis_url: str, name: str) -> None:
    run(redis_url, lambda tier, client: check_scenario(tier, client, name))


def test_versions_compare_as_64_bit_integers_not_strings_or_doubles(redis_url: str) -> None:
    key = f"test:{{{uuid.uuid4().hex}}}:big"
    big = 2**64 - 1

    async def body(tier: RedisTier, client: aioredis.Redis) -> tuple[list[Outcome], Entry | None]:
        results = await tier.apply(
            [W(key, 9, b"a"), W(key, 10, b"b"), W(key, big - 1, b"c"), W(key, big, b"d")]
        )
        results += await tier.apply([W(key, big - 1, b"e"), W(key, 99, b"f")])
        return [r.outcome for r in results], await read_entry(client, key)

    outcomes, entry = run(redis_url, body)
    assert outcomes == [Outcome.APPLIED] * 4 + [Outcome.NOT_NEWER] * 2
    assert entry is not None and entry.version == big and entry.value == b"d"


def test_scripts_reload_after_a_script_flush(redis_url: str) -> None:
    key = f"test:{{{uuid.uuid4().hex}}}:1"

    async def body(tier: RedisTier, client: aioredis.Redis) -> Entry | None:
        await client.script_flush()
        await tier.apply([W(key, 1, b"x")])
        return await read_entry(client, key)

    entry = run(redis_url, body)
    assert entry is not None and entry.value == b"x"


def test_concurrent_writers_in_any_order_end_at_the_newest_version(redis_url: str) -> None:
    keys = [f"test:{{{uuid.uuid4().hex}}}:{i}" for i in range(20)]
    batches = shuffled_batches(keys, 40, seed=5)

    async def body(tier: RedisTier, client: aioredis.Redis) -> list[Entry | None]:
        await asyncio.gather(*(tier.apply(batch) for batch in batches))
        return [await read_entry(client, key) for key in keys]

    for entry in run(redis_url, body):
        assert entry is not None and entry.version == 40 and entry.value == b"v40"


# --- the rest of the tier contract: reads, documents, flush, hit counts, outages -------------------------


def test_the_tier_reads_entries_and_fields_and_scans_only_its_namespace(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    namespace = "a*b"  # a glob character: the scan must match it literally
    keys = [entry_key(prefix, namespace, [i]) for i in range(3)]
    other = entry_key(prefix, "aXb", [0])  # what an unescaped pattern 'a*b' would match too

    async def body(tier: RedisTier, client: aioredis.Redis) -> None:
        await tier.apply([W(keys[0], 1, b"v0"), W(keys[1], 2, b"v1"), D(keys[2], 9), W(other, 1, b"o")])
        entries = await tier.read_entries([keys[0], keys[0], keys[2], f"{prefix}:{{{namespace}}}:absent"])
        assert len(entries) == 3, "one read per key"
        assert entries[keys[0]] is not None and entries[keys[0]].value == b"v0"  # type: ignore[union-attr]
        assert entries[keys[2]] is not None and entries[keys[2]].tombstone  # type: ignore[union-attr]
        assert list(entries.values())[-1] is None
        assert set(await tier.read_namespace(prefix, namespace)) == set(keys)
        assert await tier.read_fields(keys, ("v", "d")) == [[b"1", b"v0"], [b"2", b"v1"], [b"9", None]]
        assert await tier.read_fields([], ("v",)) == [] and await tier.read_entries([]) == {}
        await client.set(latest_verification_key(prefix), b'{"stale":0}')
        assert await tier.get(latest_verification_key(prefix)) == b'{"stale":0}'
        assert await tier.get(f"{prefix}:absent") is None

    run(redis_url, body)


def test_flush_empties_every_namespace_of_the_prefix_but_keeps_the_signatures(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    keys = [entry_key(prefix, ns, [i]) for ns in ("a", "b") for i in range(3)]
    record = SignatureRecord("1" * 64, signature_order(SemVer.parse("1.0.0")), b"{}", ("a",))

    async def body(tier: RedisTier, client: aioredis.Redis) -> tuple[int, int, bool, bool]:
        await tier.apply([W(k, 1, b"v") for k in keys] + [W(f"{prefix}x:{{a}}:1", 1, b"another prefix")])
        await tier.set_signature(prefix, "a", record)
        removed = await tier.flush(prefix, batch=2)
        left = sum([await client.exists(k) for k in keys])
        return (
            removed,
            left,
            bool(await client.exists(signature_key(prefix, "a"))),
            bool(await client.exists(f"{prefix}x:{{a}}:1")),
        )

    removed, left, signature_kept, other_kept = run(redis_url, body)
    assert (removed, left) == (6, 0)
    assert signature_kept and other_kept


def test_hit_counts_are_read_in_a_consumer_group_and_acknowledged(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"

    async def body(tier: RedisTier, client: aioredis.Redis) -> None:
        assert await tier.read_hits(prefix, "g", "c1") == [], "no stream yet: the group is created"
        recorder = HitRecorder(prefix)
        recorder.record("fk:{a}:1", 3)
        assert await recorder.flush(client) == 1
        await client.xadd(f"{prefix}:hits", {"h": b"not json"})
        (first, counts), (second, junk) = await tier.read_hits(prefix, "g", "c1")
        assert counts["fk:{a}:1"][0] == 3 and junk == {}
        assert await tier.read_hits(prefix, "g", "c2") == [], "a message goes to one consumer of the group"
        await tier.ack_hits(prefix, "g", [first, second])
        assert (await client.xpending(f"{prefix}:hits", "g"))["pending"] == 0

    run(redis_url, body)
