"""connectors.runner without servers: the loop of sessions driven with a stand-in session (backoff,
WARNING lines with the attempt number, the retry metric, the reset after a stable session, giving up
after the configured attempts), and a session that meets a gap mid-stream."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pymysql
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from connectors import resume, runner
from connectors.backoff import RetryPolicy
from connectors.checkpoint import BinlogPosition
from connectors.doctor import ServerInfo
from connectors.exceptions import (
    BinlogGapError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeliveryError,
    KafkaUnavailableError,
    RetriableError,
    RetriesExhaustedError,
)
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import TopicsReport
from connectors.metrics import ConnectorMetrics
from connectors.runner import ConnectorRun
from connectors.settings import ConnectorSettings, MySQLSettings


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


def retries_by_cause(reader: InMemoryMetricReader) -> dict[str, int]:
    data = reader.get_metrics_data()
    found: dict[str, int] = {}
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "freshkey.connector.retries":
                    for point in metric.data.data_points:
                        found[str(point.attributes["cause"])] = int(point.value)
    return found


def make_run(tmp_path: Path, reader: InMemoryMetricReader | None = None, **connector: Any) -> ConnectorRun:
    settings = ConnectorSettings(
        checkpoint_path=tmp_path / "checkpoint.json",
        retry_initial_backoff_s=0.001,
        retry_max_backoff_s=0.004,
        **connector,
    )
    provider = MeterProvider(metric_readers=[reader] if reader is not None else [])
    return ConnectorRun(
        MySQLSettings(),
        KafkaSettings(change_topic="changes", partitions=3),
        settings,
        [("shop", "assets")],
        metrics=ConnectorMetrics(provider.get_meter("test")),
    )


def scripted(
    run: ConnectorRun, outcomes: list[BaseException | None], monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Replace the session by one that raises the next outcome (None: a clean stop); returns the
    consecutive-failure count each session started with."""
    seen: list[int] = []

    def session() -> None:
        seen.append(run.retry.failures)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(run, "session", session)
    return seen


def test_retriable_failures_start_new_sessions_with_a_warning_each(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    reader: InMemoryMetricReader,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = make_run(tmp_path, reader)
    scripted(
        run,
        [
            pymysql.err.OperationalError(2003, "Can't connect to MySQL server"),
            KafkaUnavailableError("Kafka at 127.0.0.1:9092 does not answer"),
            DeliveryError("the Kafka producer failed for good: UNKNOWN_PRODUCER_ID"),
            None,
        ],
        monkeypatch,
    )
    with caplog.at_level(logging.WARNING, logger="connectors.runner"):
        stats = run.run()
    assert stats.retries == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings
    assert "database unavailable" in warnings[0] and "OperationalError" in warnings[0]
    assert "next attempt 2 in" in warnings[0]
    assert "kafka unavailable" in warnings[1] and "next attempt 3 in" in warnings[1]
    assert "UNKNOWN_PRODUCER_ID" in warnings[2] and "next attempt 4 in" in warnings[2]
    assert retries_by_cause(reader) == {"database": 1, "kafka": 2, "fence": 0, "gap": 0}, "every cause from 0"


def test_a_configuration_error_ends_the_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    seen = scripted(
        run, [DatabaseUnavailableError("away"), ConfigurationError("set binlog_format=ROW")], monkeypatch
    )
    with pytest.raises(ConfigurationError, match="binlog_format"):
        run.run()
    assert seen == [0, 1]


def test_a_bug_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    seen = scripted(run, [ValueError("a bug")], monkeypatch)
    with pytest.raises(ValueError, match="a bug"):
        run.run()
    assert seen == [0]


def test_gives_up_after_max_attempts_consecutive_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path, retry_max_attempts=3)
    seen = scripted(run, [DatabaseUnavailableError("away")] * 5, monkeypatch)
    with pytest.raises(RetriesExhaustedError, match="gave up after 3 consecutive") as info:
        run.run()
    assert seen == [0, 1, 2]
    assert isinstance(info.value.__cause__, DatabaseUnavailableError)


def test_a_stable_session_resets_the_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two failures in a row give up with max 2, but not when the session between them was stable."""
    run = make_run(tmp_path, retry_max_attempts=2)
    outcomes: list[BaseException | None] = [
        DatabaseUnavailableError("away"),
        KafkaUnavailableError("down"),
        None,
    ]
    seen: list[int] = []

    def session() -> None:
        seen.append(run.retry.failures)
        if len(seen) == 2:
            run.retry.stable()  # what reading does once a session has read for STABLE_AFTER_S
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(run, "session", session)
    run.run()
    assert seen == [0, 1, 1]


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    policy = RetryPolicy(ConnectorSettings(retry_initial_backoff_s=1.0, retry_max_backoff_s=30.0))
    waits = {}
    for failures in (1, 2, 3, 5, 6, 100, 10_000):
        policy.failures = failures
        waits[failures] = [policy.backoff() for _ in range(50)]
    for failures, expected in (
        (1, 1.0),
        (2, 2.0),
        (3, 4.0),
        (5, 16.0),
        (6, 30.0),
        (100, 30.0),
        (10_000, 30.0),
    ):
        assert all(expected / 2 <= w <= expected for w in waits[failures]), (failures, waits[failures])
        assert len(set(waits[failures])) > 1, "jittered"


def test_the_policy_gives_up_only_with_a_limit() -> None:
    unlimited = RetryPolicy(ConnectorSettings(retry_max_attempts=0))
    unlimited.failures = 10_000
    assert not unlimited.exhausted() and unlimited.next_attempt() == "10001"
    limited = RetryPolicy(ConnectorSettings(retry_max_attempts=3))
    limited.failures = 2
    assert not limited.exhausted() and limited.next_attempt() == "3 of 3"
    limited.failed()
    assert limited.exhausted()


def test_backoff_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="RETRY_MAX_BACKOFF_S"):
        ConnectorSettings(retry_initial_backoff_s=10, retry_max_backoff_s=1)


def test_connected_gauge_is_registered_while_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    states: list[list[int]] = []

    def session() -> None:
        states.append([observe() for observe in run.metrics.connection_states])

    monkeypatch.setattr(run, "session", session)
    run.run()
    assert states == [[0]]
    assert run.metrics.connection_states == []


# --- a gap met mid-stream ---------------------------------------------------------------------------------


def test_a_gap_accepted_mid_stream_is_not_overwritten_by_the_sessions_last_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream answers 1236 after the session acked events: the session's final save (old position)
    must come before the accepted one (current position), or the next session resumes in the gap."""
    position = BinlogPosition("binlog.000004", 800)
    current = BinlogPosition("binlog.000009", 4)

    class Producer:
        rewound = None

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

    existing = TopicsReport(partitions={"changes": 3, "dead": 3}, created=[])
    monkeypatch.setattr(runner, "require_ready", lambda mysql: ServerInfo("10.11", "mariadb", 1))
    monkeypatch.setattr(runner, "prepare_topics", lambda *a, **k: existing)
    monkeypatch.setattr(runner, "ChangeProducer", Producer)
    monkeypatch.setattr(runner, "BinlogSource", Source)
    monkeypatch.setattr(resume, "check_position", lambda *a, **k: None)
    monkeypatch.setattr(resume, "end_offsets", lambda *a, **k: {0: 10, 1: 0, 2: 0})
    monkeypatch.setattr(resume, "current_position", lambda *a, **k: current)
    calls: list[str] = []
    run = make_run(tmp_path)
    run.guard.on_gap = calls.append
    run.guard.accept_gap = True
    run.store.save(position, change_topic="changes", topic_ends={0: 10})
    with pytest.raises(RetriableError) as info:
        run.attempt()
    assert info.value.cause == "gap"
    assert len(calls) == 1 and "binlog.000004 has been purged" in calls[0]
    saved = run.store.load_state()
    assert saved is not None and saved.position == current
    assert saved.topic_ends == {0: 11}, "the session's last save (Kafka's acks) came first, then the gap's"
    assert run.retry.failures == 1, "a retriable end counts as a failed session"
