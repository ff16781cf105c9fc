"""connectors.exceptions.retry_cause: what a new session can cure (servers away) and what it cannot
(configuration, bugs, gaps, interrupts)."""

from __future__ import annotations

import pymysql
import pytest
from confluent_kafka import KafkaError, KafkaException

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
