"""The connector's hot path, stage by stage, in one process: where its CPU goes per row.

``freshkey bench pipeline --only connector,raw-decode`` measures the real ``freshkey connector`` against
plain pymysqlreplication, in wall time, on a shared machine. This harness measures the *CPU time of this
process* (``time.process_time``: every thread, librdkafka's included) per row for each stage of the same
path, on the same table shape and backlogs, so that an optimisation shows even while others load the
machine:

- ``raw``: plain pymysqlreplication over the backlog (:func:`pipeline.bench.raw.raw_decode`);
- ``source``: :class:`connectors.binlog.source.BinlogSource` (decode + translate into change events);
- ``encode``: ``source`` plus :meth:`connectors.sending.Sender.message` (the Kafka key and value);
- ``send``: ``source`` plus :class:`~connectors.sending.Sender` producing through a real
  :class:`~connectors.kafka.producer.ChangeProducer` into the broker, until every message is
  acknowledged (the connector's loop without its checkpoint file and progress lines).

Run (a private MariaDB and Kafka broker are started and removed)::

    .venv/bin/python -m tests.benchmarks.connector_path --runs 5
    .venv/bin/py-spy record -r 250 -f raw -o /tmp/send.txt -- \\
        .venv/bin/python -m tests.benchmarks.connector_path --modes send --runs 3

Figures, not a test: nothing here asserts a time.

Measured 2026-12-01 on the shared 2-core machine (load average 7-11), median of 3, CPU µs/row, the tree
at 2ab0e5f with and without the compiled converters / built events / orjson encoding (issue 9 item 3):

==========  ==================  ==================
stage       single-row txns     1,000-row INSERTs
==========  ==================  ==================
raw         220.9 / 213.1       34.5 / 31.3
source      192.4 -> 171.0      54.6 -> 44.7
encode      217.8 -> 194.1      67.0 -> 49.1
send        274.8 -> 247.5      106.0 -> 80.5
==========  ==================  ==================

``--producer '{"linger_ms": L}'`` (send, after): the connector's own CPU did not move with the linger
(single 219.6 / 217.5 / 238.0 µs/row at 2 / 5 / 10 ms, multi 75.8 / 78.1 / 77.9); only the broker's did
(single 40 / 21 / 18 µs/row). The connector now lingers 10 ms while it reads a backlog and sends at once
when it has read the binlog to its end (``FRESHKEY_CONNECTOR_LINGER_MS``, :meth:`ChangeProducer.push
<connectors.kafka.producer.ChangeProducer.push>`), so the longer linger costs a quiet database no lag.

``send`` calls :meth:`~connectors.kafka.producer.ChangeProducer.serve` at most every
``connectors.runner.SERVE_EVERY_S`` (before each message where the tree has no such constant), as the
connector's loop does (where the tree has it): delivery reports then run on the producing thread instead
of taking the GIL from it per message. Single-row backlog, 10 interleaved runs each: send 217.5 -> 197
CPU µs/row (median; 0.91), main thread 194.5 -> 174.5, delivery thread 7.5 -> 6.

``source-pmr`` is ``source`` with every row read by pymysqlreplication (``fast_rows=False``). Measured
2026-12-05 (quiet machine, median of 3, CPU µs/row, ``--runs 3 --modes raw,source-pmr,source,send``):

==========  ==================  ==================
stage       single-row txns     1,000-row INSERTs
==========  ==================  ==================
raw         143.8               26.3
source-pmr  116.5               36.0
source      73.2                17.9
send        102.5               32.8
==========  ==================  ==================

The lean reader (``connectors/binlog/lean.py``: the events of plain transactions read from their bytes,
without pymysqlreplication's event objects), ``--modes source --runs 3`` against the tree before it, two
alternating pairs on 2026-12-06 (a slow day: raw decode 253 µs/row single-row): single-row 141.9 / 150.2
-> 90.2 / 90.4 CPU µs/row, 1,000-row INSERTs 28.1 / 26.9 -> 25.7 / 26.5.

What waits for Kafka's report holds no item (``connectors.sending``: each message's callbacks are a few
small ``partial`` objects; a refused message's stand-in is made from its own bytes). Before, every
message waiting for its report kept its event alive through closure cells, with its images: thousands at
a time on a backlog, walked by every collection of the older generations. ``--modes encode,send --runs
3``, two alternating pairs against the tree before on 2026-12-07 (a fast day), CPU µs/row: single-row
send 85.2 / 97.5 -> 80.5 / 86.7 (encode 62.0-70.4 in all four), 1,000-row INSERTs send 36.9 / 36.3 ->
25.6 / 26.6 (encode 18.1-18.4): what sending adds to encoding went from 18 to 8 µs/row there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pymysql
from pymysql.constants import CLIENT

from connectors import gc_tuning, runner
from connectors.binlog.source import BinlogSource, Boundary
from connectors.checkpoint import BinlogPosition, CheckpointTracker
from connectors.kafka.limit import MessageLimit
from connectors.kafka.producer import ChangeProducer
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import prepare_topics
from connectors.metrics import CONNECTOR_METRICS, ConnectorStats
from connectors.sending import Item, Sender
from connectors.settings import MySQLSettings
from pipeline.bench.raw import raw_decode
from pipeline.embedded import LocalKafka, LocalMariaDB
from schemas import ChangeEvent

DATABASE = "freshkey_path"
TABLES = {"single": "single_rows", "multi": "multi_rows"}
MODES = ("raw", "source", "encode", "send")
EXTRA_MODES = ("source-pmr",)
"""``source-pmr``: ``source`` with every event and row read by pymysqlreplication (``fast_rows=False``, the
source before connectors.binlog.rowdecode and connectors.binlog.lean), to measure them side by side."""
ROW_TABLE_DDL = """
CREATE TABLE {db}.{table} (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
)
"""
"""The shape of ``freshkey bench pipeline``'s tables."""


@dataclass(frozen=True)
class Backlog:
    kind: str
    start: tuple[str, int]
    end: tuple[str, int]
    rows: int


@dataclass(frozen=True)
class Figure:
    rows: int
    wall_s: float
    cpu_s: float
    threads: dict[str, float] = field(default_factory=dict)
    """CPU µs per row of each thread (``send`` mode): main, delivery (the poll thread), librdkafka."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_s / self.rows * 1e6


class Null:
    """A producer that acknowledges at once (``encode`` mode): the send path without Kafka."""

    def produce(
        self, topic: str, key: bytes, value: bytes, on_delivered: Callable[[], None], **_: Any
    ) -> None:
        on_delivered()


def _position(conn: Any) -> tuple[str, int]:
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
    return str(row[0]), int(row[1])


def write_backlogs(db: LocalMariaDB, changes: int, insert_rows: int, rows: int) -> dict[str, Backlog]:
    rng = random.Random(7)
    conn = pymysql.connect(
        host=db.host,
        port=db.port,
        user=db.admin_user,
        password=db.admin_password,
        autocommit=True,
        client_flag=CLIENT.MULTI_STATEMENTS,
    )

    def row(i: int, content: str) -> str:
        return f"({i},'text','{content}',X'{rng.randbytes(32).hex()}',UTC_TIMESTAMP(6))"

    def run(statements: Sequence[str]) -> None:
        with conn.cursor() as cur:
            for first in range(0, len(statements), 500):
                cur.execute(";".join(statements[first : first + 500]))
                while cur.nextset():
                    pass

    try:
        run(
            [f"CREATE DATABASE {DATABASE}"]
            + [ROW_TABLE_DDL.format(db=DATABASE, table=t) for t in TABLES.values()]
        )
        run(
            [
                f"INSERT INTO {DATABASE}.{TABLES['single']} VALUES "
                + ",".join(row(i, f"row {i}") for i in range(rows))
            ]
        )
        backlogs = {}
        start = _position(conn)
        run(
            [
                f"UPDATE {DATABASE}.{TABLES['single']} SET content='change {n}', "
                f"embedding=X'{rng.randbytes(32).hex()}', updated_at=UTC_TIMESTAMP(6) WHERE id={n % rows}"
                for n in range(changes)
            ]
        )
        backlogs["single"] = Backlog("single", start, _position(conn), changes)
        start = _position(conn)
        inserts = -(-changes // insert_rows)
        run(
            [
                f"INSERT INTO {DATABASE}.{TABLES['multi']} VALUES "
                + ",".join(row(n * insert_rows + i, f"new {i}") for i in range(insert_rows))
                for n in range(inserts)
            ]
        )
        backlogs["multi"] = Backlog("multi", start, _position(conn), inserts * insert_rows)
        return backlogs
    finally:
        conn.close()


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process so far, by native thread id (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    result: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        result[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return result


def _timed(
    work: Callable[[], int], threads: Callable[[], dict[str, int]] | None = None, *, tuned_gc: bool = True
) -> Figure:
    """``work``'s figure; ``tuned_gc``: under the collector settings the connector runs with (its
    ``connector_gc``), where the tree has them. Without them the delivery callbacks waiting for their
    acknowledgement made the collector walk this process's backlogs over and over: ``send`` on the
    multi-row backlog measured 81 CPU µs/row against about 50."""
    tuning = getattr(gc_tuning, "connector_gc", None) if tuned_gc else None
    before = thread_cpu()
    wall, cpu = time.perf_counter(), time.process_time()
    with tuning() if tuning is not None else contextlib.nullcontext():
        rows = work()
    figure = Figure(rows, time.perf_counter() - wall, time.process_time() - cpu)
    if threads is not None:
        after = thread_cpu()
        named = {tid: name for name, tid in threads().items()}
        split: dict[str, float] = {}
        for tid, seconds in after.items():
            name = named.get(tid, "librdkafka")
            split[name] = split.get(name, 0.0) + seconds - before.get(tid, 0.0)
        figure.threads.update({name: s / rows * 1e6 for name, s in split.items()})
    return figure


def measure_raw(mysql: MySQLSettings, backlog: Backlog) -> Figure:
    connection = {k: v for k, v in mysql.connection_kwargs().items() if k != "connect_timeout"}
    return _timed(
        tuned_gc=False,  # plain pymysqlreplication, as anyone would run it
        work=lambda: (
            raw_decode(
                connection,
                server_id=4901,
                start=backlog.start,
                rows=backlog.rows,
                schema=DATABASE,
                table=TABLES[backlog.kind],
            ).items
        ),
    )


def _source(mysql: MySQLSettings, backlog: Backlog, fast_rows: bool = True) -> BinlogSource:
    return BinlogSource(
        mysql,
        [(DATABASE, TABLES[backlog.kind])],
        start=BinlogPosition(*backlog.start),
        blocking=False,
        fast_rows=fast_rows,
    )


def _drain(
    source: BinlogSource,
    backlog: Backlog,
    on_item: Callable[[Item], None],
    on_boundary: Callable[[BinlogPosition], None],
) -> int:
    rows = 0
    try:
        for item in source:
            if isinstance(item, Boundary):
                on_boundary(item.position)
                if (item.position.file, item.position.pos) >= backlog.end:
                    break
            elif isinstance(item, ChangeEvent):
                rows += 1
                on_item(item)
    finally:
        source.close()
    return rows


def measure_source(mysql: MySQLSettings, backlog: Backlog, fast_rows: bool = True) -> Figure:
    source = _source(mysql, backlog, fast_rows)
    return _timed(lambda: _drain(source, backlog, lambda item: None, lambda position: None))


def _sender(kafka: KafkaSettings, tracker: CheckpointTracker, producer: Any) -> Sender:
    limit = MessageLimit(kafka.max_message_bytes)
    return Sender(kafka, limit, tracker, producer, stats=ConnectorStats(), metrics=CONNECTOR_METRICS)


def measure_encode(mysql: MySQLSettings, kafka: KafkaSettings, backlog: Backlog) -> Figure:
    tracker = CheckpointTracker(BinlogPosition(*backlog.start))
    sender = _sender(kafka, tracker, Null())
    source = _source(mysql, backlog)
    return _timed(lambda: _drain(source, backlog, sender.send, tracker.boundary))


def process_cpu(pid: int | None) -> float:
    """CPU seconds of another process so far (0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_send(
    mysql: MySQLSettings,
    kafka: KafkaSettings,
    backlog: Backlog,
    producer_options: dict[str, Any],
    broker_pid: int | None = None,
) -> Figure:
    tracker = CheckpointTracker(BinlogPosition(*backlog.start))
    producer = ChangeProducer(kafka, **producer_options)
    sender = _sender(kafka, tracker, producer)
    source = _source(mysql, backlog)

    serve = getattr(producer, "serve", None)  # as the connector's loop does, where the tree has it
    every_s = getattr(runner, "SERVE_EVERY_S", 0.0)  # how often it does (each message before it had one)
    served_at = 0.0

    def send(item: Item) -> None:
        nonlocal served_at
        if serve is not None:
            now = time.monotonic()
            if now - served_at >= every_s:
                serve()
                served_at = now
        sender.send(item)

    def work() -> int:
        rows = _drain(source, backlog, send, tracker.boundary)
        if producer.flush(60) != 0:
            raise RuntimeError("the broker did not acknowledge every message within 60 s")
        producer.raise_if_failed()
        return rows

    def threads() -> dict[str, int]:
        poller = producer._poller.native_id
        return {"main": threading.main_thread().native_id or 0, "delivery": poller or 0}

    try:
        broker = process_cpu(broker_pid)
        figure = _timed(work, threads)
        figure.threads["broker"] = (process_cpu(broker_pid) - broker) / figure.rows * 1e6
        return figure
    finally:
        producer.close(5)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--insert-rows", type=int, default=1_000)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES + EXTRA_MODES)}")
    parser.add_argument("--kinds", default="single,multi")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--producer",
        default="",
        help="ChangeProducer keyword arguments for send, as JSON (e.g. '{\"linger_ms\": 5}')",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES + EXTRA_MODES)
    if unknown:
        known = ", ".join(MODES + EXTRA_MODES)
        parser.error(f"unknown --modes {', '.join(sorted(unknown))}: choose from {known}")
    kinds = [k for k in args.kinds.split(",") if k]
    results: dict[str, dict[str, list[Figure]]] = {k: {m: [] for m in modes} for k in kinds}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="freshkey-path-") as root:
        db = stack.enter_context(LocalMariaDB(workdir=Path(root) / "mariadb"))
        broker = stack.enter_context(LocalKafka(workdir=Path(root) / "kafka"))
        mysql = MySQLSettings(host=db.host, port=db.port, user=db.user, password=db.password, server_id=4900)
        kafka = KafkaSettings(bootstrap=broker.bootstrap, change_topic="path.changes", partitions=4)
        prepare_topics(kafka, timeout_s=30)
        backlogs = write_backlogs(db, args.changes, args.insert_rows, args.rows)
        for _ in range(args.runs):
            for kind in kinds:
                backlog = backlogs[kind]
                for mode in modes:
                    if mode == "raw":
                        figure = measure_raw(mysql, backlog)
                    elif mode == "source":
                        figure = measure_source(mysql, backlog)
                    elif mode == "source-pmr":
                        figure = measure_source(mysql, backlog, fast_rows=False)
                    elif mode == "encode":
                        figure = measure_encode(mysql, kafka, backlog)
                    else:
                        options = orjson.loads(args.producer) if args.producer else {}
                        figure = measure_send(mysql, kafka, backlog, options, broker.pid)
                    if figure.rows != backlog.rows:
                        raise RuntimeError(f"{mode} {kind}: {figure.rows} rows, expected {backlog.rows}")
                    results[kind][mode].append(figure)
    report: dict[str, Any] = {}
    for kind in kinds:
        print(f"{kind} ({backlogs[kind].rows} rows), median of {args.runs} run(s):")
        raw_cpu = None
        for mode in modes:
            figures = results[kind][mode]
            cpu = statistics.median(f.cpu_us_per_row for f in figures)
            rate = statistics.median(f.rows_per_s for f in figures)
            raw_cpu = cpu if mode == "raw" else raw_cpu
            ratio = f"  raw/this CPU {raw_cpu / cpu:.2f}x" if raw_cpu is not None and mode != "raw" else ""
            split = ""
            if figures[0].threads:
                names = sorted(figures[0].threads)
                split = (
                    "  ("
                    + ", ".join(
                        f"{n} {statistics.median(f.threads.get(n, 0.0) for f in figures):.1f}" for n in names
                    )
                    + ")"
                )
            print(f"  {mode:10s} {cpu:7.1f} CPU µs/row  {rate:9,.0f} rows/s{ratio}{split}")
            report.setdefault(kind, {})[mode] = {"cpu_us_per_row": cpu, "rows_per_s": rate}
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main(sys.argv[1:])
