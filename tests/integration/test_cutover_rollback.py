"""A model cutover that fails after writing its pending signature rolls it back (issue 8, finding 6).

``prewarm-then-switch`` first records the new signature as *pending*: from then on every worker builds
each change's entries under both models. If the prewarm or the switch then fails (the database goes
away while the hot rows are reloaded, the signature write is refused), ``Cutovers.cutover`` must drop
that pending signature again; left behind, every worker would go on building entries for a model that
never became active, for good. Real Redis; the worker's own ``Cutovers`` code, built as in
``pipeline.app``; only the row source is in memory, so that its outage can be made on cue.

Each scenario also runs with the rollback turned off (``_roll_back`` a no-op) and must then find the
pending signature left behind: the check can fail.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest
import redis.asyncio as aioredis

from cache_writer import RedisTier
from cache_writer.exceptions import TierUnavailableError
from cache_writer.layout import entry_key, invalidation_channel
from cache_writer.semantic import KeyHashWeights, format_key
from cache_writer.signatures import NamespaceSignatures, SignatureRecord, set_signature
from pipeline.bench.cutover import MemoryLoaders
from pipeline.cutover import Cutovers
from pipeline.loaders import RowLoader
from pipeline.models import ModelRegistry
from pipeline.settings import ModelSettings
from schemas import Binding, Bindings, encode_value
from schemas.model_updates import ModelUpdate, signature_order

pytestmark = pytest.mark.integration

NAMESPACE = "items"
DIMS = {"text": 16}


class _Rows(MemoryLoaders):
    """The bench's in-memory row source, which can be taken down: ``down`` makes every load raise the
    error a MySQL connection refused raises."""

    def __init__(self, rows: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__(rows)
        self.down = False
        self.loads = 0

    def for_binding(self, binding: Binding) -> RowLoader:
        load = super().for_binding(binding)

        def counted(
            binding: Binding, key_columns: Sequence[str], keys: Sequence[Sequence[str]]
        ) -> Iterable[Mapping[str, Any]]:
            self.loads += 1
            if self.down:
                raise pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'")
            return load(binding, key_columns, keys)

        return counted


def _update(version: str, weights: KeyHashWeights) -> ModelUpdate:
    return ModelUpdate(
        model="minilm",
        model_version=version,
        tokenizer_version="tok-1",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        weights_ref="/dev/null",
        weights_sha256=weights.sha256,
        namespaces=(NAMESPACE,),
        key_bits=weights.key_bits,  # type: ignore[arg-type]
        ts_ms=int(time.time() * 1000),
    )


@dataclass
class Stage:
    cutovers: Cutovers
    rows: _Rows
    client: aioredis.Redis
    prefix: str
    old: SignatureRecord
    update: ModelUpdate
    weights: KeyHashWeights
    hot_keys: list[str]

    async def state(self) -> NamespaceSignatures:
        return (await self.cutovers.l2.read_signatures(self.prefix, [NAMESPACE]))[NAMESPACE]

    async def cutover(self) -> Any:
        return await self.cutovers.cutover(NAMESPACE, self.update, self.weights, self.hot_keys)


@asynccontextmanager
async def staged(redis_url: str) -> AsyncIterator[Stage]:
    """A namespace active under model 1.0.0 with 20 hot entries, and a checked update to 2.0.0."""
    prefix = f"rollback-{uuid.uuid4().hex[:8]}"
    binding = Binding(
        table="shop.items",
        namespace=NAMESPACE,
        key_columns=("id",),
        value_columns=("id", "content"),
        semantic={"modality": "text", "text_column": "content"},
    )
    bindings = Bindings(bindings=(binding,))
    weights1 = KeyHashWeights.generate(11, DIMS, shared_dim=16, key_bits=64)
    weights2 = KeyHashWeights.generate(12, DIMS, shared_dim=16, key_bits=64)
    update1, update2 = _update("1.0.0", weights1), _update("2.0.0", weights2)
    columns = binding.value_columns or ()
    old = SignatureRecord(
        update1.signature(columns),
        signature_order(update1.semver),
        update1.model_dump_json().encode(),
        columns,
    )
    client = aioredis.Redis.from_url(redis_url)
    tier = RedisTier(client, tombstone_ttl_ms=86_400_000, channel=invalidation_channel(prefix))
    await tier.load_scripts()
    await set_signature(client, prefix, NAMESPACE, old)
    rows = {str(i): {"id": i, "content": f"item number {i}"} for i in range(20)}
    hot_keys = [entry_key(prefix, NAMESPACE, [format_key(1000 + i, 64)]) for i in range(20)]
    now_us = str(int(time.time() * 1_000_000))
    for i, key in enumerate(hot_keys):  # entries built under model 1, each naming its row ("k")
        await client.hset(
            key,
            mapping={"v": 100 + i, "d": encode_value(rows[str(i)]), "c": now_us, "s": old.signature, "k": i},
        )

    async def no_columns(_: Binding) -> tuple[str, ...]:
        raise AssertionError("the binding names its value columns")

    async def key_columns(_: Binding) -> tuple[str, ...]:
        return ("id",)

    loaders = _Rows(rows)
    cutovers = Cutovers(
        bindings,
        ModelRegistry(bindings, prefix=prefix, device="cpu"),
        prefix=prefix,
        settings=ModelSettings(cutover="prewarm-then-switch", prewarm_top_n=100, prewarm_batch=8),
        columns_of=no_columns,
        key_columns_of=key_columns,
        loaders=loaders,
    )
    cutovers.tiers[:] = [tier]
    try:
        yield Stage(cutovers, loaders, client, prefix, old, update2, weights2, hot_keys)
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def run(redis_url: str, scenario: Callable[[Stage], Awaitable[None]]) -> None:
    async def main() -> None:
        async with staged(redis_url) as stage:
            await scenario(stage)

    asyncio.run(main())


def _no_rollback(stage: Stage, monkeypatch: pytest.MonkeyPatch) -> None:
    async def keep_pending(namespace: str, record: SignatureRecord) -> None:
        return None

    monkeypatch.setattr(stage.cutovers, "_roll_back", keep_pending)


# -- the database goes away while the hot rows are reloaded -----------------------------------------------


@pytest.mark.parametrize("rollback", [True, False], ids=["rollback", "no-rollback (control)"])
def test_a_prewarm_that_fails_drops_its_pending_signature(
    redis_url: str, rollback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(redis_url, lambda stage: _prewarm_fails(stage, rollback, monkeypatch))


async def _prewarm_fails(stage: Stage, rollback: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not rollback:
        _no_rollback(stage, monkeypatch)
    stage.rows.down = True
    with pytest.raises(pymysql.err.OperationalError):
        await stage.cutover()
    assert stage.rows.loads >= 1, (
        "the prewarm never reached the row source: the failure was not after pending"
    )

    state = await stage.state()
    assert state.active is not None and state.active.signature == stage.old.signature, "model 1 stays active"
    pending = state.pending.signature[:12] if state.pending else None
    print(f"\nrollback={'on' if rollback else 'off'}: pending after the failed cutover = {pending}")
    if rollback:
        assert state.pending is None, f"the failed cutover left pending signature {pending} behind"
    else:
        assert state.pending is not None, "control: without the rollback the pending signature must stay"

    # the row source comes back; the retried cutover (the worker retries on an outage) completes
    stage.rows.down = False
    report = await stage.cutover()
    state = await stage.state()
    assert state.active is not None and state.active.signature == report.signature != stage.old.signature
    assert state.pending is None
    assert report.prewarm.written == len(stage.hot_keys), report.prewarm
    print(
        f"retry: switched to {report.signature[:12]}, prewarmed {report.prewarm.written}/{report.prewarm.hot}"
    )


# -- the switch itself fails after the prewarm (an outer tier down, a newer model got there first) --------


class _DownTier(RedisTier):
    """An outer tier whose signature write fails as an unreachable tier's does."""

    async def set_signature(self, *args: Any, **kwargs: Any) -> Any:
        raise TierUnavailableError("l3", "connection refused")


@pytest.mark.parametrize("rollback", [True, False], ids=["rollback", "no-rollback (control)"])
def test_a_switch_that_fails_drops_its_pending_signature(
    redis_url: str, rollback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(redis_url, lambda stage: _switch_fails(stage, rollback, monkeypatch))


async def _switch_fails(stage: Stage, rollback: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not rollback:
        _no_rollback(stage, monkeypatch)
    l2 = stage.cutovers.tiers[0]
    stage.cutovers.tiers.append(_DownTier(stage.client, tombstone_ttl_ms=1000, channel="unused"))
    with pytest.raises(TierUnavailableError):
        await stage.cutover()
    assert stage.rows.loads >= 1, "the prewarm ran before the switch"
    state = await stage.state()
    assert state.active is not None and state.active.signature == stage.old.signature
    if rollback:
        assert state.pending is None, "the failed switch left its pending signature behind"
    else:
        assert state.pending is not None, "control: without the rollback the pending signature must stay"
    del stage.cutovers.tiers[1:]
    assert stage.cutovers.tiers == [l2]


def test_a_newer_model_that_got_there_first_is_not_rolled_back(redis_url: str) -> None:
    """The rollback drops only its own pending signature: when another cutover replaced it meanwhile,
    that one stays (``clear_pending`` compares the signature)."""
    run(redis_url, _replaced_meanwhile)


async def _replaced_meanwhile(stage: Stage) -> None:
    newer = _update("9.0.0", stage.weights)
    other = SignatureRecord(
        "f" * 64, signature_order(newer.semver), newer.model_dump_json().encode(), ("id", "content")
    )
    prewarm = stage.cutovers.prewarmer.prewarm_or_note

    async def replaced_meanwhile(*args: Any, **kwargs: Any) -> Any:
        await set_signature(stage.client, stage.prefix, NAMESPACE, other, mode="pending")
        raise TimeoutError("prewarm timed out")

    stage.cutovers.prewarmer.prewarm_or_note = replaced_meanwhile  # type: ignore[method-assign]
    with pytest.raises(asyncio.TimeoutError):
        await stage.cutover()
    stage.cutovers.prewarmer.prewarm_or_note = prewarm  # type: ignore[method-assign]
    state = await stage.state()
    assert state.pending is not None and state.pending.signature == other.signature


def test_a_cancelled_cutover_still_drops_its_pending_signature(redis_url: str) -> None:
    """A worker stopping (SIGTERM cancels the agent) in the middle of a prewarm: the rollback is shielded
    from the cancellation."""
    run(redis_url, _cancelled)


async def _cancelled(stage: Stage) -> None:
    started = asyncio.Event()

    async def slow_prewarm(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    stage.cutovers.prewarmer.prewarm_or_note = slow_prewarm  # type: ignore[method-assign]
    task = asyncio.create_task(stage.cutover())
    await asyncio.wait_for(started.wait(), 10)
    assert (await stage.state()).pending is not None, "the pending signature is written before the prewarm"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)  # the shielded rollback finishes on its own
    state = await stage.state()
    assert state.pending is None
    assert state.active is not None and state.active.signature == stage.old.signature
