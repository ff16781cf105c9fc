"""The change topic's intake (``pipeline.intake.Intake``) without a broker: batches as full as the
fetches that filled them, order kept, room for the fetch loop, and nothing left after a clear."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from pipeline.faust_app import FreshkeyApp
from pipeline.intake import Intake


@dataclass
class _Message:
    offset: int


def _intake(batch: int = 3, capacity: int = 6) -> Intake:
    return Intake(["changes"], batch=batch, capacity=capacity)


def _put(intake: Intake, *offsets: int) -> None:
    for offset in offsets:
        intake.put(_Message(offset))  # type: ignore[arg-type]


def _offsets(messages: list[object]) -> list[int]:
    return [m.offset for m in messages]  # type: ignore[attr-defined]


def test_a_fetch_is_taken_once_it_is_flushed_in_order() -> None:
    async def body() -> tuple[bool, list[int], list[int]]:
        intake = _intake(batch=10, capacity=20)
        _put(intake, 1, 2)
        waiting = asyncio.ensure_future(intake.take(10))
        await asyncio.sleep(0.01)
        early = waiting.done()  # a fetch that is still being read is not a batch yet
        intake.flush()
        first = await waiting
        _put(intake, 3)
        intake.flush()
        return early, _offsets(first), _offsets(await intake.take(10))

    early, first, second = asyncio.run(body())
    assert not early
    assert first == [1, 2] and second == [3]


def test_a_full_batch_is_ready_before_the_fetch_ends_and_takes_are_bounded() -> None:
    async def body() -> tuple[list[int], list[int], int]:
        intake = _intake(batch=3, capacity=6)
        _put(intake, 1, 2, 3, 4)  # the batch size is reached: ready without a flush
        first = await asyncio.wait_for(intake.take(3), 1)
        second = await asyncio.wait_for(intake.take(3), 1)
        return _offsets(first), _offsets(second), len(intake)

    first, second, left = asyncio.run(body())
    assert first == [1, 2, 3] and second == [4] and left == 0


def test_the_fetch_loop_waits_for_room_at_capacity() -> None:
    async def body() -> tuple[bool, bool, bool]:
        intake = _intake(batch=2, capacity=4)
        _put(intake, 1, 2, 3, 4)
        room = asyncio.ensure_future(intake.wait_room())
        await asyncio.sleep(0.01)
        blocked = not room.done() and intake.full
        await intake.take(2)
        await asyncio.sleep(0)
        return blocked, room.done(), intake.full

    blocked, freed, full = asyncio.run(body())
    assert blocked and freed and not full


def test_a_clear_drops_what_waits_and_frees_the_fetch_loop() -> None:
    async def body() -> tuple[int, bool, list[int]]:
        intake = _intake(batch=2, capacity=2)
        _put(intake, 1, 2)
        intake.clear()  # partitions revoked: the consumer seeks back to the committed offsets
        left = len(intake)
        room = asyncio.ensure_future(intake.wait_room())
        await asyncio.sleep(0)
        _put(intake, 7)
        intake.flush()
        return left, room.done(), _offsets(await asyncio.wait_for(intake.take(5), 1))

    left, freed, after = asyncio.run(body())
    assert left == 0 and freed and after == [7]


def test_within_waits_for_a_fuller_batch_but_not_past_its_time() -> None:
    async def body() -> tuple[list[int], list[int], float]:
        intake = _intake(batch=10, capacity=20)
        _put(intake, 1)
        intake.flush()

        async def later() -> None:
            await asyncio.sleep(0.01)
            _put(intake, 2)
            intake.flush()

        feeder = asyncio.ensure_future(later())
        fuller = await intake.take(10, within_s=0.2)
        await feeder
        _put(intake, 3)
        intake.flush()
        start = asyncio.get_running_loop().time()
        alone = await intake.take(10, within_s=0.05)
        return _offsets(fuller), _offsets(alone), asyncio.get_running_loop().time() - start

    fuller, alone, waited = asyncio.run(body())
    assert fuller == [1, 2] and alone == [3]
    assert 0.04 <= waited < 1.0


def test_an_intake_needs_room_for_a_batch() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Intake(["changes"], batch=5, capacity=4)


def test_the_app_drops_a_stale_generation_and_clears_the_intake_on_a_rebalance() -> None:
    """What a rebalance does to the intake (no broker: the app's flow control and generation as Faust
    sets them): waiting messages are dropped when flow stops, and a message fetched in an older
    generation, or while flow is suspended, is not current (the agent skips it; it is fetched again)."""
    app = FreshkeyApp("test-intake", broker="kafka://127.0.0.1:1", value_serializer="raw")
    intake = app.use_intake(app.topic("changes"), batch=2, capacity=4)
    assert intake is app.intake and intake.topics == {"changes"}

    @dataclass
    class Fetched:
        offset: int
        generation_id: int

    app.flow_control.resume()
    app.consumer_generation_id = 3
    assert app.current(Fetched(1, 3))  # type: ignore[arg-type]
    assert not app.current(Fetched(1, 2))  # type: ignore[arg-type]
    intake.put(Fetched(1, 3))  # type: ignore[arg-type]
    app.flow_control.suspend()  # partitions revoked: Faust suspends flow, then clears its queues
    assert not app.current(Fetched(2, 3))  # type: ignore[arg-type]
    app.flow_control.clear()
    assert len(intake) == 0


def test_a_partitions_worth_put_at_once_is_ready_and_fills_the_intake_as_single_puts_do() -> None:
    async def body() -> tuple[bool, list[int], bool, bool, list[int]]:
        intake = _intake(batch=3, capacity=6)
        intake.put_many([_Message(o) for o in (1, 2)])  # type: ignore[misc]
        waiting = asyncio.ensure_future(intake.take(3))
        await asyncio.sleep(0.01)
        early = waiting.done()  # under a batch and not flushed: not ready yet
        intake.put_many([_Message(o) for o in (3, 4, 5, 6, 7)])  # type: ignore[misc]
        first = await asyncio.wait_for(waiting, 1)
        room_after_first = intake._room.is_set()  # 4 left of capacity 6
        intake.put_many([_Message(o) for o in (8, 9)])  # type: ignore[misc]
        full = intake.full and not intake._room.is_set()
        rest = await asyncio.wait_for(intake.take(10), 1)
        return early, _offsets(first), room_after_first, full, _offsets(rest)

    early, first, room, full, rest = asyncio.run(body())
    assert not early and first == [1, 2, 3]
    assert room and full and rest == [4, 5, 6, 7, 8, 9]
