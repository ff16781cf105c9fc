"""A heartbeat probe: a row rewritten with the database's clock every ``interval_ms``.

Binlog timestamps have a one-second resolution, and an idle database produces no changes at all, so
neither tells how far the caches are behind *right now*. The prober writes

    REPLACE INTO <database>.<table> (id, beat_at) VALUES (<row_id>, UTC_TIMESTAMP(6))

every ``FRESHKEY_HEARTBEAT_INTERVAL_MS`` (default 500 ms) into a table it creates when missing
(``id INT PRIMARY KEY, beat_at DATETIME(6)``). The heartbeat then travels the whole path like any
change: binlog -> connector -> Kafka -> worker -> every cache tier. Bind it like this and the worker
records the true commit-to-cache lag of every beat in the ``freshkey_heartbeat`` namespace (the
``commit_time_column`` gives microsecond commit times; the SLA's ``heartbeat`` target in
:mod:`pipeline.observe.sla` finds the namespace through the binding of ``<database>.<table>``):

    bindings:
      - table: freshkey.heartbeat
        namespace: freshkey_heartbeat
        version_column: beat_at
        commit_time_column: beat_at

The lag is measured with the worker's clock against the database's UTC clock: keep both hosts on NTP.
The prober needs an account that may create the table and write to it; the connector's replication
account usually may not (``FRESHKEY_HEARTBEAT_USER``/``_PASSWORD`` override the MySQL ones).

Settings (``FRESHKEY_HEARTBEAT_*``): ``enabled`` (whether launchers such as ``freshkey demo`` start a
prober; ``freshkey heartbeat`` runs when asked to), ``database``, ``table``, ``row_id``, ``interval_ms``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import threading
import time
from dataclasses import dataclass

import pymysql
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors.exceptions import ConfigurationError
from connectors.mysql import Connection
from connectors.settings import MySQLSettings

log = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


class HeartbeatSettings(BaseSettings):
    """Where the heartbeat row lives and how often it is written."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_HEARTBEAT_", extra="ignore", frozen=True)

    enabled: bool = Field(True, description="Whether launchers (freshkey demo) start a heartbeat prober.")
    database: str = "freshkey"
    table: str = "heartbeat"
    row_id: int = Field(1, description="Id of the heartbeat row (one per prober).")
    interval_ms: float = Field(500.0, ge=10, le=3_600_000, description="Time between two heartbeats.")
    user: str | None = Field(None, description="Account that writes the heartbeat; default: the MySQL one.")
    password: SecretStr | None = None

    @field_validator("database", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError(f"{value!r} is not a plain identifier (letters, digits, _ and $)")
        return value

    @property
    def qualified_table(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass
class HeartbeatStats:
    beats: int = 0
    failures: int = 0
    last_beat_at: dt.datetime | None = None
    """The database's UTC time of the last successful beat."""


class HeartbeatProber:
    """Writes the heartbeat row at a fixed rate until :meth:`stop` (thread-safe) is called.

    Beats are scheduled on a fixed grid (``start + k * interval``): a slow write delays one beat, it
    does not shift the ones after it; beats missed while the database was unreachable are skipped, not
    made up. A failed write is logged, counted and retried at the next beat after reconnecting.
    """

    def __init__(self, mysql: MySQLSettings, settings: HeartbeatSettings) -> None:
        self.mysql = mysql
        self.settings = settings
        self.stats = HeartbeatStats()
        self._stop = threading.Event()
        self._conn: pymysql.connections.Connection | None = None

    def _connect(self) -> pymysql.connections.Connection:
        if self._conn is None:
            kwargs = self.mysql.connection_kwargs()
            if self.settings.user is not None:
                kwargs["user"] = self.settings.user
            if self.settings.password is not None:
                kwargs["password"] = self.settings.password.get_secret_value()
            self._conn = Connection(**kwargs, autocommit=True)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(pymysql.Error):
                self._conn.close()
            self._conn = None

    def ensure_table(self) -> None:
        """Create the database and the heartbeat table when missing; a clear error when not allowed."""
        s = self.settings
        try:
            with self._connect().cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{s.database}`")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS `{s.database}`.`{s.table}` "
                    "(id INT PRIMARY KEY, beat_at DATETIME(6) NOT NULL)"
                )
        except pymysql.Error as exc:
            self._close()
            raise ConfigurationError(
                f"cannot create the heartbeat table {s.qualified_table} as {self._user()!r} ({exc}); "
                "grant CREATE, INSERT, DELETE on it, or set FRESHKEY_HEARTBEAT_USER/_PASSWORD"
            ) from None

    def _user(self) -> str:
        return self.settings.user or self.mysql.user

    def beat(self) -> dt.datetime:
        """Write one heartbeat; returns the database's UTC time it wrote."""
        s = self.settings
        with self._connect().cursor() as cur:
            cur.execute(
                f"REPLACE INTO `{s.database}`.`{s.table}` (id, beat_at) VALUES (%s, UTC_TIMESTAMP(6))",
                (s.row_id,),
            )
            cur.execute(f"SELECT beat_at FROM `{s.database}`.`{s.table}` WHERE id = %s", (s.row_id,))
            row = cur.fetchone()
        assert row is not None
        beat_at: dt.datetime = row[0]
        self.stats.beats += 1
        self.stats.last_beat_at = beat_at
        return beat_at

    def run(self) -> HeartbeatStats:
        """Beat until :meth:`stop`; creates the table first. Returns the counts."""
        self.ensure_table()
        interval = self.settings.interval_ms / 1000
        log.info(
            "heartbeat every %g ms into %s (row %d)",
            self.settings.interval_ms,
            self.settings.qualified_table,
            self.settings.row_id,
        )
        start = time.monotonic()
        tick = 0
        try:
            while not self._stop.is_set():
                try:
                    self.beat()
                except pymysql.Error as exc:
                    self.stats.failures += 1
                    self._close()
                    log.warning("heartbeat write failed (%s); retrying at the next beat", exc)
                now = time.monotonic()
                tick = max(tick + 1, int((now - start) / interval) + 1)
                self._stop.wait(max(0.0, start + tick * interval - now))
        finally:
            self._close()
        return self.stats

    def stop(self) -> None:
        self._stop.set()


def start_in_thread(prober: HeartbeatProber) -> threading.Thread:
    """Run ``prober`` in a daemon thread (tests, ``freshkey demo``); stop it with ``prober.stop()``.

    The table is created before this returns, so a creation error is raised here, not lost in the
    thread.
    """
    prober.ensure_table()
    thread = threading.Thread(target=prober.run, name="freshkey-heartbeat", daemon=True)
    thread.start()
    return thread
