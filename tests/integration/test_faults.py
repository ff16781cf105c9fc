"""The fault suite of issue 8: real services, a steady workload, every fault three times, nothing stale.

A writer thread keeps changing rows of one bound table (inserts, updates, deletes; a few hot rows take half
of the changes) at about ``RATE`` changes a second for the whole run, and counts what it committed. Private
servers for this test only (a MariaDB, a Tansu broker, one Redis for L2 and one for L3) carry a real
connector and a real worker (child processes, ``tests/integration/conftest.py``'s ``Pipeline``). One after
another, with the workload running, each of these faults happens ``ROUNDS`` times:

- ``kill -9`` the connector (restarted half a second later: it replays from its checkpoint);
- ``kill -9`` the worker (restarted half a second later: it replays from the group's committed offsets);
- L2 Redis restarted on its port after 1, 2 and 3 s (it comes back empty; past the fence bound the worker
  fences every namespace when it returns);
- the database restarted (the connector reconnects; the binlog goes on in a new file);
- the broker restarted (memory storage: topics and group offsets are gone; the connector recreates the
  topics and fences every namespace before it produces again);
- L3 stopped for 1, 2 and 3 s (past the fence bound it is fenced, then flushed before it is trusted again).

After each fault the pipeline must catch up by itself: one sentinel row per partition of the change topic
(found at the start) is updated and the test waits until L2 serves every sentinel's new value under the
namespace's active signature: every change committed before them has then been handled on every
partition (the broker's high watermarks are not used: Tansu under-reports them). While the writer goes on,
rounds of sentinels repeat until one is served within ``CAUGHT_UP_S`` of its write (what the writer
committed while a backlog was worked off waits behind the first round). Then ``freshkey verify``'s engine
(``pipeline.verify.run_verification``, SLA window) checks L2 and L3 against the database while the writer
goes on, and must find 0 stale in every tier. Should it find some, the writer pauses, the pipeline catches
up and the verifier runs again, so that the failure says whether the entries were late or lost.

During each L3 outage a probe row changes every ``PROBE_EVERY_S``; how long L2 took to serve each change
(the age of the oldest value L2 served meanwhile) is measured and printed, not asserted (the tier fence
test asserts its bound on a 6 s outage).

Accounting. After each verification the writer pauses, the sentinels are written again, and once the
worker's counters and the group's committed offsets stop moving the test takes a snapshot. Between two
snapshots of one worker process the messages it received (committed offsets moved, per partition; after a
broker restart, from offset 0 of the recreated topic) must equal the changes it accounted for:
``change_applied + change_superseded + change_not_newer + dead_lettered + unbound + ddl``; and the per-op
counts (c/u/d/r) must equal applied + superseded + not newer. A worker killed with ``-9`` loses the counters
of what it did after its last snapshot: the messages it committed after it (known exactly from the
offsets) are reported as "after the last read"; what it had not committed is replayed by the next worker
and accounted there (mostly as not newer). The broker is restarted while the worker is caught up and the
writer is paused (the writer resumes while the broker is down), so that no message of the lost topic
escapes the accounting; the database restart pauses the writer too (a statement cut off by a server that
goes away may or may not have committed, and the writer's log must be exact).

Before the end L2 may miss only rows unchanged since it was last emptied or fenced; then every row is
written once more and L2 must hold every row (0 stale, 0 missing), and every change committed went through
the change topic (messages on the topics >= changes committed). The fault table is printed (run with
``-s`` to see it): per kind of fault the count, recovery time, stale per tier, in-flight entries, rows
missing from L2, the connector's gap fences; the probe's figures; the changes committed; per worker process
the messages received and what became of them.

Negative control: the same verifier, through the same catch-up, finds the stale entries when a protection
is off. The connector is stopped, five rows change, and its checkpoint is moved past those five changes
before Kafka has them (invariant 4 off: a checkpoint that passes unacknowledged events); it comes back,
the pipeline catches up, and the verifier reports exactly those five rows stale in L2 and in L3. The other
protections have their own negatives: the tier fence (``test_tier_fencing.py``: the same L3 outage
without fencing stalls L2), the connector's gap fence and reconnects (``test_connector_faults.py``), the
checkpoint across a crash (``test_crash_recovery.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import pytest
import redis
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from confluent_kafka import KafkaException
from pydantic import SecretStr

from cache_writer.entries import parse_entry
from cache_writer.layout import signature_key
from cache_writer.signatures import parse_signatures
from connectors.checkpoint import BinlogPosition, CheckpointStore
from connectors.settings import MySQLSettings
from pipeline.embedded import LocalKafka, LocalMariaDB, MissingBinaryError, ServiceStartError
from pipeline.observe.broker import BrokerOffsets
from pipeline.verify.judge import Verification
from pipeline.verify.run import run_verification
from schemas import Binding, ChangeEvent, decode, parse_bindings
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService, RestartableRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 3
ROWS = 60
HOT = 6
RATE = 100.0
"""Changes a second the writer aims at (single-row statements, autocommit)."""
WINDOW_MS = 1500.0
"""The SLA window (``FRESHKEY_SLA_WINDOW_MS``, its default), given to the worker and to the verifier."""
FENCE_AFTER_S = 1.5
CANDIDATES = range(1001, 1031)
"""Rows among which one sentinel per partition is chosen (30 keys miss one of 3 partitions ~1 in 60,000)."""
CONTROL = range(2001, 2006)
"""Rows only the negative control changes."""
PROBE = 3001
"""A row changed every ``PROBE_EVERY_S`` during an L3 outage, to see how far L2 falls behind meanwhile."""
PROBE_EVERY_S = 0.25
PARTITIONS = 3
L2_OUTAGES_S = (1.0, 2.0, 3.0)
L3_OUTAGES_S = (1.0, 2.0, 3.0)
CAUGHT_UP_S = 0.5
"""A sentinel served within this long of its write: the pipeline is close behind the writer."""
SETTLE_S = 0.8
"""Counters and committed offsets unchanged this long (over 3 commit intervals): a snapshot is complete."""
ACCOUNTED = (
    "change_applied",
    "change_superseded",
    "change_not_newer",
    "dead_lettered",
    "unbound",
    "ddl",
)
"""What the worker does with a message of the change topic; each message is counted in exactly one."""
OPS = ("c", "u", "d", "r")

CONNECTOR_ENV = {
    "COLUMNS": "300",
    "FRESHKEY_CONNECTOR_RETRY_INITIAL_BACKOFF_S": "0.2",
    "FRESHKEY_CONNECTOR_RETRY_MAX_BACKOFF_S": "1.0",
    "FRESHKEY_CONNECTOR_DELIVERY_TIMEOUT_S": "3",
}
INSERT = "INSERT INTO assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))"
UPDATE = "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s"
DELETE = "DELETE FROM assets WHERE id = %s"


# --- private services ----------------------------------------------------------------------------------


@dataclass
class Services:
    db: LocalMariaDB
    kafka: LocalKafka
    l2: RestartableRedis
    l3: RestartableRedis

    @property
    def mysql(self) -> MySQLService:
        return MySQLService.of(self.db)


@pytest.fixture
def services() -> Iterator[Services]:
    started: list[Callable[[], None]] = []
    try:
        db = LocalMariaDB().start()
        started.append(db.stop)
        kafka = LocalKafka().start()
        started.append(kafka.stop)
        l2 = RestartableRedis()
        started.append(lambda: l2.stop())
        l3 = RestartableRedis()
        started.append(lambda: l3.stop())
    except (MissingBinaryError, ServiceStartError) as exc:
        for stop in reversed(started):
            stop()
        pytest.fail(f"cannot start a private service: {exc}", pytrace=False)
    try:
        yield Services(db, kafka, l2, l3)
    finally:
        for stop in reversed(started):
            stop()


# --- the workload --------------------------------------------------------------------------------------


class Writer:
    """The steady workload: one single-row statement at a time (autocommit) at ``rate`` a second.

    Rows ``1..ROWS``; half of the changes go to the ``HOT`` first rows. An absent row is inserted, a present
    one deleted (1 in 10) or updated. ``committed`` counts the statements that committed, by op;
    ``last_commit`` is when each row last changed (monotonic clock). :meth:`pause` returns once no
    statement is in progress and none starts until :meth:`resume`.
    """

    def __init__(self, connect: Callable[[], pymysql.connections.Connection], *, rate: float) -> None:
        self._connect = connect
        self._interval = 1.0 / rate
        self._rng = random.Random(8)
        self.present: dict[int, bool] = {}
        self.last_commit: dict[int, float] = {}
        self.committed: Counter[str] = Counter()
        self.errors: list[str] = []
        self._run = threading.Event()
        self._run.set()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fault-suite-writer", daemon=True)

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
        conn: pymysql.connections.Connection | None = None
        try:
            conn = self._connect()
            next_at = time.monotonic()
            while not self._stop.is_set():
                if not self._run.is_set():
                    self._idle.set()
                    self._run.wait()
                    if not self._stop.is_set():  # the server may have restarted meanwhile
                        with contextlib.suppress(pymysql.err.Error):
                            conn.close()
                        conn = self._connect()
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
        rng = self._rng
        row = rng.randint(1, HOT) if rng.random() < 0.5 else rng.randint(1, ROWS)
        present = self.present.get(row, False)
        seq = self.total + 1
        args: tuple[Any, ...]
        if not present:
            op, statement, args = "c", INSERT, (row, f"w{seq}")
        elif rng.random() < 0.1:
            op, statement, args = "d", DELETE, (row,)
        else:
            op, statement, args = "u", UPDATE, (f"w{seq}", row)
        with conn.cursor() as cur:
            cur.execute(statement, args)
        self.committed[op] += 1
        self.present[row] = op != "d"
        self.last_commit[row] = time.monotonic()


# --- reading the broker --------------------------------------------------------------------------------


def partitions_of(bootstrap: str, topic: str, ids: set[int], timeout: float = 30) -> dict[int, int]:
    """Row id -> partition of the change topic, for the changes of ``ids`` read back from the topic."""

    async def read() -> dict[int, int]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        found: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        try:
            while set(found) != ids and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, records in batch.items():
                    for record in records:
                        event = decode(record.value or b"")
                        if isinstance(event, ChangeEvent) and int(event.key["id"]) in ids:
                            found[int(event.key["id"])] = tp.partition
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())


def committed_offsets(bootstrap: str, group: str, topic: str, timeout: float = 30) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (0 where nothing was committed yet)."""
    reader = BrokerOffsets(bootstrap, group_id=group, topic=topic)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                figures = reader.read()
                return {p: offset or 0 for p, offset in figures.committed.items()}
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        reader.close()


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What a worker process had done at a quiet moment (writer paused, every partition caught up)."""

    events: Counter[str]
    committed: dict[int, int]
    lifetime: int
    incarnation: int


@dataclass
class Lifetime:
    """One worker process: the messages it received and what it did with them, over its snapshots."""

    number: int
    start: dict[int, int]
    received: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    after_last_read: int | None = None
    """Killed: messages it committed after its last snapshot (their counts died with it)."""
    ended: str = "running"


@dataclass
class FaultResult:
    kind: str
    round: int
    recovery_s: float
    stale: dict[str, int]
    in_flight: int
    missing_l2: int
    gap_fences: int
    """Fences the connector made after a gap it found (a recreated or shorter change topic)."""
    catch_up_rounds: list[float] = field(default_factory=list)
    verify_s: float = 0.0
    checkpoint_s: float = 0.0


class L2Probe:
    """How far L2 falls behind the database while something else is out: the probe row changes every
    ``PROBE_EVERY_S`` until the outage ends; ``worst`` is the longest any of those changes took to be
    served by L2 (the age of the oldest value L2 served meanwhile)."""

    def __init__(self, run: FaultRun, outage_ends: float) -> None:
        self.run = run
        self.outage_ends = outage_ends
        self.pending: dict[int, float] = {}
        self.worst = 0.0
        self._next = time.monotonic()

    def run_until(self, until: float) -> None:
        """Write (before the outage ends) and watch until ``until``, or until nothing is pending after it."""
        key = self.run.p.key(PROBE)
        while time.monotonic() < until and (time.monotonic() < self.outage_ends or self.pending):
            now = time.monotonic()
            if now < self.outage_ends and now >= self._next:
                self.run.probe_writes += 1
                self.run.sql(UPDATE, (f"probe-{self.run.probe_writes}", PROBE))
                self.pending[self.run.probe_writes] = now
                self._next = now + PROBE_EVERY_S
            try:
                entry = parse_entry(key, self.run.l2.hgetall(key))  # type: ignore[arg-type]
            except redis.RedisError:
                entry = None
            found = re.search(rb'"content":"probe-(\d+)"', entry.value or b"") if entry is not None else None
            if found is not None:
                served = int(found.group(1))
                for n in [n for n in self.pending if n <= served]:
                    self.worst = max(self.worst, time.monotonic() - self.pending.pop(n))
            time.sleep(0.02)


class FaultRun:
    """The pipeline on the private services, the writer, the sentinels and the bookkeeping."""

    def __init__(self, services: Services, workdir: Path) -> None:
        self.services = services
        self.p = Pipeline(
            services.mysql, services.kafka.bootstrap, services.l2.url, workdir, version_column=False
        )
        self.binding: Binding = parse_bindings(self.p.bindings_text).bindings[0]
        self.group = self.p.env["FRESHKEY_WORKER_APP_ID"]
        self.worker_env = {
            "FRESHKEY_REDIS_L3_URL": services.l3.url,
            "FRESHKEY_WORKER_FENCE_AFTER_S": str(FENCE_AFTER_S),
            "FRESHKEY_WORKER_COMMIT_INTERVAL_S": "0.25",
            "FRESHKEY_SLA_WINDOW_MS": str(WINDOW_MS),
        }
        self.l2 = redis.Redis.from_url(services.l2.url, socket_timeout=2)
        self.conn = self._connect()
        self.writer = Writer(self._connect, rate=RATE)
        self.sentinels: list[int] = []
        self.sentinel_writes = 0
        self.setup_writes = 0
        self.sweep_writes = 0
        self.token = 0
        self.lifetimes = [Lifetime(1, {})]
        self.incarnation = 0
        self.messages_on_topics = 0
        self.last: Snapshot | None = None
        self.results: list[FaultResult] = []
        self.l2_lag_during_l3: list[float] = []
        self.round_trips: list[float] = []
        """The sentinel rounds of the last catch-up (s from write to served)."""
        self.probe_writes = 0
        self.last_wipe = 0.0
        """When L2 last lost or fenced its entries (monotonic): rows unchanged since may be missing."""

    # -- plumbing ---------------------------------------------------------------------------------------
    def _connect(self) -> pymysql.connections.Connection:
        return self.services.mysql.connect(self.p.database)

    def sql(self, statement: str, args: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(statement, args)

    def close(self) -> None:
        self.l2.close()
        self.conn.close()
        self.p.close()

    @property
    def mysql_settings(self) -> MySQLSettings:
        db = self.services.db
        return MySQLSettings(
            host=db.host, port=db.port, user=db.admin_user, password=SecretStr(db.admin_password)
        )

    def stats(self) -> dict[str, Any]:
        stats = self.p.stats()
        assert stats is not None, "the worker's stats do not answer"
        return stats

    def gap_fences(self) -> int:
        """How often the connector fenced after a gap so far (its logs, console wrapping undone)."""
        text = " ".join(path.read_text(errors="replace") for path in self.p.workdir.glob("connector*.log"))
        return " ".join(text.split()).count("namespace(s) after a gap")

    def committed(self) -> dict[int, int]:
        return committed_offsets(self.services.kafka.bootstrap, self.group, self.p.change_topic)

    # -- start ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.p.start("connector", **CONNECTOR_ENV)
        self.p.start("worker", **self.worker_env)
        for row in [*CANDIDATES, *CONTROL, PROBE]:
            self.sql(INSERT, (row, f"setup-{row}"))
            self.setup_writes += 1
        where = partitions_of(self.services.kafka.bootstrap, self.p.change_topic, set(CANDIDATES))
        by_partition: dict[int, int] = {}
        for row, partition in sorted(where.items()):
            by_partition.setdefault(partition, row)
        assert sorted(by_partition) == list(range(PARTITIONS)), f"sentinel rows per partition: {by_partition}"
        self.sentinels = sorted(by_partition.values())
        self.writer.start()

    # -- catching up ------------------------------------------------------------------------------------
    def write_sentinels(self) -> str:
        self.token += 1
        token = f"sentinel-{self.token}"
        for row in self.sentinels:
            self.sql(UPDATE, (token, row))
            self.sentinel_writes += 1
        return token

    def _served(self, token: str) -> bool:
        """Every sentinel's entry in L2 holds ``token`` under the namespace's active signature."""
        try:
            fields = self.l2.hgetall(signature_key(self.p.prefix, self.p.namespace))
            active = parse_signatures(self.p.namespace, fields).active_signature  # type: ignore[arg-type]
            for row in self.sentinels:
                key = self.p.key(row)
                entry = parse_entry(key, self.l2.hgetall(key))  # type: ignore[arg-type]
                if entry is None or entry.value is None or f'"{token}"'.encode() not in entry.value:
                    return False
                if (entry.signature or "") != active:
                    return False
        except redis.RedisError:
            return False  # L2 restarting
        return True

    def _tiers_ok(self) -> bool:
        stats = self.p.stats()
        if stats is None:
            return False
        return all(t.get("state") == "ok" for t in (stats.get("tiers") or {}).values())

    def catch_up(self, timeout: float = 90) -> None:
        """Until the pipeline is close behind the database and every tier is trusted.

        Sentinels written now and served in L2 mean that every partition is past everything committed
        before them. While the writer goes on that is not enough: what it committed while a backlog was
        worked off waits behind the sentinels. So rounds repeat until one is served within
        ``CAUGHT_UP_S`` of its write: the pipeline is then that close behind the writer.
        """
        deadline = time.monotonic() + timeout
        self.round_trips = []
        while True:
            written = time.monotonic()
            token = self.write_sentinels()
            self.p.wait(
                lambda token=token: self._served(token),  # type: ignore[misc]
                max(deadline - written, 1.0),
                f"the sentinels ({token})",
            )
            self.round_trips.append(time.monotonic() - written)
            if self.round_trips[-1] <= CAUGHT_UP_S:
                break
            assert time.monotonic() < deadline, f"the pipeline stayed behind for {timeout:.0f} s"
        self.p.wait(self._tiers_ok, max(deadline - time.monotonic(), 1.0), "every tier to be trusted (ok)")

    def verify(self) -> Verification:
        async def run() -> Verification:
            l2 = aioredis.Redis.from_url(self.services.l2.url)
            l3 = aioredis.Redis.from_url(self.services.l3.url)
            try:
                return await run_verification(
                    self.mysql_settings,
                    [self.binding],
                    [("redis-l2", l2), ("redis-l3", l3)],
                    prefix=self.p.prefix,
                    window_ms=WINDOW_MS,
                )
            finally:
                await l2.aclose()
                await l3.aclose()

        return asyncio.run(run())

    # -- accounting -------------------------------------------------------------------------------------
    def checkpoint(self) -> Snapshot:
        """Pause the writer, catch up, wait until counters and committed offsets settle, and check the
        segment since the previous snapshot. The writer stays paused: the next step resumes it."""
        self.writer.pause()
        self.catch_up()
        reading: tuple[dict[str, int], dict[int, int]] | None = None
        since = time.monotonic()
        deadline = since + 30
        while True:
            now = (dict(self.stats()["events"]), self.committed())
            if now != reading:
                reading, since = now, time.monotonic()
            elif time.monotonic() - since >= SETTLE_S:
                break
            assert time.monotonic() < deadline, f"counters or offsets kept moving: {now}"
            time.sleep(0.2)
        events, committed = Counter(reading[0]), reading[1]
        lifetime = self.lifetimes[-1]
        snapshot = Snapshot(events, committed, lifetime.number, self.incarnation)
        last = self.last
        if last is None or last.lifetime != lifetime.number:
            base_events: Counter[str] = Counter()
            base_offsets = lifetime.start
        elif last.incarnation != self.incarnation:
            base_events, base_offsets = last.events, {}
        else:
            base_events, base_offsets = last.events, last.committed
        received = sum(offset - base_offsets.get(p, 0) for p, offset in committed.items())
        delta = Counter({k: events[k] - base_events[k] for k in set(events) | set(base_events)})
        accounted = sum(delta[k] for k in ACCOUNTED)
        assert received == accounted, (
            f"worker #{lifetime.number}: received {received} messages (offsets {base_offsets} -> "
            f"{committed}) but accounted for {accounted}: {dict(delta)}"
        )
        applied_kinds = delta["change_applied"] + delta["change_superseded"] + delta["change_not_newer"]
        assert sum(delta[op] for op in OPS) == applied_kinds, f"per-op counts differ: {dict(delta)}"
        lifetime.received += received
        lifetime.counts.update(delta)
        self.last = snapshot
        return snapshot

    def new_lifetime(self, how: str) -> None:
        """The worker process is gone (after ``how``): the next one starts at the committed offsets."""
        assert self.last is not None
        time.sleep(0.3)  # a commit the dead process sent is answered before the offsets are read
        start = self.committed()
        old = self.lifetimes[-1]
        old.ended = how
        if self.last.incarnation == self.incarnation:
            old.after_last_read = sum(start[p] - self.last.committed.get(p, 0) for p in start)
            assert old.after_last_read >= 0
        self.lifetimes.append(Lifetime(old.number + 1, start))

    # -- the faults ---------------------------------------------------------------------------------------
    def flow(self) -> None:
        """Resume the writer and let changes flow, so that the fault hits the pipeline mid-stream."""
        self.writer.resume()
        time.sleep(0.5)

    def connector_kill9(self, n: int) -> None:
        self.flow()
        self.p.kill9("connector")
        time.sleep(0.5)
        self.p.start("connector", **CONNECTOR_ENV)

    def worker_kill9(self, n: int) -> None:
        self.flow()
        self.p.kill9("worker")
        self.new_lifetime("kill -9")
        time.sleep(0.5)
        self.p.start("worker", **self.worker_env)

    def l2_restart(self, n: int) -> None:
        self.flow()
        self.services.l2.stop()
        time.sleep(L2_OUTAGES_S[n])
        self.services.l2.start()

    def db_restart(self, n: int) -> None:
        # The writer stays paused while the server is away (see the module docstring).
        self.services.db.halt()
        time.sleep(1.0)
        self.services.db.resume()
        for old in (self.conn, self.p.conn):  # both died with the server
            with contextlib.suppress(pymysql.err.Error):
                old.close()
        self.conn = self._connect()
        self.p.conn = self._connect()
        self.flow()

    def broker_restart(self, n: int) -> None:
        # Halted while caught up with the writer paused; the writer resumes while the broker is away.
        assert self.last is not None
        self.services.kafka.halt()
        self.messages_on_topics += sum(self.last.committed.values())
        self.incarnation += 1
        self.flow()
        self.services.kafka.resume()

    def l3_stop(self, n: int) -> None:
        self.flow()
        self.services.l3.stop()
        probe = L2Probe(self, time.monotonic() + L3_OUTAGES_S[n])
        probe.run_until(probe.outage_ends)
        self.services.l3.start()
        probe.run_until(time.monotonic() + 60)
        assert not probe.pending, "probe changes made during the L3 outage never reached L2"
        self.l2_lag_during_l3.append(probe.worst)

    def fault(self, kind: str, n: int) -> None:
        assert not self.writer.errors, f"the writer failed: {self.writer.errors}"
        fences = self.gap_fences()
        started = time.monotonic()
        getattr(self, kind)(n)
        self.catch_up()
        if kind in ("l2_restart", "broker_restart") or self.gap_fences() > fences:
            self.last_wipe = time.monotonic()  # L2 emptied or fenced: in place once caught up
        recovery = time.monotonic() - started
        rounds = list(self.round_trips)
        verification = self.verify()
        verified = time.monotonic()
        stale = {r.tier: r.stale for r in verification.reports}
        problems = [r.to_json() for r in verification.reports if r.stale or r.unverifiable]
        if problems:
            # Late or lost? Once the writer pauses and the pipeline caught up, late entries are right.
            self.writer.pause()
            self.catch_up()
            again = {r.tier: r.stale for r in self.verify().reports}
            raise AssertionError(
                f"after {kind} #{n + 1}: {problems}\nwith the writer paused and the pipeline caught up: "
                f"stale {again}\n{self.p.logs()}"
            )
        self.results.append(
            FaultResult(
                kind,
                n + 1,
                recovery,
                stale,
                sum(r.in_flight for r in verification.reports),
                sum(r.missing for r in verification.reports if r.tier == "redis-l2"),
                self.gap_fences() - fences,
                verify_s=verified - started - recovery,
                catch_up_rounds=rounds,
            )
        )
        self.checkpoint()
        self.results[-1].checkpoint_s = time.monotonic() - verified

    # -- the end --------------------------------------------------------------------------------------------
    def finish(self) -> Verification:
        """Stop the writer, write every row once more, catch up; L2 must then hold every row."""
        self.writer.resume()
        self.writer.stop()
        assert not self.writer.errors, f"the writer failed: {self.writer.errors}"
        live = [row for row, present in self.writer.present.items() if present]
        unchanged = [row for row in live if self.writer.last_commit[row] < self.last_wipe]
        before = self.verify()
        l2_before = next(r for r in before.reports if r.tier == "redis-l2")
        assert l2_before.stale == 0
        # Missing only where L2 lost or fenced the entry and the row did not change since (plus the
        # sentinel candidates and control rows, which only the setup and the sweep write).
        allowed = len(unchanged) + len(CANDIDATES) + len(CONTROL) + 1
        assert l2_before.missing <= allowed, f"{l2_before.missing} missing, at most {allowed} expected"
        for row in [*live, *CANDIDATES, *CONTROL, PROBE]:
            self.sql(UPDATE, (f"final-{row}", row))
            self.sweep_writes += 1
        self.checkpoint()
        final = self.verify()
        for report in final.reports:
            assert report.stale == 0 and report.unverifiable is None, report.to_json()
        l2 = next(r for r in final.reports if r.tier == "redis-l2")
        assert l2.missing == 0, f"every row changed since the last fault, yet L2 misses {l2.to_json()}"
        assert l2.rows == len(live) + len(CANDIDATES) + len(CONTROL) + 1
        assert self.last is not None
        self.messages_on_topics += sum(self.last.committed.values())
        return final

    def negative_control(self) -> Verification:
        """Five changes skipped (the checkpoint moved past them before Kafka had them): the verifier must
        find exactly those five rows stale, in L2 and in L3."""
        assert self.p.stop("connector") == 0
        for row in CONTROL:
            self.sql(UPDATE, (f"never-applied-{row}", row))
        with self.conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchall()[0][:2]
        # No topic ends: the connector then has nothing to compare, finds no gap and does not fence.
        store = CheckpointStore(self.p.checkpoint_path)
        store.save(BinlogPosition(str(file), int(pos)), change_topic=self.p.change_topic, topic_ends={})
        self.p.start("connector", **CONNECTOR_ENV)
        self.catch_up()
        return self.verify()

    # -- the table ------------------------------------------------------------------------------------------
    @property
    def changes(self) -> int:
        """Every change committed to the bound table (each one a row event of the binlog)."""
        return (
            self.writer.total
            + self.setup_writes
            + self.sentinel_writes
            + self.probe_writes
            + self.sweep_writes
        )

    def table(self) -> str:
        names = {
            "connector_kill9": "kill -9 connector",
            "worker_kill9": "kill -9 worker",
            "l2_restart": "L2 Redis restart",
            "db_restart": "database restart",
            "broker_restart": "broker restart",
            "l3_stop": "L3 stopped",
        }
        lines = [
            "fault               count  recovery s (max)  stale L2  stale L3  in flight  missing L2"
            "  gap fences  verify s  checkpoint s",
        ]
        for kind, name in names.items():
            rows = [r for r in self.results if r.kind == kind]
            lines.append(
                f"{name:<19} {len(rows):>5}  {max((r.recovery_s for r in rows), default=0):>16.1f}"
                f"  {sum(r.stale.get('redis-l2', 0) for r in rows):>8}"
                f"  {sum(r.stale.get('redis-l3', 0) for r in rows):>8}"
                f"  {sum(r.in_flight for r in rows):>9}  {sum(r.missing_l2 for r in rows):>10}"
                f"  {sum(r.gap_fences for r in rows):>10}  {sum(r.verify_s for r in rows):>8.1f}"
                f"  {sum(r.checkpoint_s for r in rows):>12.1f}"
            )
        lines.append(
            "L2 behind the database during the L3 outages (s): "
            + ", ".join(f"{lag:.2f}" for lag in self.l2_lag_during_l3)
            + f" (outages {', '.join(f'{s:.0f}' for s in L3_OUTAGES_S)} s; window {WINDOW_MS / 1000:.1f} s,"
            f" fence bound {FENCE_AFTER_S:.1f} s)"
        )
        lines.append(
            "each fault: "
            + "; ".join(
                f"{r.kind}#{r.round} {r.recovery_s:.1f}+{r.verify_s:.1f}+{r.checkpoint_s:.1f}s"
                f" [{' '.join(f'{t:.1f}' for t in r.catch_up_rounds)}]"
                for r in self.results
            )
        )
        w = self.writer.committed
        changes = self.changes
        lines.append(
            f"changes committed: {changes} (writer {self.writer.total}: c {w['c']} / u {w['u']} / d {w['d']};"
            f" setup {self.setup_writes}; sentinels {self.sentinel_writes}; probes {self.probe_writes};"
            f" final sweep {self.sweep_writes})"
        )
        lines.append(
            f"messages on the change topic ({self.incarnation + 1} incarnations): {self.messages_on_topics}"
            f" (replayed by the connector: {self.messages_on_topics - changes})"
        )
        lines.append(
            "worker  ended     received  applied  superseded  not_newer  dead_lettered  unbound  ddl"
            "  fences  tier_fenced  after_last_read"
        )
        total: Counter[str] = Counter()
        for life in self.lifetimes:
            c = life.counts
            total.update(c)
            lines.append(
                f"#{life.number:<6} {life.ended:<9} {life.received:>8}  {c['change_applied']:>7}"
                f"  {c['change_superseded']:>10}  {c['change_not_newer']:>9}  {c['dead_lettered']:>13}"
                f"  {c['unbound']:>7}  {c['ddl']:>3}  {c['fence']:>6}  {c['tier_fenced']:>11}"
                f"  {'-' if life.after_last_read is None else life.after_last_read:>15}"
            )
        lines.append(
            f"all     {'':<9} {sum(life.received for life in self.lifetimes):>8}"
            f"  {total['change_applied']:>7}  {total['change_superseded']:>10}"
            f"  {total['change_not_newer']:>9}  {total['dead_lettered']:>13}  {total['unbound']:>7}"
            f"  {total['ddl']:>3}  {total['fence']:>6}  {total['tier_fenced']:>11}"
            f"  {sum(life.after_last_read or 0 for life in self.lifetimes):>15}"
        )
        return "\n".join(lines)


FAULTS = ("connector_kill9", "worker_kill9", "l2_restart", "db_restart", "broker_restart", "l3_stop")


@pytest.mark.timeout(600)
def test_every_fault_three_times_under_a_steady_workload(services: Services, tmp_path: Path) -> None:
    run = FaultRun(services, tmp_path)
    started = time.monotonic()
    reported = False
    try:
        run.start()
        run.catch_up()
        run.checkpoint()
        for n in range(ROUNDS):
            for kind in FAULTS:
                run.fault(kind, n)
        final = run.finish()
        changes = run.changes
        print(
            f"\nfault suite: {len(run.results)} faults in {time.monotonic() - started:.0f} s\n" + run.table()
        )
        reported = True
        assert run.messages_on_topics >= changes, "a committed change never reached the change topic"
        assert Counter(r.kind for r in run.results) == dict.fromkeys(FAULTS, ROUNDS)
        print("final verification: " + ", ".join(f"{r.tier} {r.to_json()}" for r in final.reports))

        control = run.negative_control()
        stale = {r.tier: r.stale for r in control.reports}
        print(f"negative control (checkpoint moved past {len(CONTROL)} changes): stale {stale}")
        assert stale == {"redis-l2": len(CONTROL), "redis-l3": len(CONTROL)}, [
            r.to_json() for r in control.reports
        ]
    finally:
        run.writer.stop()
        if not reported and run.results:
            with contextlib.suppress(Exception):  # never hide the failure itself
                print(f"\nfault suite, stopped after {len(run.results)} faults:\n{run.table()}")
        run.close()
