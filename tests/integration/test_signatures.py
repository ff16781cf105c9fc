"""Schema signatures on a real Redis: forward-only compare-and-set, entries of another signature never
served (L2 read script, fills, L1), the equal-version rebuild rule, and the sweep (invariant 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache_writer import CacheAction, RedisTier
from cache_writer.client import CacheClient, FillResult, Hit, Miss
from cache_writer.l1 import InvalidationListener, L1Cache
from cache_writer.layout import invalidation_channel, signature_key
from cache_writer.redis import scripts
from cache_writer.signatures import SignatureRecord, read_signatures, set_signature
from cache_writer.sweep import sweep_namespace
from schemas.model_updates import SemVer, signature_order
from tests.support.cas import run_client_and_tier

pytestmark = pytest.mark.integration

NS = "assets"
S1, S2, S3 = "1" * 64, "2" * 64, "3" * 64


def record(signature: str, version: str, sequence: int = 0) -> SignatureRecord:
    return SignatureRecord(signature, signature_order(SemVer.parse(version), sequence), b"{}", ("a",))


def W(key: str, version: int, value: bytes, signature: str | None) -> CacheAction:
    return CacheAction("write", key, version, 1, value, signature=signature)


def test_the_signature_only_moves_forward(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        r = tier.client
        assert (await set_signature(r, prefix, NS, record(S2, "2.0.0"))).applied
        for older in (
            record(S1, "1.9.9"),
            record(S1, "2.0.0"),
            record(S1, "2.0.0-rc.1"),
            record(S1, "2.0.0+b"),
        ):
            result = await set_signature(r, prefix, NS, older)
            assert not result.applied and result.previous == S2, f"{older.order!r} moved it backwards"
        assert (await read_signatures(r, prefix, [NS]))[NS].active_signature == S2
        # a schema change of the same model version orders after it by its sequence, and only forward
        assert (await set_signature(r, prefix, NS, record(S3, "2.0.0", sequence=7))).applied
        assert not (await set_signature(r, prefix, NS, record(S2, "2.0.0", sequence=6))).applied
        # pending: above the active order and not below the pending one; the switch clears it
        assert not (await set_signature(r, prefix, NS, record(S1, "1.0.0"), mode="pending")).applied
        assert (await set_signature(r, prefix, NS, record(S1, "3.0.0"), mode="pending")).applied
        assert (await set_signature(r, prefix, NS, record(S1, "3.0.0"), mode="pending")).applied, "replay"
        state = (await read_signatures(r, prefix, [NS]))[NS]
        assert state.active_signature == S3 and state.pending is not None and state.pending.signature == S1
        assert (await set_signature(r, prefix, NS, record(S1, "3.0.0"))).applied
        state = (await read_signatures(r, prefix, [NS]))[NS]
        assert state.active_signature == S1 and state.pending is None

    run_client_and_tier(redis_url, body)


def test_an_entry_of_another_signature_is_never_served_and_the_check_can_fail(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        r = tier.client
        key = client.key(NS, ["abc"])
        await set_signature(r, prefix, NS, record(S1, "1.0.0"))
        await tier.apply([W(key, 5, b'"old model"', S1)])
        hit = await client.get(NS, ["abc"])
        assert isinstance(hit, Hit) and hit.signature == S1 and hit.value == b'"old model"'

        # the cutover: one write, no scan
        assert (await set_signature(r, prefix, NS, record(S2, "2.0.0"))).applied
        miss = await client.get(NS, ["abc"])
        assert isinstance(miss, Miss) and miss.lease is not None, "an old-signature entry was served"
        assert miss.lease.signature == S2 and miss.lease.held_version == 5

        # Protection off: the same read without the signature check serves the old model's entry.
        sha = await r.script_load(scripts.GET_OR_LEASE.text)
        unchecked = await r.evalsha(sha, 1, key, "token", 2000)  # type: ignore[misc]
        assert unchecked[0] == 1 and unchecked[2] == b'"old model"', "without the check it is served"

        # a fill under the new signature lands and is served
        assert await client.fill(miss.lease, b'"new model"', None, row=[42]) is FillResult.FILLED
        hit = await client.get(NS, ["abc"])
        assert isinstance(hit, Hit) and hit.value == b'"new model"' and hit.signature == S2
        assert await r.hget(key, "k") == b"42" and await r.hget(key, "s") == S2.encode()

    run_client_and_tier(redis_url, body)


def test_a_fill_across_a_cutover_is_refused(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        await set_signature(tier.client, prefix, NS, record(S1, "1.0.0"))
        miss = await client.get(NS, ["x"])
        assert isinstance(miss, Miss) and miss.lease is not None and miss.lease.signature == S1
        await set_signature(tier.client, prefix, NS, record(S2, "2.0.0"))  # while the reader loads
        assert await client.fill(miss.lease, b'"built by model 1"', 3) is FillResult.SIGNATURE
        again = await client.get(NS, ["x"])
        assert isinstance(again, Miss)

    run_client_and_tier(redis_url, body)


def test_equal_version_rebuilds_replace_only_towards_the_active_signature(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        key = client.key(NS, [1])
        await set_signature(tier.client, prefix, NS, record(S1, "1.0.0"))
        await tier.apply([W(key, 9, b'"v1"', S1)])
        await set_signature(tier.client, prefix, NS, record(S2, "2.0.0"))
        # an old-signature write of the same version does not replace; the active one does
        [stale] = await tier.apply([W(key, 9, b'"v2"', S3)])
        assert stale.outcome.value == "not_newer"
        [rebuilt] = await tier.apply([W(key, 9, b'"v2"', S2)])
        assert rebuilt.outcome.value == "applied"
        [back] = await tier.apply([W(key, 9, b'"v1 again"', S1)])
        assert back.outcome.value == "not_newer", "an old signature replaced the rebuild"
        [older] = await tier.apply([W(key, 8, b'"older"', S2)])
        assert older.outcome.value == "not_newer", "versions still only go forward"
        # a tombstone of the same version is never replaced
        await tier.apply([CacheAction("invalidate", key, 10, 1)])
        [after_tomb] = await tier.apply([W(key, 10, b'"x"', S2)])
        assert after_tomb.outcome.value == "not_newer"
        # legacy writes (no signature) of a namespace without a model keep working and carry no 's'
        plain = client.key("plain", [1])
        await tier.apply([CacheAction("write", plain, 1, 1, b'"p"')])
        assert await tier.client.hget(plain, "s") is None
        assert isinstance(await client.get("plain", [1]), Hit)

    run_client_and_tier(redis_url, body)


def test_l1_drops_the_namespace_on_a_cutover_and_refuses_old_reads(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        l1 = L1Cache()
        listener = InvalidationListener(
            aioredis.Redis.from_url(redis_url), invalidation_channel(prefix), [l1]
        )
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 10)
        reader = CacheClient(client.redis, prefix=prefix, l1=l1)
        try:
            key = reader.key(NS, ["k"])
            await tier.set_signature(prefix, NS, record(S1, "1.0.0"))  # announced on the tier's channel
            await tier.apply([W(key, 1, b'"m1"', S1)])
            first = await reader.get(NS, ["k"])
            assert isinstance(first, Hit) and first.tier == "l2"
            assert isinstance(second := await reader.get(NS, ["k"]), Hit) and second.tier == "l1"
            await tier.set_signature(prefix, NS, record(S2, "2.0.0"))
            for _ in range(200):
                if len(l1) == 0:
                    break
                await asyncio.sleep(0.01)
            assert len(l1) == 0, "the cutover broadcast did not drop the namespace from L1"
            assert isinstance(await reader.get(NS, ["k"]), Miss), "L1 or L2 served an old-signature entry"
            # a reader that read under S1 before the switch and puts after it is refused
            assert not l1.put(key, 1, b'"m1"', S1)
            assert l1.put(key, 2, b'"m2"', S2)
        finally:
            await listener.stop()

    run_client_and_tier(redis_url, body)


def test_sweep_deletes_only_old_signature_entries(redis_url: str) -> None:
    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        keys = {name: client.key(NS, [name]) for name in ("old", "active", "pending", "tomb", "none")}
        await set_signature(tier.client, prefix, NS, record(S2, "2.0.0"))
        await set_signature(tier.client, prefix, NS, record(S3, "3.0.0"), mode="pending")
        await tier.apply(
            [
                W(keys["old"], 1, b"1", S1),
                W(keys["active"], 1, b"1", S2),
                W(keys["pending"], 1, b"1", S3),
                W(keys["none"], 1, b"1", None),
                CacheAction("invalidate", keys["tomb"], 1, 1),
            ]
        )
        assert await sweep_namespace(tier.client, prefix, NS, dry_run=True) == (6, 2)
        scanned, deleted = await sweep_namespace(tier.client, prefix, NS, batch=2)
        assert (scanned, deleted) == (6, 2)
        left = {name for name, key in keys.items() if await tier.client.exists(key)}
        assert left == {"active", "pending", "tomb"}
        assert await tier.client.exists(signature_key(prefix, NS))

    run_client_and_tier(redis_url, body)


def test_the_tier_keeps_pending_signatures_fences_and_the_outer_fence_mark(redis_url: str) -> None:
    """The signature operations the pipeline makes through the tier: pending and its rollback, a fence
    (the next epoch, announced on the tier's channel), a first signature for a namespace without one,
    and the mark that keeps readers off a fenced outer tier."""

    async def body(client: CacheClient, tier: RedisTier, prefix: str) -> None:
        listener = aioredis.Redis.from_url(redis_url)
        pubsub = listener.pubsub()
        await pubsub.subscribe(tier.channel or "")
        try:
            no_model = SignatureRecord(S1, signature_order(None), b"", ("a",))  # a fence keeps the model
            assert (await tier.set_signature(prefix, NS, no_model)).applied
            assert (await tier.set_signature(prefix, NS, record(S2, "2.0.0"), mode="pending")).applied
            assert await tier.read_active_signatures(prefix, [NS, "none"]) == [f"{S1}/{S2}", "/"]
            assert await tier.clear_pending(prefix, NS, S2) and not await tier.clear_pending(prefix, NS, S2)

            fenced = await tier.fence_namespace(prefix, NS, value_columns=None)
            state = (await tier.read_signatures(prefix, [NS]))[NS]
            assert fenced.applied and fenced.previous == S1 and state.active_signature not in ("", S1)
            announced = [m async for m in _messages(pubsub) if m.startswith(b"a ")]
            assert announced[-1] == f"a {state.active_signature} {prefix}:{{{NS}}}:".encode()

            with pytest.raises(ValueError, match="value columns are needed"):
                await tier.fence_namespace(prefix, "fresh", value_columns=None)
            assert (await tier.fence_namespace(prefix, "fresh", value_columns=["a"])).applied

            await tier.mark_outer_fenced(prefix, [NS, NS], 1_700_000_000_000)
            miss = await client.get(NS, ["x"])
            assert isinstance(miss, Miss) and miss.lease is not None and miss.lease.outer_fenced
            await tier.mark_outer_fenced(prefix, [NS], None)
            assert await client.fill(miss.lease, b"1", None) is FillResult.FILLED
            miss = await client.get(NS, ["y"])
            assert isinstance(miss, Miss) and miss.lease is not None and not miss.lease.outer_fenced
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            await listener.aclose()

    run_client_and_tier(redis_url, body)


async def _messages(pubsub: Any, within_s: float = 2.0) -> Any:
    """The messages published to ``pubsub`` until none came for a moment (or ``within_s`` passed)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        message = await pubsub.get_message(timeout=0.2)
        if message is None:
            return
        if message["type"] == "message":
            yield message["data"]


def test_a_fence_never_brings_back_a_signature_after_the_record_was_lost(redis_url: str) -> None:
    """A Redis restart without persistence loses the namespace's $signature hash; the next fence must not
    reproduce an earlier fence's signature (entries built under it may still sit in L3 or an L1)."""

    async def body(cache: CacheClient, tier: RedisTier, prefix: str) -> list[str]:
        seen = []
        for _ in range(2):
            await tier.fence_namespace(prefix, NS, value_columns=("a",))
            seen.append((await tier.read_signatures(prefix, [NS]))[NS].active_signature)
            await tier.client.delete(signature_key(prefix, NS))  # the record is lost
        return seen

    first, second = run_client_and_tier(redis_url, body)
    assert first and second and first != second
