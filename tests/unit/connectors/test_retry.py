"""The connector's retry rule and its loop of sessions, without servers.

retry_cause() decides what a new session can cure (servers away) and what it cannot (configuration,
bugs, gaps). The loop is driven with a stand-in session: backoff, WARNING lines with the attempt
number, the retry metric, the reset after a stable session, giving up after the configured attempts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pymysql
import pytest
from confluent_kafka import KafkaError, KafkaException
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from connectors import runner
from connectors.exceptions import (
    BinlogGapError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeliveryError,
    FenceError,
    KafkaUnavailableError,
    RetriesExhaustedError,
    retry_cause,
)
from connectors.settings import ConnectorSettings, KafkaSettings, MySQLSettings


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"), "database"),
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), "database"),
        (pymysql.err.OperationalError(2006, "MySQL server has gone away"), "database"),
        (pymysql.err.OperationalError(1053, "Server shutdown in progress"), "database"),
        (pymysql.err.OperationalError(1927, "Connection was killed"), "database"),
        (pymysql.err.InterfaceError(0, ""), "database"),
        (DatabaseUnavailableError("away"), "database"),
        (KafkaUnavailableError("down"), "kafka"),
        (DeliveryError("UNKNOWN_PRODUCER_ID"), "kafka"),
        (FenceError("redis down"), "fence"),
        (KafkaException(KafkaError(KafkaError._FATAL)), "kafka"),
        (KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID)), "kafka"),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), "kafka"),
        (KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)), "kafka"),
    ],
)
def test_servers_away_are_retried(exc: BaseException, cause: str) -> None:
    assert retry_cause(exc) == cause


@pytest.mark.parametrize(
    "exc",
    [
        pymysql.err.OperationalError(1045, "Access denied for user 'freshkey'@'localhost'"),
        pymysql.err.OperationalError(1227, "Access denied; you need the REPLICATION SLAVE privilege"),
        pymysql.err.OperationalError(1236, "Could not find first log file name in binary log index file"),
        pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"),
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
        KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED)),
        KafkaException(KafkaError(KafkaError._INVALID_ARG)),
        ConfigurationError("binlog_format is STATEMENT"),
        BinlogGapError("binlog.000001 has been purged"),
        RetriesExhaustedError("gave up"),
        ValueError("a bug"),
        KeyError("a bug"),
        KeyboardInterrupt(),
        SystemExit(0),
    ],
)
def test_configuration_bugs_gaps_and_interrupts_are_not_retried(exc: BaseException) -> None:
    assert retry_cause(exc) is None


# --- the loop of sessions --------------------------------------------------------------------------------


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> InMemoryMetricReader:
    """The runner's instruments on an in-memory SDK reader."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("freshkey")
    monkeypatch.setattr(runner, "_retries", meter.create_counter("freshkey.connector.retries"))
    return reader


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


def make_run(tmp_path: Path, **connector: Any) -> runner._Run:
    settings = ConnectorSettings(
        checkpoint_path=tmp_path / "checkpoint.json",
        retry_initial_backoff_s=0.001,
        retry_max_backoff_s=0.004,
        **connector,
    )
    return runner._Run(
        MySQLSettings(),
        KafkaSettings(),
        settings,
        [("shop", "assets")],
        registry=None,
        on_gap=None,
        accept_gap=False,
        on_ready=None,
        progress_every_s=5.0,
    )


def scripted(run: runner._Run, outcomes: list[BaseException | None]) -> list[int]:
    """Replace the session by one that raises the next outcome (None: a clean stop); returns the
    consecutive-failure count each session started with."""
    seen: list[int] = []

    def session() -> None:
        seen.append(run.failures)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    run._session = session  # type: ignore[method-assign]
    return seen


def test_retriable_failures_start_new_sessions_with_a_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reader: InMemoryMetricReader
) -> None:
    run = make_run(tmp_path)
    scripted(
        run,
        [
            pymysql.err.OperationalError(2003, "Can't connect to MySQL server"),
            KafkaUnavailableError("Kafka at 127.0.0.1:9092 does not answer"),
            DeliveryError("the Kafka producer failed for good: UNKNOWN_PRODUCER_ID"),
            None,
        ],
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


def test_a_configuration_error_ends_the_run_at_once(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    seen = scripted(run, [DatabaseUnavailableError("away"), ConfigurationError("set binlog_format=ROW")])
    with pytest.raises(ConfigurationError, match="binlog_format"):
        run.run()
    assert seen == [0, 1]


def test_a_bug_is_not_retried(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    seen = scripted(run, [ValueError("a bug")])
    with pytest.raises(ValueError, match="a bug"):
        run.run()
    assert seen == [0]


def test_gives_up_after_max_attempts_consecutive_failures(tmp_path: Path) -> None:
    run = make_run(tmp_path, retry_max_attempts=3)
    seen = scripted(run, [DatabaseUnavailableError("away")] * 5)
    with pytest.raises(RetriesExhaustedError, match="gave up after 3 consecutive") as info:
        run.run()
    assert seen == [0, 1, 2]
    assert isinstance(info.value.__cause__, DatabaseUnavailableError)


def test_a_stable_session_resets_the_count(tmp_path: Path) -> None:
    """Two failures in a row give up with max 2, but not when the session between them was stable."""
    run = make_run(tmp_path, retry_max_attempts=2)
    outcomes: list[BaseException | None] = [
        DatabaseUnavailableError("away"),
        KafkaUnavailableError("down"),
        None,
    ]
    seen: list[int] = []

    def session() -> None:
        seen.append(run.failures)
        if len(seen) == 2:
            run.failures = 0  # what _read does once a session has read for STABLE_AFTER_S
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    run._session = session  # type: ignore[method-assign]
    run.run()
    assert seen == [0, 1, 1]


def test_backoff_doubles_up_to_the_cap_with_jitter(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.connector = ConnectorSettings(retry_initial_backoff_s=1.0, retry_max_backoff_s=30.0)
    waits = {}
    for failures in (1, 2, 3, 5, 6, 100, 10_000):
        run.failures = failures
        waits[failures] = [run._backoff(None) for _ in range(50)]  # type: ignore[arg-type]
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


def test_backoff_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="RETRY_MAX_BACKOFF_S"):
        ConnectorSettings(retry_initial_backoff_s=10, retry_max_backoff_s=1)


def test_connected_gauge_is_registered_while_running(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    states: list[list[int]] = []

    def session() -> None:
        states.append([observe() for observe in runner._connected])

    run._session = session  # type: ignore[method-assign]
    run.run()
    assert states == [[0]]
    assert runner._connected == []
