"""connectors.checkpoint: the checkpoint never moves past an unacknowledged event (invariant 4)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.checkpoint import (
    BinlogPosition,
    CheckpointError,
    CheckpointSaver,
    CheckpointState,
    CheckpointStore,
    CheckpointTracker,
)
from connectors.exceptions import ConfigurationError

START = BinlogPosition("binlog.000001", 4)


def expected_committed(
    boundaries: list[tuple[int, BinlogPosition]], acked: set[int], start: BinlogPosition
) -> BinlogPosition:
    """The oracle: the newest boundary whose events, and every earlier event, are acknowledged."""
    committed = start
    for count, position in boundaries:
        if all(seq in acked for seq in range(count)):
            committed = position
        else:
            break
    return committed


# --- tracker -----------------------------------------------------------------------------------------------


def test_starts_at_the_given_position_and_has_not_moved() -> None:
    tracker = CheckpointTracker(START)
    assert tracker.committed == START
    assert tracker.take_if_moved() is None
    assert tracker.outstanding == 0


def test_simple_transaction() -> None:
    tracker = CheckpointTracker(START)
    a, b = tracker.produced(), tracker.produced()
    assert (a, b) == (0, 1)
    end = BinlogPosition("binlog.000001", 500, "0-1-7")
    tracker.boundary(end)
    assert tracker.committed == START
    assert tracker.outstanding == 2
    tracker.acknowledged(b)
    assert tracker.committed == START  # event 0 not yet acknowledged
    assert tracker.take_if_moved() is None
    tracker.acknowledged(a)
    assert tracker.committed == end
    assert tracker.outstanding == 0
    assert tracker.take_if_moved() == end
    assert tracker.take_if_moved() is None


def test_boundary_after_acknowledgements_moves_at_once() -> None:
    tracker = CheckpointTracker(START)
    tracker.acknowledged(tracker.produced())
    assert tracker.committed == START  # no boundary yet: the transaction may have more events
    end = BinlogPosition("binlog.000001", 200)
    tracker.boundary(end)
    assert tracker.committed == end
    assert tracker.take_if_moved() == end


def test_empty_transaction_boundary_moves_when_everything_before_is_acked() -> None:
    tracker = CheckpointTracker(START)
    first = tracker.produced()
    p1, p2 = BinlogPosition("binlog.000001", 100), BinlogPosition("binlog.000001", 150)
    tracker.boundary(p1)
    tracker.boundary(p2)  # a transaction without row events (e.g. DDL filtered out)
    assert tracker.committed == START
    tracker.acknowledged(first)
    assert tracker.committed == p2


def test_take_if_moved_returns_latest_once() -> None:
    tracker = CheckpointTracker(START)
    positions = [BinlogPosition("binlog.000001", p) for p in (10, 20, 30)]
    for position in positions:
        tracker.acknowledged(tracker.produced())
        tracker.boundary(position)
    assert tracker.take_if_moved() == positions[-1]
    assert tracker.take_if_moved() is None
    tracker.acknowledged(0)  # a duplicate acknowledgement moves nothing
    assert tracker.take_if_moved() is None
    assert tracker.committed == positions[-1]


def test_across_binlog_files() -> None:
    tracker = CheckpointTracker(START)
    s = tracker.produced()
    tracker.boundary(BinlogPosition("binlog.000001", 900))
    t = tracker.produced()
    rotated = BinlogPosition("binlog.000002", 300)
    tracker.boundary(rotated)
    tracker.acknowledged(t)
    assert tracker.committed == START
    tracker.acknowledged(s)
    assert tracker.committed == rotated


_transactions = st.lists(st.integers(0, 4), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_transactions, st.data())
def test_never_moves_past_an_unacknowledged_event(sizes: list[int], data: st.DataObject) -> None:
    """All events produced first, then acknowledged in any order."""
    tracker = CheckpointTracker(START)
    boundaries: list[tuple[int, BinlogPosition]] = []
    seqs: list[int] = []
    for index, size in enumerate(sizes):
        seqs.extend(tracker.produced() for _ in range(size))
        position = BinlogPosition("binlog.000001", 1000 * (index + 1), f"0-1-{index + 1}")
        tracker.boundary(position)
        boundaries.append((len(seqs), position))
    assert seqs == list(range(len(seqs)))

    # Empty leading transactions are committed at once; the rest wait for acknowledgements.
    previous = expected_committed(boundaries, set(), START)
    assert tracker.committed == previous
    assert tracker.take_if_moved() == (previous if previous != START else None)
    order = data.draw(st.permutations(seqs))
    acked: set[int] = set()
    for seq in order:
        tracker.acknowledged(seq)
        acked.add(seq)
        want = expected_committed(boundaries, acked, START)
        assert tracker.committed == want
        moved = tracker.take_if_moved()
        assert moved == (want if want != previous else None)
        previous = want
        assert tracker.outstanding == len(seqs) - len(acked)
    assert tracker.committed == boundaries[-1][1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["produce", "boundary", "ack"]), max_size=60), st.data())
def test_interleaved_produce_boundary_ack(steps: list[str], data: st.DataObject) -> None:
    """Production, boundaries and acknowledgements interleaved as the two threads would do them."""
    tracker = CheckpointTracker(START)
    boundaries: list[tuple[int, BinlogPosition]] = []
    produced = 0
    outstanding: list[int] = []
    acked: set[int] = set()
    for step in steps:
        if step == "produce":
            seq = tracker.produced()
            assert seq == produced
            produced += 1
            outstanding.append(seq)
        elif step == "boundary":
            position = BinlogPosition("binlog.000001", 100 * (len(boundaries) + 1))
            tracker.boundary(position)
            boundaries.append((produced, position))
        elif outstanding:
            seq = outstanding.pop(data.draw(st.integers(0, len(outstanding) - 1)))
            tracker.acknowledged(seq)
            acked.add(seq)
        committed = tracker.committed
        assert committed == expected_committed(boundaries, acked, START)
        # Never past an unacknowledged event: every event before the committed boundary is acknowledged.
        for count, position in boundaries:
            if position == committed:
                assert all(s in acked for s in range(count))


def test_thread_safety_smoke() -> None:
    tracker = CheckpointTracker(START)
    total = 2000
    produced: list[int] = []
    ready = threading.Condition()
    last = BinlogPosition("binlog.000001", total * 10)

    def binlog_thread() -> None:
        for i in range(total):
            seq = tracker.produced()
            with ready:
                produced.append(seq)
                ready.notify()
            if i % 3 == 2 or i == total - 1:
                tracker.boundary(BinlogPosition("binlog.000001", (i + 1) * 10))

    def poll_thread() -> None:
        done = 0
        while done < total:
            with ready:
                while not produced:
                    ready.wait()
                batch = produced[:]
                produced.clear()
            for seq in reversed(batch):
                tracker.acknowledged(seq)
            done += len(batch)

    threads = [threading.Thread(target=binlog_thread), threading.Thread(target=poll_thread)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert tracker.outstanding == 0
    assert tracker.committed == last


# --- store -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "position",
    [BinlogPosition("binlog.000042", 12345), BinlogPosition("mysql-bin.000001", 4, "0-1-99")],
)
def test_store_round_trip(tmp_path: Path, position: BinlogPosition) -> None:
    store = CheckpointStore(tmp_path / "state" / "nested" / "checkpoint.json")
    assert store.load() is None
    store.save(position)
    assert store.load() == position
    assert CheckpointStore(store.path).load() == position


def test_store_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path)
    store.save(BinlogPosition("binlog.000001", 100))
    store.save(BinlogPosition("binlog.000002", 4, "0-1-5"))
    assert store.load() == BinlogPosition("binlog.000002", 4, "0-1-5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]
    assert json.loads(path.read_text()) == {"file": "binlog.000002", "pos": 4, "gtid": "0-1-5"}


def test_store_overwrites_a_stale_tmp_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    (tmp_path / "checkpoint.json.tmp").write_text("half a write from a crash")
    store = CheckpointStore(path)
    store.save(BinlogPosition("binlog.000003", 7))
    assert store.load() == BinlogPosition("binlog.000003", 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


@pytest.mark.parametrize(
    "content",
    [
        # unreadable
        "",
        "{not json",
        '{"file": "binlog.000001", "pos": ',
        "\x00\x01",
        # JSON of the wrong shape
        "{}",
        "null",
        "[]",
        '{"file": "binlog.000001"}',
        '{"file": "b.1", "pos": "x"}',
    ],
)
def test_store_unreadable_or_wrong_shape_file_names_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="unreadable") as info:
        CheckpointStore(path).load()
    assert str(path) in str(info.value)


def test_store_path_is_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    with pytest.raises(ValueError, match="unreadable") as info:
        CheckpointStore(path).load()
    assert str(path) in str(info.value)


def test_checkpoint_state_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    position = BinlogPosition("binlog.000002", 400, "0-1-9")
    store.save(
        position, change_topic="freshkey.changes", topic_ends={2: 17, 0: 5}, pending_gap="broker lost it"
    )
    assert store.load() == position
    assert store.load_state() == CheckpointState(
        position, "freshkey.changes", {0: 5, 2: 17}, "broker lost it"
    )
    store.save(position)
    assert store.load_state() == CheckpointState(position)


def test_unreadable_checkpoint_is_a_configuration_error_naming_accept_gap(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text('{"file": "binlog.000001", "pos": 4, "topic_ends": {"x": 1}}')
    with pytest.raises(CheckpointError, match="accept-gap") as info:
        CheckpointStore(path).load_state()
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, ValueError)


# --- saver -------------------------------------------------------------------------------------------------


def test_saver_saves_only_acknowledged_boundaries_with_the_topic_ends(tmp_path: Path) -> None:
    """The thread saves the committed position as it moves; stop() saves the last one, with the newest
    acknowledged offsets merged into the ends the session started with (an end never goes down)."""
    store = CheckpointStore(tmp_path / "checkpoint.json")
    tracker = CheckpointTracker(START)
    acked: dict[int, int] = {}
    saver = CheckpointSaver(
        store, tracker, change_topic="changes", topic_ends={0: 7, 1: 3}, acked_ends=lambda: dict(acked)
    )
    saver.start()
    first, second = BinlogPosition("binlog.000001", 200), BinlogPosition("binlog.000001", 300)
    a = tracker.produced()
    tracker.boundary(first)
    b = tracker.produced()
    tracker.boundary(second)
    acked.update({0: 2, 1: 9})  # Kafka's acknowledgement: the offsets first, then the event retired
    tracker.acknowledged(a)
    deadline = time.monotonic() + 5
    while store.load() != first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.load_state() == CheckpointState(first, "changes", {0: 7, 1: 9})
    assert saver.age() > 0, "an event still waits for Kafka"
    tracker.acknowledged(b)
    saver.stop()
    assert store.load_state() == CheckpointState(second, "changes", {0: 7, 1: 9})
    assert saver.age() == 0.0


def test_saver_writes_nothing_when_nothing_moved_or_was_acknowledged(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    saver = CheckpointSaver(
        store, CheckpointTracker(START), change_topic="changes", topic_ends={}, acked_ends=dict
    )
    saver.stop()  # never started: a session that failed before reading
    assert store.load() is None
