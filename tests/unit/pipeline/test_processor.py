"""ChangeProcessor without services: per-key collapse and accounting, refused actions, fencing, oversize.

The tiers here are in-memory compare-and-set stores with the semantics of the Lua scripts (a version
only moves forward; a tombstone keeps its version), so the processor's own logic is what is tested.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from cache_writer import ActionResult, CacheAction, Outcome, TierUnavailableError
from cache_writer.retry import RetryPolicy, TierGuard
from pipeline.observe.report import BatchReport
from pipeline.prepared import Fence
from pipeline.processor import ChangeProcessor
from schemas import Binding, Bindings, ChangeEvent, FenceEvent, Source, encode

PREFIX = "fk"
PLAIN = Binding(table="shop.assets", namespace="assets")  # type: ignore[call-arg]
VERSIONED = Binding(table="shop.assets", namespace="assets", version_column="v")  # type: ignore[call-arg]


class MemoryTier:
    """Compare-and-set on versions, like write_if_newer.lua / invalidate_if_not_newer.lua."""

    def __init__(self, name: str = "redis") -> None:
        self.name = name
        self.entries: dict[str, tuple[int, bytes | None]] = {}
        self.batches: list[list[CacheAction]] = []
        self.down = False
        self.refuse: set[str] = set()
        self.channel = None

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        if self.down:
            raise TierUnavailableError(self.name, ConnectionError("down"))
        self.batches.append(list(actions))
        results = []
        for action in actions:
            if action.kind == "write" and action.key in self.refuse:
                results.append(ActionResult(action, Outcome.FAILED, None, error="WRONGTYPE"))
                continue
            held = self.entries.get(action.key)
            newer = held is None or action.version > held[0]
            if action.kind == "invalidate" and held is not None and held[0] == action.version:
                newer = held[1] is not None  # a live entry of the same version is replaced by the tombstone
            if newer:
                self.entries[action.key] = (action.version, action.value)
            results.append(ActionResult(action, Outcome.APPLIED if newer else Outcome.NOT_NEWER, None))
        return results

    async def close(self) -> None:
        pass


class HangingTier(MemoryTier):
    """A tier that neither answers nor refuses (a paused server) until :attr:`resume` is set."""

    def __init__(self, name: str = "redis-l3") -> None:
        super().__init__(name)
        self.resume: asyncio.Event | None = None
        self.cancelled = 0

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        if self.resume is None:
            self.resume = asyncio.Event()
        try:
            await self.resume.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().apply(actions)


class Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def on_event(self, kind: str) -> None:
        self.kinds.append(kind)

    def on_batch(self, report: BatchReport) -> None:
        for (tier, _namespace, outcome), count in report.outcomes.items():
            self.kinds += [f"{tier}:{outcome}"] * count
        for kind, count in report.events.items():
            self.kinds += [kind] * count


def change(op: str, row_id: int, version: int, **extra: Any) -> ChangeEvent:
    row = {"id": row_id, "name": f"n{version}", "v": version}
    before = row if op in ("u", "d") else None
    after = row if op in ("c", "u", "r") else None
    data: dict[str, Any] = {
        "event_id": f"e{version}",
        "op": op,
        "key": {"id": row_id},
        "before": before,
        "after": after,
        "source": {
            "server_id": 1,
            "file": "binlog.000001",
            "pos": version,
            "ts_ms": 0,
            "db": "shop",
            "table": "assets",
        },
        "ts_ms": 1,
        "version": version,
        "commit_ts_us": 1,
        "commit_ts_coarse": True,
    }
    data.update(extra)
    return ChangeEvent.model_validate(data)


def processor(
    binding: Binding, *tiers: MemoryTier, fence_after_s: float | None = None
) -> tuple[ChangeProcessor, Events]:
    p = ChangeProcessor(
        Bindings(bindings=(binding,)),
        list(tiers),
        key_prefix=PREFIX,
        policy=RetryPolicy(base_s=0.001, cap_s=0.005, fence_after_s=fence_after_s),
    )
    events = Events()
    p.observers.add(events)
    return p, events


def run(p: ChangeProcessor, *changes: ChangeEvent | bytes) -> tuple[list[Any], list[Any]]:
    async def go() -> tuple[list[Any], list[Any]]:
        messages = [(None, c if isinstance(c, bytes) else encode(c)) for c in changes]
        prepared = await p.prepare(messages)
        refused = await p.apply(prepared.planned, received_ms=0, planned_ms=0)
        return prepared.rejects, refused

    return asyncio.run(go())


def test_a_write_then_a_delete_in_one_batch_sends_only_the_delete_and_accounts_for_both() -> None:
    tier = MemoryTier()
    p, events = processor(PLAIN, tier)
    run(p, change("c", 1, 10), change("d", 1, 20))
    assert [a.kind for batch in tier.batches for a in batch] == ["invalidate"]
    assert tier.entries["fk:{assets}:1"] == (20, None)
    assert events.kinds.count("change_superseded") == 1
    assert events.kinds.count("change_applied") == 1
    assert "redis:not_newer" not in events.kinds, "nothing was refused: the write never went out"


def test_a_replayed_batch_is_refused_as_not_newer() -> None:
    tier = MemoryTier()
    p, events = processor(PLAIN, tier)
    run(p, change("c", 1, 10), change("u", 1, 20))
    events.kinds.clear()
    run(p, change("c", 1, 10), change("u", 1, 20))
    assert events.kinds.count("change_not_newer") == 1 and events.kinds.count("change_superseded") == 1
    assert tier.entries["fk:{assets}:1"][0] == 20


def test_garbage_is_rejected_per_message_and_the_rest_applies() -> None:
    tier = MemoryTier()
    p, _ = processor(PLAIN, tier)
    rejects, _ = run(
        p, b"\xff\xfe not json", change("c", 1, 10), b'{"kind":"change","ts_ms":' + b"9" * 500 + b"}"
    )
    assert [(r.index, r.stage) for r in rejects] == [(0, "decode"), (2, "decode")]
    assert tier.entries["fk:{assets}:1"][0] == 10


def test_a_write_a_tier_refuses_for_good_becomes_an_invalidation_and_a_dead_letter() -> None:
    tier = MemoryTier()
    tier.entries["fk:{assets}:1"] = (5, b"old")
    tier.refuse.add("fk:{assets}:1")
    p, _ = processor(PLAIN, tier)
    _, refused = run(p, change("u", 1, 10), change("c", 2, 11))
    assert [(r.index, r.stage) for r in refused] == [(0, "apply:redis")]
    assert tier.entries["fk:{assets}:1"] == (10, None), "the old value cannot stay: tombstoned"
    assert tier.entries["fk:{assets}:2"][0] == 11


def test_an_outer_tier_failing_past_the_bound_is_fenced_and_the_inner_tier_goes_on() -> None:
    l2, l3 = MemoryTier("redis"), MemoryTier("redis-l3")
    l3.down = True
    p, events = processor(PLAIN, l2, l3, fence_after_s=0.05)
    fenced: list[str] = []

    async def on_outer_fenced(tier: Any) -> None:
        fenced.append(tier.name)

    p.on_outer_fenced = on_outer_fenced
    run(p, change("c", 1, 10))
    assert fenced == ["redis-l3"] and p.guards["redis-l3"].state == "fenced"
    assert l2.entries["fk:{assets}:1"][0] == 10
    run(p, change("u", 1, 11))
    assert l2.entries["fk:{assets}:1"][0] == 11 and not l3.entries
    assert "redis-l3:fenced" in events.kinds


def test_without_a_bound_the_outer_tier_holds_the_batch() -> None:
    l2, l3 = MemoryTier("redis"), MemoryTier("redis-l3")
    l2.entries["fk:{assets}:1"] = (5, b"old")
    l3.down = True
    p, _ = processor(PLAIN, l2, l3, fence_after_s=None)

    async def go() -> None:
        prepared = await p.prepare([(None, encode(change("d", 1, 10)))])
        await asyncio.wait_for(p.apply(prepared.planned, received_ms=0, planned_ms=0), 0.3)

    with pytest.raises(TimeoutError):
        asyncio.run(go())
    assert l2.entries["fk:{assets}:1"] == (5, b"old"), "invalidations go outermost first: L2 waits for L3"


def test_an_outer_tier_that_hangs_is_fenced_within_the_bound_and_the_inner_tier_goes_on() -> None:
    """A paused L3 answers nothing and refuses nothing: each attempt may take only the time left to the
    fence bound. Without that bound the batch waited for the socket timeout (here: for ever)."""
    l2, l3 = MemoryTier("redis"), HangingTier("redis-l3")
    p, events = processor(PLAIN, l2, l3, fence_after_s=0.1)
    fenced: list[str] = []

    async def on_outer_fenced(tier: Any) -> None:
        fenced.append(tier.name)

    p.on_outer_fenced = on_outer_fenced

    async def go() -> float:
        prepared = await p.prepare([(None, encode(change("c", 1, 10)))])
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(p.apply(prepared.planned, received_ms=0, planned_ms=0), 2.0)
        return asyncio.get_running_loop().time() - started

    took = asyncio.run(go())
    assert fenced == ["redis-l3"] and p.guards["redis-l3"].state == "fenced"
    assert l2.entries["fk:{assets}:1"][0] == 10 and not l3.entries
    assert 0.1 <= took < 1.5, took  # without the bound it waits until wait_for's 2 s and fails
    assert l3.cancelled >= 1, "the attempt that hung was given up"
    assert "no answer within" in p.guards["redis-l3"].last_error
    assert "redis-l3:fenced" in events.kinds


def test_a_tier_failure_counts_from_the_start_of_the_attempt_that_failed() -> None:
    """An attempt that ends in a timeout began seconds earlier: the tier has failed since then."""
    now = [100.0]
    guard = TierGuard("redis-l3", RetryPolicy(fence_after_s=1.5), clock=lambda: now[0])
    assert guard.time_left_s() == 1.5
    now[0] = 105.0  # a socket timeout of 5 s
    guard.failed(TimeoutError("read"), since=100.0)
    assert guard.failing_for_s == 5.0 and guard.due_to_fence()
    assert guard.time_left_s() == 0.01
    fresh = TierGuard("redis", RetryPolicy(fence_after_s=1.5), clock=lambda: now[0])
    fresh.failed(ConnectionError("refused"))  # refused at once: failing from now
    assert fresh.failing_for_s == 0.0 and not fresh.due_to_fence()
    assert TierGuard("x", RetryPolicy(fence_after_s=None)).time_left_s() is None


def test_the_primary_tier_is_never_skipped_and_fences_every_namespace_when_it_returns() -> None:
    l2 = MemoryTier("redis")
    l2.down = True
    p, _ = processor(PLAIN, l2, fence_after_s=0.02)
    back: list[bool] = []

    async def on_primary_back() -> None:
        back.append(True)

    p.on_primary_back = on_primary_back

    async def go() -> None:
        prepared = await p.prepare([(None, encode(change("c", 1, 10)))])
        task = asyncio.ensure_future(p.apply(prepared.planned, received_ms=0, planned_ms=0))
        await asyncio.sleep(0.2)
        assert not task.done() and p.guards["redis"].state == "fenced"
        l2.down = False
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    assert back == [True] and p.guards["redis"].state == "ok"
    assert l2.entries["fk:{assets}:1"][0] == 10


def test_an_oversize_change_invalidates_the_row_when_its_key_and_version_are_known() -> None:
    tier = MemoryTier()
    tier.entries["fk:{assets}:1"] = (5, b"old")
    p, events = processor(PLAIN, tier)
    big = change("u", 1, 10, before=None, after=None, oversize=True)
    run(p, big)
    assert tier.entries["fk:{assets}:1"] == (10, None)
    assert "oversize" in events.kinds


def test_an_oversize_change_of_a_versioned_binding_fences_its_namespace() -> None:
    tier = MemoryTier()
    p, _ = processor(VERSIONED, tier)

    async def go() -> dict[str, Fence]:
        prepared = await p.prepare(
            [(None, encode(change("u", 1, 10, before=None, after=None, oversize=True)))]
        )
        assert prepared.planned[0].actions == []
        return prepared.fences

    fences = asyncio.run(go())
    assert list(fences) == ["assets"] and "oversized row" in fences["assets"].reason
    assert fences["assets"].cause == "oversize"


def fence_event(table: str = "assets") -> FenceEvent:
    source = Source(server_id=1, file="binlog.000001", pos=77, ts_ms=0, db="shop", table=table)
    return FenceEvent(event_id="1:binlog.000001:77:fence", source=source, reason="ValueError: day", ts_ms=1)


def test_a_fence_event_fences_the_namespace_of_its_table_and_the_batch_goes_on() -> None:
    tier = MemoryTier()
    p, events = processor(PLAIN, tier)

    async def go() -> tuple[dict[str, Fence], list[int]]:
        prepared = await p.prepare(
            [
                (None, encode(change("c", 1, 10))),
                (None, encode(fence_event())),
                (None, encode(fence_event("other"))),  # a table not bound: nothing to fence
                (None, encode(change("u", 2, 11))),
            ]
        )
        assert not prepared.rejects
        return prepared.fences, [planned.index for planned in prepared.planned]

    fences, planned = asyncio.run(go())
    assert list(fences) == ["assets"] and fences["assets"].cause == "unreadable-binlog"
    assert "binlog.000001:77" in fences["assets"].reason and "ValueError: day" in fences["assets"].reason
    assert planned == [0, 3], "the changes around it are planned as usual"
    assert events.kinds.count("fence_event") == 2
