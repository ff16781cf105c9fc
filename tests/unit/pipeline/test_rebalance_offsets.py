"""The worker's consumer across a rebalance (``pipeline.consumer.Consumer``): what it records as read and
as committed stays the new generation's, so the group's committed offset follows what was applied.

Both cases end as a partition whose committed offset stays behind what its worker applied and
acknowledged, as seen in tests/integration/test_scale_out.py (committed 311, acknowledged through 404,
for 45 s). Nothing here is connected: the consumer is Faust's, built offline inside the test's loop, with
the broker calls stubbed. Each case has its negative control: the same scenario without the protection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import ConsumerRecord
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message

from pipeline.faust_app import FreshkeyApp

TOPIC = "rebalance-changes"
PART = TP(TOPIC, 4)


def _record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(TOPIC, PART.partition, offset, 0, 0, b"k", b"v", None, 1, 1, [])


def _message(offset: int, generation: int) -> Message:
    return Message(
        TOPIC, PART.partition, offset, 0.0, 0, None, b"k", b"v", None, tp=PART, generation_id=generation
    )


def _commit_across_a_rebalance(stock_faust: bool) -> tuple[list[int], int | None]:
    """Offsets 311..404 are acknowledged; the commit of 405 is still waiting when a rebalance ends (the
    partition stays with this worker, whose seek read 311 from the broker) and fails. The new generation
    applies and acknowledges 311..404 again, and commits. What the broker took, and what the consumer
    records as committed."""
    taken: list[int] = []

    async def run() -> tuple[list[int], int | None]:
        with _offline_app("rebalance-commit") as (app, consumer):
            app.topics._acking_topics.add(TOPIC)  # as subscribing does: acks count for the topic
            consumer.assignment = lambda: {PART}
            app.producer.flush = _noop  # type: ignore[method-assign]
            waited = False

            async def commit_to_broker(offsets: dict[TP, int]) -> bool:
                nonlocal waited
                if not waited:  # the rebalance ends while the first commit waits
                    waited = True
                    app.consumer_generation_id += 1
                    for state in (consumer._acked, consumer._acked_index, consumer._gap):
                        state.pop(PART, None)  # revocation
                    consumer._committed_offset[PART] = consumer._read_offset[PART] = 311  # the seek
                    return False  # Faust's answer to CommitFailedError("... already rebalanced ...")
                taken.append(offsets[PART])
                return True

            consumer._commit = commit_to_broker
            if stock_faust:
                consumer._commit_offsets = faust_aiokafka.Consumer._commit_offsets.__get__(consumer)
            consumer._committed_offset[PART] = 311
            for offset in range(311, 405):
                consumer.ack(_message(offset, app.consumer_generation_id))
            await consumer.commit()
            for offset in range(311, 405):
                consumer.ack(_message(offset, app.consumer_generation_id))
            await consumer.commit()
            return taken, consumer._committed_offset[PART]

    return asyncio.run(run())


async def _noop() -> None:
    return None


@contextlib.contextmanager
def _offline_app(name: str) -> Iterator[tuple[FreshkeyApp, Any]]:
    """A worker app and its consumer, never started; built inside the running loop (Faust's events bind
    to the loop they are made in), and the loop of the consumer's thread closed afterwards."""
    app = FreshkeyApp(name, broker="kafka://127.0.0.1:1")
    try:
        yield app, app.consumer
    finally:
        app.consumer._thread.thread_loop.close()  # type: ignore[attr-defined]


def test_a_commit_failed_by_a_rebalance_leaves_the_seeked_offsets_and_the_next_commit_lands() -> None:
    assert _commit_across_a_rebalance(stock_faust=False) == ([405], 405)


def test_fausts_commit_records_the_failed_offsets_and_the_broker_stays_behind() -> None:
    """The negative control: Faust's ``_commit_offsets`` overwrites the seek's 311 with 405, so ``ack``
    refuses 311..404 as below it, and nothing more is committed: the broker stays at 311."""
    assert _commit_across_a_rebalance(stock_faust=True) == ([], 405)


class _Fetcher:
    def __init__(self) -> None:
        self._stopped = asyncio.Event()


@dataclass
class Fetched:
    """What the fetch loop did with a run of fetches: what the intake holds (offset, whether of the
    current generation), the read offset, the offsets Faust would count as a gap (acknowledged without
    a message), and how many seeks the loop made itself."""

    held: list[tuple[int, bool]]
    read: int | None
    gap: list[int]
    own_seeks: int


Plan = Callable[[FreshkeyApp, Any], Awaitable[None]]
"""What happens while one fetch is out (before its messages come back): a rebalance, a seek."""


def _drain(
    fetches: list[tuple[list[int], Plan | None]],
    *,
    committed: int = 311,
    capacity: int = 100,
    while_waiting: Plan | None = None,
    check: Callable[[Any], Callable[[tuple[int, int]], bool]] | None = None,
    failing_seeks: int = 0,
) -> Fetched:
    """The fetch loop over ``fetches`` (each: the offsets of partition 4 it returns, and what happens
    while it is out), with every seek going to ``committed``. ``while_waiting`` happens while the loop
    waits for room in the intake. ``check`` replaces the loop's check of a fetch (negative controls)."""

    async def run() -> Fetched:
        with _offline_app("rebalance-fetch") as (app, consumer):
            intake = app.use_intake(app.topic(TOPIC), batch=1, capacity=capacity)
            app.topics._acking_topics.add(TOPIC)
            if check is not None:
                consumer._fetch_is_current = check(consumer)
            fetcher = _Fetcher()
            plans = list(fetches)
            own_seeks = 0

            failures = [failing_seeks]

            async def seek_to_committed() -> dict[TP, int]:
                if own_seeks and failures[0]:  # the loop's own seeks fail first (the broker away)
                    failures[0] -= 1
                    raise ConnectionError("broker away")
                return {PART: committed}

            async def fetch(timeout: float) -> tuple[dict[TP, list[ConsumerRecord[bytes, bytes]]], None]:  # noqa: ASYNC109
                if not plans:
                    fetcher._stopped.set()
                    return {}, None
                offsets, meanwhile = plans.pop(0)
                if meanwhile is not None:
                    await meanwhile(app, consumer)
                return {PART: [_record(offset) for offset in offsets]}, None

            async def wait_then(plan: Plan) -> None:
                while not intake.full:  # noqa: ASYNC110 (the intake has no event for this)
                    await asyncio.sleep(0)
                await asyncio.sleep(0.05)  # the fetch loop waits for room
                await plan(app, consumer)
                intake.capacity = 100  # room for the fetches after it

            seek = consumer.perform_seek

            async def counted_seek() -> None:
                nonlocal own_seeks
                own_seeks += 1
                await seek()

            consumer._wait_next_records = fetch
            consumer.assignment = lambda: {PART}
            consumer.highwater = lambda tp: 0
            consumer.seek_to_committed = seek_to_committed
            await consumer.perform_seek()  # the seek that ends the assignment
            consumer.perform_seek = counted_seek
            app.flow_control.resume()
            consumer.resume_flow()
            steps = [consumer._drain_messages(fetcher)]
            if while_waiting is not None:
                steps.append(wait_then(while_waiting))
            await asyncio.wait_for(asyncio.gather(*steps), 5)
            gap = sorted(
                o for interval in consumer._gap.get(PART, ()) for o in range(interval.begin, interval.end)
            )
            return Fetched(
                [(m.offset, app.current(m)) for m in intake._items],
                consumer._read_offset[PART],
                gap,
                own_seeks,
            )

    return asyncio.run(run())


async def _rebalance(app: FreshkeyApp, consumer: Any) -> None:
    """A whole rebalance that keeps partition 4 here: flow stops, the intake is cleared, the generation
    moves, flow resumes (Faust resumes it before its seek), and the seek to the committed offset."""
    consumer.stop_flow()
    app.flow_control.suspend()
    app.flow_control.clear()
    app.consumer_generation_id += 1
    app.flow_control.resume()
    consumer.resume_flow()
    await type(consumer).perform_seek(consumer)  # Faust's seek (not counted as the loop's own)


async def _seek(app: FreshkeyApp, consumer: Any) -> None:
    await type(consumer).perform_seek(consumer)


def _generation_only(consumer: Any) -> Callable[[tuple[int, int]], bool]:
    """The loop's check without the seeks: flow on, and the fetch of the current generation."""
    return lambda fetched_in: consumer.flow_active and consumer.app.consumer_generation_id == fetched_in[0]


def _flow_only(consumer: Any) -> Callable[[tuple[int, int]], bool]:
    """The check this loop had before: only "is a rebalance on now?"."""
    return lambda fetched_in: not consumer.suspend_flow.is_set()


def test_without_a_rebalance_a_fetch_goes_through_whole() -> None:
    assert _drain([([311, 312, 313], None)]) == Fetched([(311, True), (312, True), (313, True)], 313, [], 0)


def test_a_fetch_that_outlives_a_rebalance_is_dropped_and_fetched_again_from_the_seek() -> None:
    """The first fetch fills the intake; the second waits for room, and a rebalance comes meanwhile."""
    got = _drain(
        [([311, 312, 313], None), ([314], None), ([311, 312, 313, 314], None)],
        capacity=1,
        while_waiting=_rebalance,
    )
    # the rebalance cleared 311-313 from the intake; 314 was not delivered before the seek
    assert got == Fetched([(311, True), (312, True), (313, True), (314, True)], 314, [], 1)


def test_without_the_check_the_old_fetch_moves_the_read_offset_past_the_seek() -> None:
    """The negative control: the check this loop had before. 314 goes into the intake as a message of
    the older generation, which the change agent drops, and the read offset moves to it, so the fetch
    after the seek skips 311-313 as already delivered: never applied (and Faust, one off, commits past
    them)."""
    got = _drain(
        [([311, 312, 313], None), ([314], None), ([311, 312, 313, 314], None)],
        capacity=1,
        while_waiting=_rebalance,
        check=_flow_only,
    )
    assert got.held == [(314, False), (314, True)] and got.own_seeks == 0


def test_a_fetch_asked_for_before_a_seek_is_dropped_and_nothing_is_counted_as_a_gap() -> None:
    """The case seen in test_scale_out: the fetch was out when Faust's seek (after a rebalance) moved
    partition 4 back to 254; it comes back with 294.. of the same generation."""
    got = _drain([([294, 295], _seek), ([254, 255, 256], None)], committed=254)
    assert got == Fetched([(254, True), (255, True), (256, True)], 256, [], 1)


def test_without_the_seek_check_the_fetch_from_before_the_seek_commits_past_what_nobody_applied() -> None:
    """The negative control: the generation check alone lets the fetch from before the seek through:
    255..293 become a gap (Faust commits past it, unapplied) and the fetch from the seek is skipped as
    already delivered."""
    got = _drain([([294, 295], _seek), ([254, 255, 256], None)], committed=254, check=_generation_only)
    assert got.held == [(294, True), (295, True)] and got.read == 295
    assert got.gap == list(range(255, 295))  # Faust's gap ends with the message itself


def test_a_fetch_that_comes_back_after_a_whole_rebalance_is_dropped() -> None:
    """Asked for in one generation, back in the next (Faust labels it with the new one)."""
    got = _drain([([291, 292], _rebalance), ([254, 255], None)], committed=254)
    assert got == Fetched([(254, True), (255, True)], 255, [], 1)


def test_without_the_check_the_fetch_from_the_older_generation_skips_the_new_ones() -> None:
    """The negative control: the fetch from the older generation goes into the intake (labelled with
    the generation it was asked in, so the change agent drops it) and moves the read offset: 255..291
    become a gap and the fetch from the seek is skipped as already delivered."""
    got = _drain([([291, 292], _rebalance), ([254, 255], None)], committed=254, check=_flow_only)
    assert got.held == [(291, False), (292, False)] and got.gap == list(range(255, 292))


def test_a_seek_back_that_fails_is_retried_before_anything_is_fetched() -> None:
    """The broker is away when the loop seeks back: nothing is fetched until a seek succeeds (a fetch
    from the consumer's position would skip the dropped messages)."""
    got = _drain([([294, 295], _seek), ([254, 255, 256], None)], committed=254, failing_seeks=2)
    assert got == Fetched([(254, True), (255, True), (256, True)], 256, [], 3)


def _acks(batched: bool) -> tuple[list[bool], dict[TP, list[int]], set[int], int, bool]:
    """Acknowledge a mix (in order, duplicates, below the committed offset, a topic whose acks do not
    count) one message at a time with Faust's ``ack`` or in one ``ack_many``: what the consumer records."""
    other = TP("not-acked", 0)

    async def run() -> tuple[list[bool], dict[TP, list[int]], set[int], int, bool]:
        with _offline_app(f"acks-{batched}") as (app, consumer):
            app.topics._acking_topics.add(TOPIC)
            consumer._committed_offset[PART] = 320
            messages = [_message(offset, 1) for offset in (318, 320, 321, 322)]
            messages += [messages[2], _message(321, 1)]  # the same message twice, the same offset again
            messages.append(Message(other.topic, 0, 5, 0.0, 0, None, b"k", b"v", None, tp=other))
            if batched:
                consumer.ack_many(messages)
            else:
                for message in messages:
                    consumer.ack(message)
            return (
                [m.acked for m in messages],
                {tp: list(offsets) for tp, offsets in consumer._acked.items()},
                set(consumer._acked_index[PART]),
                consumer._n_acked,
                consumer._new_offset(PART) == 323,
            )

    return asyncio.run(run())


def test_acking_a_batch_records_what_acking_each_message_records() -> None:
    batched = _acks(batched=True)
    assert batched == _acks(batched=False)
    assert batched[1] == {PART: [320, 321, 322]} and batched[3] == 3 and batched[4]
