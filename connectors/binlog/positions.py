"""Binlog positions on the server: where it ends now, whether it can still serve a checkpoint, and the
errors that say what to do when it cannot.

A position the server cannot serve any more (its file purged, error 1236) is a
:class:`~connectors.exceptions.BinlogGapError`, whose message names the file needed, the oldest file the
server still has and the ways on. :func:`position_problem`, :func:`gap_message` and
:func:`refusal_error` are pure; :func:`binary_logs`, :func:`check_position` and :func:`current_position`
ask the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pymysql

from connectors.checkpoint import BinlogPosition
from connectors.exceptions import (
    BinlogGapError,
    ConfigurationError,
    ConnectorError,
    DatabaseUnavailableError,
    retry_cause,
)
from connectors.mysql import Connection
from connectors.settings import MySQLSettings

log = logging.getLogger(__name__)

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
"""The server cannot send the binlog from the asked position (purged file, impossible position...)."""

ACCEPT_GAP_HINT = (
    "run `freshkey connector --accept-gap --snapshot`: it fences every bound namespace first (nothing "
    "cached before is served), continues from the current binlog position and snapshots the bound tables "
    "to refill the caches (or `freshkey connector --accept-gap`, then `freshkey snapshot`, in two steps)"
)

BinaryLogs = Sequence[tuple[str, int]]
"""``SHOW BINARY LOGS``: (file name, size in bytes), oldest first."""


def position_problem(position: BinlogPosition, logs: BinaryLogs) -> str | None:
    """Why the server cannot serve the binlog from ``position`` (given its ``SHOW BINARY LOGS``), or
    None when it can."""
    if not logs:
        return "the server lists no binary logs (is log_bin on?)"
    sizes = dict(logs)
    if position.file not in sizes:
        oldest = logs[0][0]
        if position.file < oldest:
            return f"{position.file} has been purged; the oldest binlog the server still has is {oldest}"
        return (
            f"{position.file} is not on the server, whose binlogs are {oldest} to {logs[-1][0]} "
            "(another server, or its binlog was reset)"
        )
    if position.pos > sizes[position.file]:
        return (
            f"position {position.pos} is past the end of {position.file} ({sizes[position.file]} bytes); "
            f"the oldest binlog the server still has is {logs[0][0]}"
        )
    return None


def gap_message(
    position: BinlogPosition, problem: str, *, checkpoint: Path | str | None = None, detail: str = ""
) -> str:
    """The error a connector stops with when it cannot resume from ``position``."""
    where = f" (checkpoint {checkpoint})" if checkpoint is not None else ""
    said = f" The server said: {detail}." if detail else ""
    return (
        f"cannot resume the binlog at {position.file}:{position.pos}{where}: {problem}.{said} The changes "
        "in between are lost to freshkey, so cached entries of the bound tables may be stale. Ways on: "
        f"{ACCEPT_GAP_HINT}. To keep this from happening, keep binlogs longer than the connector may be "
        "down (binlog_expire_logs_seconds on the server)."
    )


def refusal_error(
    at: BinlogPosition,
    said: str,
    *,
    server_id: int,
    list_logs: Callable[[], BinaryLogs],
    checkpoint: Path | None = None,
) -> ConfigurationError:
    """The error for a server that refuses to send the binlog from ``at`` (1236, its words ``said``),
    saying what to change: another replica with the connector's ``server_id``, an event over
    max_allowed_packet, or else a gap (:class:`BinlogGapError`), explained with ``list_logs()`` (the
    server's ``SHOW BINARY LOGS``; a listing that fails, for want of a connection or a privilege, leaves
    the server's own words alone)."""
    if "server_id" in said or "server_uuid" in said:
        return ConfigurationError(
            f"the server stopped sending the binlog: {said}. Another replica or connector uses "
            f"server id {server_id}: set FRESHKEY_MYSQL_SERVER_ID to an id no other "
            "server, replica or connector uses"
        )
    if "max_allowed_packet" in said:
        return ConfigurationError(
            f"the server cannot send a binlog event: {said}. Raise max_allowed_packet on the server "
            "(SET GLOBAL max_allowed_packet=1073741824 and set it under [mysqld] in its config file)"
        )
    try:
        problem = position_problem(at, list_logs())
    except (ConnectorError, pymysql.err.MySQLError, OSError) as exc:
        # The listing is a courtesy: the server's own words come first.
        log.debug("SHOW BINARY LOGS failed: %r", exc)
        problem = None
    return BinlogGapError(
        gap_message(
            at,
            problem or "the server cannot send the binlog from there",
            checkpoint=checkpoint,
            detail=said,
        )
    )


def _connect(settings: MySQLSettings) -> pymysql.connections.Connection:
    try:
        return Connection(**settings.connection_kwargs())
    except pymysql.err.OperationalError as exc:
        if retry_cause(exc) == "database":
            raise DatabaseUnavailableError(
                f"MySQL at {settings.host}:{settings.port} is unavailable: {exc.args[-1]}"
            ) from exc
        raise


def binary_logs(settings: MySQLSettings) -> list[tuple[str, int]]:
    """The server's binlog files, oldest first, with their sizes (``SHOW BINARY LOGS``)."""
    conn = _connect(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(str(row[0]), int(row[1])) for row in cur.fetchall()]
    finally:
        conn.close()


def check_position(
    settings: MySQLSettings, position: BinlogPosition, *, checkpoint: Path | None = None
) -> None:
    """Raise :class:`BinlogGapError` when the server cannot serve the binlog from ``position``."""
    problem = position_problem(position, binary_logs(settings))
    if problem is not None:
        raise BinlogGapError(gap_message(position, problem, checkpoint=checkpoint))


def current_position(settings: MySQLSettings, *, earliest: bool = False) -> BinlogPosition:
    """The server's current binlog end (or the start of its oldest binlog file)."""
    conn = _connect(settings)
    try:
        with conn.cursor() as cur:
            if earliest:
                cur.execute("SHOW BINARY LOGS")
                row = cur.fetchone()
                if row is None:
                    raise ConfigurationError("the server has no binary logs: enable log_bin")
                return BinlogPosition(file=str(row[0]), pos=4)
            try:
                cur.execute("SHOW MASTER STATUS")
            except pymysql.err.ProgrammingError:  # MySQL >= 8.4 renamed it
                cur.execute("SHOW BINARY LOG STATUS")
            row = cur.fetchone()
            if row is None:
                raise ConfigurationError("SHOW MASTER STATUS is empty: the binlog is off (set log_bin)")
            return BinlogPosition(file=str(row[0]), pos=int(row[1]))
    finally:
        conn.close()
