"""Errors of the edges, under one root, and the rule that says which of them a retry can cure.

Two families matter to a long-running process:

- :class:`ConfigurationError`: the servers or the settings are not usable (bad credentials, a missing
  privilege, the binlog off, a wrong partition count, a checkpoint the server cannot serve any more).
  Waiting does not fix these: the message says what to change and the process exits.
- :class:`RetriableError`: a server is away for now (connection refused or lost, a broker down or
  restarted). The connector ends its session, waits with backoff and starts a new one from its
  checkpoint; :func:`retry_cause` also recognises the raw client errors (pymysql, confluent-kafka)
  that mean the same.
"""

from __future__ import annotations

from typing import Literal

import pymysql
from confluent_kafka import KafkaError, KafkaException

from schemas.errors import Fatal, FreshkeyError, Misconfigured, Unavailable

RetryCause = Literal["database", "kafka", "fence", "gap"]
"""What a retriable failure was about; the ``cause`` attribute of ``freshkey.connector.retries``."""


class ConnectorError(FreshkeyError):
    """Root of every error raised by ``connectors``."""


class ConfigurationError(ConnectorError, Misconfigured):
    """The source server or the settings are not usable; the message says exactly what to change."""


class BinlogGapError(ConfigurationError):
    """The binlog position the checkpoint needs is gone (purged) or unreadable on the server.

    Resuming is impossible without losing changes; the message names the file the checkpoint needs,
    the oldest file the server still has and the ways on (``freshkey connector --accept-gap``).
    """


class RetriableError(ConnectorError, Unavailable):
    """A server is unavailable for now; a new session after a backoff may succeed."""

    cause: RetryCause = "kafka"

    def __init__(self, message: str, *, cause: RetryCause | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.cause = cause


class DatabaseUnavailableError(RetriableError):
    """The MySQL/MariaDB server refused or lost the connection (down, restarting, unreachable)."""

    cause: RetryCause = "database"


class KafkaUnavailableError(RetriableError):
    """No Kafka broker answers (down, restarting, unreachable)."""

    cause: RetryCause = "kafka"


class DeliveryError(RetriableError):
    """Kafka refused or timed out an event, or the producer failed for good; the checkpoint stays before
    it, and a new session (a new producer) replays from there."""

    cause: RetryCause = "kafka"


class FenceError(RetriableError):
    """The fence hook (called before producing after a gap) failed: nothing is produced until it ran."""

    cause: RetryCause = "fence"


class RetriesExhaustedError(ConnectorError, Fatal):
    """FRESHKEY_CONNECTOR_RETRY_MAX_ATTEMPTS consecutive sessions failed; the last failure is chained."""


# Client error codes (pymysql's OperationalError args[0]) that mean "the server is away", not "the
# settings are wrong". 1045 (access denied), 1227 (missing privilege) and the like are not here: waiting
# does not fix them.
MYSQL_RETRIABLE_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1152,  # aborted connection
        1158,  # got an error reading communication packets
        1159,  # got timeout reading communication packets
        1160,  # got an error writing communication packets
        1161,  # got timeout writing communication packets
        1927,  # MariaDB: connection was killed
        2002,  # can't connect through the socket
        2003,  # can't connect to the server (refused, unreachable)
        2005,  # unknown host: containers resolve names only once their peer runs
        2006,  # server has gone away
        2013,  # lost connection during query (also a read timeout)
        2055,  # lost connection at ... system error
        3169,  # MySQL: session was killed
        4031,  # MySQL: disconnected by the server because of inactivity
    }
)

# Kafka errors that a new session cannot cure: credentials and authorizations.
KAFKA_CONFIGURATION_CODES = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._INVALID_ARG,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def kafka_error_code(exc: BaseException) -> int | None:
    """The librdkafka error code carried by a KafkaException, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        code: int = exc.args[0].code()
        return code
    return None


def retry_cause(exc: BaseException) -> RetryCause | None:
    """What a new session after a backoff could cure in ``exc``, or None when retrying cannot help.

    Not retriable: configuration errors, errors of the program itself (a bug must show, not loop), a
    binlog gap (1236: the position is gone for good) and Ctrl-C/SIGTERM.
    """
    if isinstance(exc, RetriableError):
        return exc.cause
    if isinstance(exc, ConnectorError):
        return None
    if isinstance(exc, pymysql.err.OperationalError):
        code = exc.args[0] if exc.args else None
        return "database" if code in MYSQL_RETRIABLE_CODES else None
    if isinstance(exc, pymysql.err.InterfaceError):
        return "database"  # a query on a connection the server closed
    if isinstance(exc, KafkaException):
        code = kafka_error_code(exc)
        return None if code in KAFKA_CONFIGURATION_CODES else "kafka"
    return None


CAUSE_TEXT: dict[str, str] = {
    "database": "database unavailable",
    "kafka": "kafka unavailable",
    "fence": "fence failed",
    "gap": "binlog gap accepted",
}
"""How the retry line names each cause of a failed session."""


def describe(exc: BaseException | None) -> str:
    """An exception for a log line: our own errors by their message, others with their class."""
    if exc is None:
        return "(no exception)"
    text = str(exc) or repr(exc)
    if isinstance(exc, ConnectorError):
        return text
    return f"{type(exc).__name__}: {text}"
