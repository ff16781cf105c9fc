"""Gaps without servers: a checkpoint the server's binlog list cannot serve, the message that says what
to do, the checkpoint file's topic ends and pending gap, and the topic check that calls the fence hook
before anything is produced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors import runner
from connectors.binlog import gap_message, position_problem
from connectors.checkpoint import BinlogPosition, CheckpointError, CheckpointState, CheckpointStore
from connectors.exceptions import BinlogGapError, ConfigurationError, FenceError
from connectors.settings import ConnectorSettings, KafkaSettings, MySQLSettings
from connectors.topics import TopicsReport

LOGS = [("binlog.000005", 1200), ("binlog.000006", 380), ("binlog.000007", 9000)]


@pytest.mark.parametrize(
    ("position", "problem"),
    [
        (BinlogPosition("binlog.000005", 4), None),
        (BinlogPosition("binlog.000007", 9000), None),
        (
            BinlogPosition("binlog.000003", 1077),
            "binlog.000003 has been purged; the oldest binlog the server still has is binlog.000005",
        ),
        (
            BinlogPosition("binlog.000009", 4),
            "binlog.000009 is not on the server, whose binlogs are binlog.000005 to binlog.000007",
        ),
        (BinlogPosition("binlog.000006", 381), "position 381 is past the end of binlog.000006 (380 bytes)"),
    ],
)
def test_position_problem(position: BinlogPosition, problem: str | None) -> None:
    found = position_problem(position, LOGS)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


def test_no_binlogs_at_all() -> None:
    assert "log_bin" in (position_problem(BinlogPosition("binlog.000001", 4), []) or "")


def test_gap_message_names_the_files_and_the_ways_on() -> None:
    position = BinlogPosition("binlog.000003", 1077)
    problem = position_problem(position, LOGS)
    assert problem is not None
    message = gap_message(position, problem, checkpoint=Path("/var/lib/freshkey/checkpoint.json"))
    assert "binlog.000003:1077" in message and "binlog.000005" in message
    assert "/var/lib/freshkey/checkpoint.json" in message
    assert "freshkey connector --accept-gap" in message and "freshkey snapshot" in message
    assert "binlog_expire_logs_seconds" in message


# --- the checkpoint file -----------------------------------------------------------------------------


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


# --- the topic check ----------------------------------------------------------------------------------


def make_run(tmp_path: Path, on_gap: Any) -> runner._Run:
    return runner._Run(
        MySQLSettings(),
        KafkaSettings(change_topic="changes", partitions=3),
        ConnectorSettings(checkpoint_path=tmp_path / "checkpoint.json"),
        [("shop", "assets")],
        registry=None,
        on_gap=on_gap,
        accept_gap=False,
        on_ready=None,
        progress_every_s=5.0,
    )


POSITION = BinlogPosition("binlog.000004", 800)
EXISTING = TopicsReport(partitions={"changes": 3, "dead": 3}, created=[])
RECREATED = TopicsReport(partitions={"changes": 3, "dead": 3}, created=["changes", "dead"])


def test_a_recreated_change_topic_is_fenced_before_anything_else(tmp_path: Path) -> None:
    calls: list[str] = []
    run = make_run(tmp_path, calls.append)
    run.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    state = run._check_topic(CheckpointState(POSITION, "changes", {0: 10}), RECREATED, fresh=False)
    assert len(calls) == 1 and "'changes' was missing" in calls[0]
    assert state == CheckpointState(POSITION, "changes", {}, None)
    assert run.store.load_state() == CheckpointState(POSITION, "changes", {}, None), "fenced: gap cleared"
    assert run.stats.gaps == 1


def test_a_change_topic_shorter_than_what_kafka_acknowledged_is_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else (a worker) recreated the topic first: it exists, but ends below our acked offsets."""
    calls: list[str] = []
    run = make_run(tmp_path, calls.append)
    monkeypatch.setattr(runner, "end_offsets", lambda *a, **k: {0: 0, 1: 3, 2: 0})
    run._check_topic(CheckpointState(POSITION, "changes", {0: 10, 1: 3}), EXISTING, fresh=False)
    assert len(calls) == 1 and "partition 0 ends at 0, not 10" in calls[0]
    assert "partition 1" not in calls[0]


def test_a_topic_that_kept_its_events_is_not_a_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    run = make_run(tmp_path, calls.append)
    monkeypatch.setattr(runner, "end_offsets", lambda *a, **k: {0: 12, 1: 3, 2: 0})
    state = CheckpointState(POSITION, "changes", {0: 10, 1: 3})
    assert run._check_topic(state, EXISTING, fresh=False) == state
    assert calls == []


def test_a_fresh_start_creates_the_topic_without_a_fence(tmp_path: Path) -> None:
    calls: list[str] = []
    run = make_run(tmp_path, calls.append)
    run._check_topic(CheckpointState(POSITION), RECREATED, fresh=True)
    assert calls == []
    assert run.store.load() == POSITION, "the first checkpoint is saved once the topics exist"


def test_a_failed_fence_is_remembered_and_retried_by_the_next_session(tmp_path: Path) -> None:
    def broken(reason: str) -> None:
        raise ConnectionError("redis is down")

    run = make_run(tmp_path, broken)
    run.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    with pytest.raises(FenceError, match="redis is down"):
        run._check_topic(CheckpointState(POSITION, "changes", {0: 10}), RECREATED, fresh=False)
    saved = run.store.load_state()
    assert saved is not None and saved.pending_gap is not None and "was missing" in saved.pending_gap
    # The next session finds the topic there (created above) but the gap pending: it fences again.
    calls: list[str] = []
    run.on_gap = calls.append
    run._check_topic(saved, EXISTING, fresh=False)
    assert len(calls) == 1 and "was missing" in calls[0]
    assert run.store.load_state() == CheckpointState(POSITION, "changes", {}, None)


def test_a_gap_without_a_fence_hook_stops_the_run(tmp_path: Path) -> None:
    run = make_run(tmp_path, None)
    with pytest.raises(ConfigurationError, match="no fence hook"):
        run._check_topic(CheckpointState(POSITION, "changes", {0: 1}), RECREATED, fresh=False)


# --- a server that refuses to send the binlog mid-stream (error 1236) ------------------------------------


def refused(said: str) -> ConfigurationError:
    from connectors.binlog import BinlogSource

    source = BinlogSource(
        MySQLSettings(port=1, server_id=777),
        [("shop", "assets")],
        start=POSITION,
        checkpoint=Path("/cp.json"),
    )
    return source._refused(BinlogPosition("binlog.000004", 900), said)


def test_1236_for_a_purged_file_is_a_gap_naming_the_way_on() -> None:
    error = refused("Could not find first log file name in binary log index file")
    assert isinstance(error, BinlogGapError)
    text = str(error)
    assert "binlog.000004:900" in text and "/cp.json" in text and "--accept-gap" in text
    assert "Could not find first log file name" in text, "the server's own words"


def test_1236_for_a_duplicate_server_id_names_the_setting() -> None:
    error = refused("A slave with the same server_uuid/server_id as this slave has connected to the master")
    assert not isinstance(error, BinlogGapError)
    assert "FRESHKEY_MYSQL_SERVER_ID" in str(error) and "777" in str(error)


def test_1236_for_a_too_large_event_names_max_allowed_packet() -> None:
    error = refused("log event entry exceeded max_allowed_packet; Increase max_allowed_packet on master")
    assert not isinstance(error, BinlogGapError) and "SET GLOBAL max_allowed_packet" in str(error)


def test_a_gap_accepted_mid_stream_is_not_overwritten_by_the_sessions_last_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream answers 1236 after the session acked events: the session's final save (old position)
    must come before the accepted one (current position), or the next session resumes in the gap."""
    from connectors.doctor import ServerInfo
    from connectors.exceptions import RetriableError

    current = BinlogPosition("binlog.000009", 4)

    class Producer:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def acked_ends(self, topic: str) -> dict[int, int]:
            return {0: 11}

        def close(self, timeout_s: float, *, purge: bool = False) -> int:
            return 0

    class Source:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __iter__(self) -> Any:
            raise BinlogGapError("binlog.000004 has been purged")

        def close(self) -> None:
            pass

    monkeypatch.setattr(runner, "require_ready", lambda mysql: ServerInfo("10.11", "mariadb", 1))
    monkeypatch.setattr(runner, "check_position", lambda *a, **k: None)
    monkeypatch.setattr(runner, "prepare_topics", lambda *a, **k: EXISTING)
    monkeypatch.setattr(runner, "end_offsets", lambda *a, **k: {0: 10, 1: 0, 2: 0})
    monkeypatch.setattr(runner, "current_position", lambda *a, **k: current)
    monkeypatch.setattr(runner, "ChangeProducer", Producer)
    monkeypatch.setattr(runner, "BinlogSource", Source)
    calls: list[str] = []
    run = make_run(tmp_path, calls.append)
    run.accept_gap = True
    run.store.save(POSITION, change_topic="changes", topic_ends={0: 10})
    with pytest.raises(RetriableError) as info:
        run._attempt()
    assert info.value.cause == "gap"
    assert len(calls) == 1 and "binlog.000004 has been purged" in calls[0]
    assert run.store.load() == current
