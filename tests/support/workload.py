"""A steady write workload and a log of the invalidation broadcast, for the scale-out and cluster tests.

:class:`SteadyWriter` keeps changing rows of a pipeline's ``assets`` table from a thread at a fixed rate
(single-row autocommitted statements: each is one row event, one message of the change topic) and counts
what committed. :class:`BroadcastLog` subscribes to ``<prefix>:invalidations``, on which the write and
invalidate scripts announce every write and tombstone they apply with its version, in the order Redis ran
them; :func:`order_violations` finds any key whose announced version went backwards (invariant 1 seen
from outside, across every worker that wrote the key).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pymysql
import redis

from cache_writer.l1.listener import parse_broadcast

INSERT = "INSERT INTO assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))"
UPDATE = "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s"
DELETE = "DELETE FROM assets WHERE id = %s"


class SteadyWriter:
    """Changes rows ``rows`` of ``assets`` at ``rate`` statements a second from a daemon thread.

    An absent row is inserted, a present one deleted (``delete_share`` of the time) or updated with a
    content unique to the statement. ``committed`` counts the statements that committed, by op (c/u/d);
    ``errors`` holds what stopped the thread (the test asserts it is empty). :meth:`pause` returns once no
    statement is in progress; :meth:`stop` ends the thread.
    """

    def __init__(
        self,
        connect: Callable[[], pymysql.connections.Connection],
        rows: Iterable[int],
        *,
        rate: float,
        delete_share: float = 0.05,
        seed: int = 11,
        present: Iterable[int] = (),
    ) -> None:
        self._connect = connect
        self._rows = list(rows)
        self._interval = 1.0 / rate
        self._delete_share = delete_share
        self._rng = random.Random(seed)
        self.present: set[int] = set(present)
        self.committed: Counter[str] = Counter()
        self.errors: list[str] = []
        self._run = threading.Event()
        self._run.set()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="steady-writer", daemon=True)

    @property
    def total(self) -> int:
        return sum(self.committed.values())

    def start(self) -> None:
        self._thread.start()

    def pause(self, timeout: float = 15.0) -> None:
        self._run.clear()
        assert self._idle.wait(timeout), "the writer did not pause"

    def resume(self) -> None:
        self._idle.clear()
        self._run.set()

    def stop(self) -> None:
        """Stop for good (safe to call more than once, and before :meth:`start`)."""
        self._stop.set()
        self._run.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=15)
            assert not self._thread.is_alive(), "the writer did not stop"

    def _loop(self) -> None:
        conn = None
        try:
            conn = self._connect()
            next_at = time.monotonic()
            while not self._stop.is_set():
                if not self._run.is_set():
                    self._idle.set()
                    self._run.wait()
                    next_at = time.monotonic()
                    continue
                now = time.monotonic()
                if next_at > now:
                    time.sleep(next_at - now)
                next_at = max(next_at + self._interval, time.monotonic() - 1.0)
                self._one(conn)
        except Exception as exc:  # reported by the test; the thread must not die silently
            self.errors.append(repr(exc))
        finally:
            self._idle.set()
            if conn is not None:
                with contextlib.suppress(pymysql.err.Error):
                    conn.close()

    def _one(self, conn: pymysql.connections.Connection) -> None:
        row = self._rng.choice(self._rows)
        seq = self.total + 1
        statement: str
        args: tuple[Any, ...]
        if row not in self.present:
            op, statement, args = "c", INSERT, (row, f"w{seq}")
        elif self._rng.random() < self._delete_share:
            op, statement, args = "d", DELETE, (row,)
        else:
            op, statement, args = "u", UPDATE, (f"w{seq}", row)
        with conn.cursor() as cur:
            cur.execute(statement, args)
        self.committed[op] += 1
        if op == "d":
            self.present.discard(row)
        else:
            self.present.add(row)


@dataclass(frozen=True, slots=True)
class Announcement:
    """One message of the invalidation channel: a write (``w``) or a tombstone (``i``) Redis applied."""

    at: float
    """When this process received it (monotonic clock)."""
    kind: str
    version: int
    key: str


@dataclass
class BroadcastLog:
    """Every write and tombstone announced on ``channel``, in the order Redis published them.

    ``client`` is a blocking redis-py client (a ``RedisCluster`` too: Redis Cluster forwards a PUBLISH to
    every node, so one subscription hears every node's scripts). :meth:`start` returns once subscribed;
    ``disconnects`` counts lost subscriptions (messages published meanwhile are missing from the log, so a
    test that counts announcements asserts it is 0).
    """

    client: redis.Redis | redis.RedisCluster
    channel: str
    announcements: list[Announcement] = field(default_factory=list)
    disconnects: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _subscribed: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, timeout: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="broadcast-log", daemon=True)
        self._thread.start()
        assert self._subscribed.wait(timeout), f"not subscribed to {self.channel} within {timeout}s"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> list[Announcement]:
        with self._lock:
            return list(self.announcements)

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._subscribed.set()
                        continue
                    if message["type"] != "message":
                        continue
                    parsed = parse_broadcast(message["data"])
                    if parsed is not None:
                        kind, version, key = parsed
                        with self._lock:
                            self.announcements.append(Announcement(time.monotonic(), kind, version, key))
            except (redis.RedisError, OSError):
                if self._subscribed.is_set():
                    self.disconnects += 1
                time.sleep(0.1)
            finally:
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()


@dataclass(frozen=True, slots=True)
class OrderViolation:
    key: str
    before: int
    after: int
    """The version announced after ``before`` for the same key, although lower."""


def order_violations(announcements: Iterable[Announcement]) -> list[OrderViolation]:
    """Each announcement of a key whose version is below one announced for that key before it.

    The same version may be announced twice (a rewrite under a new signature, or a tombstone laid on an
    entry of its own version): that is not a step back.
    """
    highest: dict[str, int] = {}
    found: list[OrderViolation] = []
    for a in announcements:
        top = highest.get(a.key)
        if top is not None and a.version < top:
            found.append(OrderViolation(a.key, top, a.version))
        else:
            highest[a.key] = a.version
    return found
