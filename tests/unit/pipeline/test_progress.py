"""ConsumerProgress: consumer lag in messages and in time, unknown partitions, with a fake clock."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.observe.progress import (
    OBSERVATIONS_PER_PARTITION,
    ConsumerProgress,
    PartitionFigures,
    PartitionProgress,
)
from tests.support.fakes import T0, Clock


def progress(clock: Clock, **overrides: object) -> ConsumerProgress:
    base: dict[str, object] = {"partitions": 3, "window_ms": 1500.0, "refresh_interval_s": 2.0}
    return ConsumerProgress("changes", clock=clock, **{**base, **overrides})  # type: ignore[arg-type]


def rows(p: ConsumerProgress) -> dict[int | None, PartitionProgress]:
    return {r.partition: r for r in p.snapshot().partitions}


def test_a_fresh_worker_lists_every_partition_as_unknown_never_an_empty_answer() -> None:
    clock = Clock()
    p = progress(clock)
    report = p.report()
    assert list(report) == ["changes/0", "changes/1", "changes/2"]
    for value in report.values():
        assert value["state"] == "unknown" and value["lag"] is None and value["assigned"] is False
        assert value["reason"] == "not assigned to this worker yet (joining the group)"
    assert p.snapshot().unknown == 3 and p.consumer_lag() == {} and p.ages() == {}
    assert orjson.loads(orjson.dumps(report)) == report, "the page's body is JSON as it is"

    nothing = ConsumerProgress("changes", partitions=None, clock=clock)
    assert list(nothing.report()) == ["changes/?"], "even the partition count unknown is said, not {}"
    assert nothing.report()["changes/?"]["reason"] == "the topic's partitions are not known yet"


def test_only_the_change_topic_counts() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.on_received("freshkey.hotness", 0, 7, clock.ms)
    p.on_offset("freshkey.hotness", 0, 7)
    assert rows(p)[0].state == "unknown" and rows(p)[0].acked_offset is None


def test_assigned_partitions_with_group_offsets_are_known_and_the_rest_leave_the_view() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0, 1})
    p.set_high_watermarks({0: 10, 1: 0, 2: 50})
    p.set_committed({0: 10, 1: None, 2: 40})
    view = rows(p)
    assert set(view) == {0, 1}, "partitions held by other workers are theirs to report"
    assert view[0].state == "caught_up" and view[0].lag == 0 and view[0].acked_offset == 9
    assert view[1].state == "caught_up" and view[1].lag == 0, "an empty partition has nothing waiting"
    assert view[0].age_ms == 0.0 and p.snapshot().unknown == 0
    assert p.consumer_lag() == {("changes", 0): 0, ("changes", 1): 0}


def test_a_wedged_worker_ages_from_the_oldest_message_it_received() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_high_watermarks({0: 5})
    p.set_committed({0: 5})
    assert rows(p)[0].state == "caught_up"
    p.on_received("changes", 0, 5, clock.ms - 100)  # produced 100 ms before it reached the agent
    p.on_received("changes", 0, 6, clock.ms)
    row = rows(p)[0]
    assert (row.state, row.lag, row.age_ms) == ("behind", 2, 100.0)
    clock.advance(1.4)
    assert rows(p)[0].age_ms == pytest.approx(1500.0) and rows(p)[0].state == "behind"
    clock.advance(0.01)
    row = rows(p)[0]
    assert row.state == "stalled" and row.age_ms == pytest.approx(1510.0), "nothing acknowledged: it grows"
    p.on_offset("changes", 0, 5)
    row = rows(p)[0]
    assert row.lag == 1 and row.age_ms == pytest.approx(1410.0), "the next oldest was received later"
    p.on_offset("changes", 0, 6)
    row = rows(p)[0]
    assert (row.state, row.lag, row.age_ms, row.acked_offset) == ("caught_up", 0, 0.0, 6)


def test_not_fetched_yet_ages_from_the_first_sighting_of_the_high_watermark() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_committed({0: 5})
    p.set_high_watermarks({0: 8})  # offsets 5..7 exist now, none received
    clock.advance(1.0)
    p.set_high_watermarks({0: 12})  # 8..11 appeared during the last second
    clock.advance(1.0)
    assert rows(p)[0].age_ms == pytest.approx(2000.0) and rows(p)[0].lag == 7
    p.on_offset("changes", 0, 7)
    assert rows(p)[0].age_ms == pytest.approx(1000.0), "offset 8 was first seen a second later"
    p.set_high_watermarks({0: 9})  # a lower figure (a lagging broker answer) changes nothing
    assert rows(p)[0].highwater == 12 and rows(p)[0].lag == 4


def test_a_timestamp_from_a_clock_ahead_is_capped_at_the_receipt() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_high_watermarks({0: 0})
    p.on_received("changes", 0, 0, clock.ms + 60_000)
    clock.advance(2.0)
    assert rows(p)[0].age_ms == pytest.approx(2000.0)
    p.on_received("changes", 0, 1, None)  # no timestamp at all: the receipt dates it
    p.on_offset("changes", 0, 0)
    clock.advance(0.5)
    assert rows(p)[0].age_ms == pytest.approx(500.0)


def test_the_first_message_after_an_assignment_is_where_the_group_stood() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({1})
    p.set_high_watermarks({1: 100})
    row = rows(p)[1]
    assert row.state == "unknown" and "no acknowledged position" in (row.reason or "")
    p.on_received("changes", 1, 42, clock.ms)
    row = rows(p)[1]
    assert (row.state, row.acked_offset, row.lag) == ("behind", 41, 58)
    p.on_received("changes", 1, 40, clock.ms)  # a replay below: the position does not go back
    assert rows(p)[1].acked_offset == 41


def test_reassigned_partition_starts_again_at_the_group_position() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_high_watermarks({0: 10})
    p.on_received("changes", 0, 0, clock.ms)
    p.on_offset("changes", 0, 9)
    p.set_assignment(set())  # revoked: another worker applies 10..499
    p.set_high_watermarks({0: 500})
    clock.advance(60)
    p.set_assignment({0})
    p.on_received("changes", 0, 500, clock.ms)
    row = rows(p)[0]
    assert (row.acked_offset, row.lag, row.age_ms) == (499, 1, 0.0), "not 60 s of someone else's work"


def test_without_a_position_messages_written_since_the_assignment_still_prove_a_wait() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_high_watermarks({0: 10})  # what is below 10 may or may not be applied: unknown
    clock.advance(5.0)
    row = rows(p)[0]
    assert row.state == "unknown" and row.age_ms is None and row.unknown_ms == pytest.approx(5000.0)
    p.set_high_watermarks({0: 11})
    clock.advance(2.0)
    row = rows(p)[0]
    assert row.state == "unknown" and row.lag is None
    assert row.age_ms == pytest.approx(2000.0), "offset 10 came after the assignment, and nothing was acked"


def test_received_but_no_high_watermark_yet_is_unknown_with_a_proven_age() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({2})
    p.on_received("changes", 2, 3, clock.ms)
    clock.advance(3.0)
    row = rows(p)[2]
    assert row.state == "unknown" and row.reason == "assigned, no high watermark yet"
    assert row.highwater is None and row.age_ms == pytest.approx(3000.0)


def test_unassigned_partitions_show_the_group_figures_and_their_proven_age() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_high_watermarks({0: 62_000, 1: 7, 2: 0})
    p.set_committed({0: 0, 1: 7, 2: None})
    clock.advance(2.0)
    p.set_high_watermarks({0: 62_100, 1: 7, 2: 0})
    p.set_committed({0: 0, 1: 7, 2: None})
    clock.advance(1.5)
    view = rows(p)
    assert all(r.state == "unknown" and r.lag is None and not r.assigned for r in view.values())
    assert (view[0].group_lag, view[0].group_age_ms) == (62_100, pytest.approx(2000.0)), (
        "proven up to the last read of the committed offset, not up to now"
    )
    assert (view[1].group_lag, view[1].group_age_ms) == (0, 0.0)
    assert view[2].group_lag is None and view[2].highwater == 0
    assert p.snapshot().unassigned_ms == pytest.approx(3500.0)
    p.set_assignment({0})
    assert p.snapshot().unassigned_ms is None
    p.set_assignment(())
    clock.advance(1.0)
    snapshot = p.snapshot()
    assert snapshot.unassigned_ms == pytest.approx(1000.0), "counted again from the revocation"
    assert snapshot.partitions[0].reason == "not assigned to this worker"


def test_observations_are_bounded_and_ages_stay_lower_bounds() -> None:
    clock = Clock()
    p = progress(clock)
    p.set_assignment({0})
    p.set_committed({0: 0})
    for high in range(1, 5001):
        p.set_high_watermarks({0: high})
        clock.advance(0.01)
    figures = p._parts[0]
    assert len(figures.seen) <= OBSERVATIONS_PER_PARTITION
    assert rows(p)[0].age_ms == pytest.approx(50_000.0), "the oldest sighting is kept"
    for acked in range(0, 4999, 97):
        p.on_offset("changes", 0, acked)
        true_age = clock.ms - (T0 * 1000 + acked * 10)  # offset acked+1 first appeared in step acked+1
        assert rows(p)[0].age_ms is not None and rows(p)[0].age_ms <= true_age + 1e-6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=40), st.integers(0, 60))
def test_existed_at_is_the_earliest_sighting_above_the_offset(
    observations: list[tuple[int, int]], offset: int
) -> None:
    figures = PartitionFigures()
    for high, at in observations:
        figures.observe(high, float(at))
    times = [at for high, at in observations if high > offset]
    assert figures.existed_at(offset) == (float(min(times)) if times else None)
    highs = [h for h, _ in figures.seen]
    stamps = [t for _, t in figures.seen]
    assert highs == sorted(set(highs)) and stamps == sorted(set(stamps)), "a strictly increasing frontier"


def test_bad_arguments_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        ConsumerProgress("changes", partitions=0)
    with pytest.raises(ValueError, match="positive"):
        ConsumerProgress("changes", window_ms=0)


def test_a_partition_whose_log_starts_again_is_not_reported_at_its_old_end() -> None:
    """A broker that lost its topics: the recreated partition's acknowledgements start again from 0.
    The old end must not keep the partition 'behind' (or 'caught up') until the new log passes it."""
    from pipeline.observe.progress import ConsumerProgress

    progress = ConsumerProgress("changes", partitions=1, window_ms=1500, refresh_interval_s=1.0)
    progress.set_assignment([0])
    progress.set_high_watermarks({0: 1000})
    progress.on_offset("changes", 0, 999)
    assert progress.consumer_lag()[("changes", 0)] == 0
    progress.on_offset("changes", 0, 4)  # the new log
    progress.set_high_watermarks({0: 10})
    assert progress.consumer_lag()[("changes", 0)] == 5
