"""connectors.resume without servers: the topic check that calls the fence hook before anything is
produced, the pending gap remembered across a failed fence, and the accepted gap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from connectors import resume
from connectors.checkpoint import BinlogPosition, CheckpointState, CheckpointStore
from connectors.exceptions import BinlogGapError, ConfigurationError, FenceError
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import TopicsReport
from connectors.metrics import ConnectorMetrics, ConnectorStats
from connectors.resume import OnGap, ResumeGuard
from connectors.settings import ConnectorSettings, MySQLSettings

POSITION = BinlogPosition("binlog.000004", 800)
CURRENT = BinlogPosition("binlog.000009", 4)
EXISTING = TopicsReport(partitions={"changes": 3, "dead": 3}, created=[])
RECREATED = TopicsReport(partitions={"changes": 3, "dead": 3}, created=["changes", "dead"])


def make_guard(tmp_path: Path, on_gap: OnGap | None, *, accept_gap: bool = False) -> ResumeGuard:
    return ResumeGuard(
        MySQLSettings(),
        KafkaSettings(change_topic="changes", partitions=3),
        ConnectorSettings(checkpoint_path=tmp_path / "checkpoint.json"),
        CheckpointStore(tmp_path / "checkpoint.json"),
        on_gap=on_gap,
        accept_gap=accept_gap,
        stats=ConnectorStats(),
        metrics=ConnectorMetrics(MeterProvider().get_meter("test")),
    )


# --- the topic check ----------------------------------------------------------------------------------


def test_a_recreated_change_topic_is_fenced_before_anything_else(tmp_path: Path) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    guard.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    state = guard.check_topic(CheckpointState(POSITION, "changes", {0: 10}), RECREATED, fresh=False)
    assert len(calls) == 1 and "'changes' was missing" in calls[0]
    assert state == CheckpointState(POSITION, "changes", {}, None)
    assert guard.store.load_state() == CheckpointState(POSITION, "changes", {}, None), "fenced: gap cleared"
    assert guard.stats.gaps == 1


def test_a_change_topic_shorter_than_what_kafka_acknowledged_is_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else (a worker) recreated the topic first: it exists, but ends below our acked offsets."""
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    monkeypatch.setattr(resume, "end_offsets", lambda *a, **k: {0: 0, 1: 3, 2: 0})
    monkeypatch.setattr(resume, "record_exists", lambda *a, **k: False)
    guard.check_topic(CheckpointState(POSITION, "changes", {0: 10, 1: 3}), EXISTING, fresh=False)
    assert len(calls) == 1 and "partition 0 ends at 0, not 10" in calls[0]
    assert "partition 1" not in calls[0]


def test_an_end_offset_below_the_acknowledged_end_is_no_gap_while_the_last_event_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some brokers report an end offset below the log end (Tansu: the last batch's base offset + 1):
    the event at the remembered end - 1 is read back, and found, so nothing was lost."""
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(resume, "end_offsets", lambda *a, **k: {0: 7, 1: 3, 2: 0})
    monkeypatch.setattr(resume, "record_exists", lambda _s, _t, p, o, **_k: asked.append((p, o)) or True)
    state = CheckpointState(POSITION, "changes", {0: 10, 1: 3})
    assert guard.check_topic(state, EXISTING, fresh=False) == state
    assert calls == [] and asked == [(0, 9)]


def test_a_topic_that_kept_its_events_is_not_a_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    monkeypatch.setattr(resume, "end_offsets", lambda *a, **k: {0: 12, 1: 3, 2: 0})
    state = CheckpointState(POSITION, "changes", {0: 10, 1: 3})
    assert guard.check_topic(state, EXISTING, fresh=False) == state
    assert calls == []


def test_a_fresh_start_creates_the_topic_without_a_fence(tmp_path: Path) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    guard.check_topic(CheckpointState(POSITION), RECREATED, fresh=True)
    assert calls == []
    assert guard.store.load() == POSITION, "the first checkpoint is saved once the topics exist"


def test_a_failed_fence_is_remembered_and_retried_by_the_next_session(tmp_path: Path) -> None:
    def broken(reason: str) -> None:
        raise ConnectionError("redis is down")

    guard = make_guard(tmp_path, broken)
    guard.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    with pytest.raises(FenceError, match="redis is down"):
        guard.check_topic(CheckpointState(POSITION, "changes", {0: 10}), RECREATED, fresh=False)
    saved = guard.store.load_state()
    assert saved is not None and saved.pending_gap is not None and "was missing" in saved.pending_gap
    # The next session finds the topic there (created above) but the gap pending: it fences again.
    calls: list[str] = []
    guard.on_gap = calls.append
    guard.check_topic(saved, EXISTING, fresh=False)
    assert len(calls) == 1 and "was missing" in calls[0]
    assert guard.store.load_state() == CheckpointState(POSITION, "changes", {}, None)


def test_a_loss_seen_while_producing_is_fenced_by_the_next_session_even_where_the_topic_looks_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer saw a partition's offsets go back (``ChangeProducer.rewound``): the checkpoint keeps
    the reason, and the next session fences although the topic's ends and last events are all there."""
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    guard.remember_gap("offsets went back")  # nothing saved yet: nothing acknowledged, nothing to fence
    assert guard.store.load_state() is None
    guard.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    guard.remember_gap("offsets went back")
    saved = guard.store.load_state()
    assert saved == CheckpointState(POSITION, "changes", {0: 10}, "offsets went back")
    monkeypatch.setattr(resume, "end_offsets", lambda *a, **k: {0: 12, 1: 0, 2: 0})
    monkeypatch.setattr(resume, "record_exists", lambda *a, **k: True)
    guard.check_topic(saved, EXISTING, fresh=False)
    assert calls == ["offsets went back"]
    assert guard.store.load_state() == CheckpointState(POSITION, "changes", {}, None)
    # Negative control: the same checkpoint without the reason is no gap.
    guard.check_topic(CheckpointState(POSITION, "changes", {0: 10}), EXISTING, fresh=False)
    assert calls == ["offsets went back"]


def test_a_gap_without_a_fence_hook_stops_the_run(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, None)
    with pytest.raises(ConfigurationError, match="no fence hook"):
        guard.check_topic(CheckpointState(POSITION, "changes", {0: 1}), RECREATED, fresh=False)


# --- where a session resumes ------------------------------------------------------------------------------


def purged(*args: Any, **kwargs: Any) -> None:
    raise BinlogGapError("binlog.000004 has been purged")


def test_a_purged_checkpoint_stops_the_run_without_accept_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append)
    guard.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    monkeypatch.setattr(resume, "check_position", purged)
    with pytest.raises(BinlogGapError, match="purged"):
        guard.resume_state()
    assert calls == [] and guard.store.load() == POSITION, "nothing fenced, the checkpoint kept"


def test_an_accepted_gap_fences_then_continues_from_the_current_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append, accept_gap=True)
    guard.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    monkeypatch.setattr(resume, "check_position", purged)
    monkeypatch.setattr(resume, "current_position", lambda *a, **k: CURRENT)
    state, fresh = guard.resume_state()
    assert len(calls) == 1 and "binlog gap accepted: binlog.000004 has been purged" in calls[0]
    assert (state, fresh) == (CheckpointState(CURRENT, "changes", {0: 10}), False)
    assert guard.store.load_state() == CheckpointState(CURRENT, "changes", {0: 10})


def test_an_unreadable_checkpoint_with_accept_gap_is_fenced_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    guard = make_guard(tmp_path, calls.append, accept_gap=True)
    guard.store.path.write_text("{not json")
    monkeypatch.setattr(resume, "current_position", lambda *a, **k: CURRENT)
    state, _ = guard.resume_state()
    assert len(calls) == 1 and "unreadable" in calls[0]
    assert state.position == CURRENT and guard.store.load() == CURRENT


def test_no_checkpoint_starts_fresh_at_the_current_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = make_guard(tmp_path, None)
    monkeypatch.setattr(resume, "current_position", lambda *a, **k: CURRENT)
    assert guard.resume_state() == (CheckpointState(CURRENT), True)
    assert guard.store.load() is None, "saved only once the topics exist (check_topic)"
