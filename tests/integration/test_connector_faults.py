"""The connector never wedges (issue 8): an oversized row, a rows event the binlog reader cannot read, a
database restart, a broker restart that loses its topics, a purged binlog, a DDL naming a bound table
from another database.

Real servers throughout. Restarts use private servers (a LocalMariaDB or LocalKafka of the test), never
the session-wide ones other tests share. Each test fails on a connector without the protection it
checks: it crashed on MSG_SIZE_TOO_LARGE, exited on OperationalError 2003 and UNKNOWN_PRODUCER_ID,
died with a raw 1236 traceback on a purged binlog, and emitted no DDL for ``ALTER TABLE db.t`` run from
another database, and exited (restarted forever) on a rows event pymysqlreplication raised on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cache_writer.client import FillResult, Hit, Miss, SyncCacheClient
from connectors.checkpoint import CheckpointStore
from pipeline.demo.catchup import connector_reached
from pipeline.embedded import (
    LocalKafka,
    LocalMariaDB,
    free_port,
)
from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, decode
from tests.support.kafka import read_records, read_topic
from tests.support.pipeline import Pipeline
from tests.support.processes import start_freshkey
from tests.support.services import MySQLService, running

pytestmark = pytest.mark.integration

FAST_RETRY = {
    "COLUMNS": "300",
    "FRESHKEY_CONNECTOR_RETRY_INITIAL_BACKOFF_S": "0.2",
    "FRESHKEY_CONNECTOR_RETRY_MAX_BACKOFF_S": "1.0",
}
ROW = (
    "INSERT INTO assets (id, modality, content, embedding, updated_at) "
    "VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))"
)


def connector_log(p: Pipeline) -> str:
    """The connector's log lines, with the console's line wrapping undone (whitespace collapsed)."""
    text = " ".join(path.read_text(errors="replace") for path in sorted(p.workdir.glob("connector*.log")))
    return " ".join(text.split())


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one Prometheus series (labels matched as a subset), or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def changes_on_topic(p: Pipeline, expect: int, timeout: float = 30) -> list[ChangeEvent | DdlEvent]:
    return [decode(value) for _, value in read_topic(p.kafka, p.change_topic, expect=expect, timeout=timeout)]


def ids(events: list[ChangeEvent | DdlEvent]) -> set[int]:
    return {int(e.key["id"]) for e in events if isinstance(e, ChangeEvent)}


@pytest.fixture
def private_mysql() -> Iterator[tuple[LocalMariaDB, MySQLService]]:
    with running(LocalMariaDB()) as server:
        yield server, MySQLService.of(server)


@pytest.fixture
def private_kafka() -> Iterator[LocalKafka]:
    with running(LocalKafka()) as server:
        yield server


@pytest.fixture
def pipelines() -> Iterator[list[Pipeline]]:
    made: list[Pipeline] = []
    yield made
    for p in made:
        p.close()


@pytest.fixture
def on_private_mysql(
    private_mysql: tuple[LocalMariaDB, MySQLService],
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
    pipelines: list[Pipeline],
) -> tuple[LocalMariaDB, MySQLService, Pipeline]:
    """A pipeline on a private database (which the test may halt), the session's broker and Redis."""
    server, mysql = private_mysql
    p = Pipeline(mysql, kafka_bootstrap, redis_url, tmp_path, version_column=False)
    pipelines.append(p)
    return server, mysql, p


def two_rows_cached(p: Pipeline, alter: str) -> tuple[Pipeline, int]:
    """``alter`` the table, start the connector (its metrics on the port returned) and the worker, and
    cache rows 1 and 2."""
    p.sql(alter)
    metrics_port = free_port()
    p.start("connector", FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT=str(metrics_port))
    p.start("worker")
    p.sql(ROW, (1, "small one"))
    p.sql(ROW, (2, "small two"))
    p.wait_consistent(timeout=60)
    return p, metrics_port


# --- oversized rows ------------------------------------------------------------------------------------


def test_a_2mb_row_becomes_an_invalidation_and_the_next_rows_flow(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p, metrics_port = two_rows_cached(make_pipeline(), "ALTER TABLE assets MODIFY content LONGTEXT NOT NULL")
    before = p.entry(1)
    assert before is not None and not before.tombstone

    secret = "SECRET-ROW-VALUE-" + "x" * 2_000_000
    p.sql("UPDATE assets SET content = %s WHERE id = 1", (secret,))
    p.sql(ROW, (3, "after the big one"))

    # On the topic: two rows, the big update as an invalidation, the row after it.
    events = changes_on_topic(p, expect=4)
    big = [e for e in events if isinstance(e, ChangeEvent) and e.key == {"id": 1} and e.op == "u"]
    assert len(big) == 1, events
    assert big[0].oversize and big[0].before is None and big[0].after is None
    assert big[0].source.table == "assets" and big[0].version > before.version
    assert 3 in ids(events)

    # The worker drops the entry (the application reads the row through); the next row is cached.
    p.wait(lambda: (e := p.entry(1)) is not None and e.tombstone, 60, "row 1's entry to be tombstoned")
    p.wait(lambda: (e := p.entry(3)) is not None and not e.tombstone, 60, "row 3 in the cache")

    # Never a crash or a restart.
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None
    log = connector_log(p)
    assert "sent as an invalidation" in log and "{'id': 1}" in log and "assets" in log
    assert "SECRET-ROW-VALUE" not in log, "row values are never logged"
    assert metric(metrics_text(metrics_port), "freshkey_connector_oversize_total") == 1


# --- a rows event the binlog reader cannot read ------------------------------------------------------


def test_an_unreadable_rows_event_is_dead_lettered_and_fences_its_namespace(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """A DATE that is no calendar day (stored under ALLOW_INVALID_DATES) in a table with a POINT column:
    freshkey's row decoder hands such a table to pymysqlreplication, which raises on the whole event. Its
    changes are lost: the connector dead-letters the event, fences the table's namespace through every
    partition of the change topic, and goes on; entries cached before are no longer served."""
    alter = "ALTER TABLE assets ADD COLUMN born DATE NULL, ADD COLUMN spot POINT NULL"
    p, metrics_port = two_rows_cached(make_pipeline(), alter)
    cache = SyncCacheClient(p.redis, prefix=p.prefix)
    assert isinstance(cache.get(p.namespace, [1]), Hit)

    p.sql("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
    p.sql("UPDATE assets SET born = '2024-02-30', content = 'lost' WHERE id = 1")
    p.sql("SET SESSION sql_mode = DEFAULT")

    # The event as a dead letter, its fence on every partition of the change topic.
    letters = [decode_letter(r.value) for r in read_records(p.kafka, p.dead_letter_topic, expect=1)]
    assert [d.stage for d in letters] == ["connector-binlog"]
    assert "assets could not be read: ValueError" in letters[0].reason
    records = read_records(p.kafka, p.change_topic, expect=5)
    fences = [(r.partition, decode(r.value)) for r in records if r.key and r.key.startswith(b"fence/")]
    assert sorted(partition for partition, _ in fences) == [0, 1, 2]
    assert all(isinstance(f, FenceEvent) and f.source.table == "assets" for _, f in fences)

    # The worker fenced the namespace once per partition; what was cached before is not served.
    p.wait(lambda: fence_events(p) == 3, 60, "the worker to take the three fence events")
    for row_id in (1, 2):
        fenced(p, cache, row_id)

    # The connector goes on (never a crash or a restart), and later changes are cached and served.
    p.sql(ROW, (3, "three"))
    p.wait(lambda: isinstance(cache.get(p.namespace, [3]), Hit), 60, "row 3 served")
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None
    assert metric(metrics_text(metrics_port), "freshkey_connector_unreadable_events_total") == 1
    assert "cannot be read" in connector_log(p) and "fenced" in connector_log(p)


def test_a_row_change_logged_as_a_statement_fences_the_tables_it_may_touch(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """A writer whose session logs in STATEMENT format: its UPDATE is a query event, its rows are not in
    the binlog. The connector fences the bound tables of the statement's database through every
    partition; before, the statement passed for a DDL that moved no signature, and row 1 stayed cached
    with its old value."""
    p, metrics_port = two_rows_cached(make_pipeline(), "ALTER TABLE assets COMMENT 'statement test'")
    cache = SyncCacheClient(p.redis, prefix=p.prefix)
    assert isinstance(cache.get(p.namespace, [1]), Hit)

    p.sql("SET SESSION binlog_format = 'STATEMENT'")
    p.sql("UPDATE assets SET content = 'lost' WHERE id = 1")
    p.sql("SET SESSION binlog_format = 'ROW'")

    p.wait(lambda: fence_events(p) == 3, 60, "the worker to take the three fence events")
    fenced(p, cache, 1)
    p.sql(ROW, (3, "three"))
    p.wait(lambda: isinstance(cache.get(p.namespace, [3]), Hit), 60, "row 3 served")
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None
    assert metric(metrics_text(metrics_port), "freshkey_connector_unreadable_events_total") == 1
    log = connector_log(p)
    assert "logged as a statement" in log and "'lost'" not in log, "row values are never logged"


def test_a_row_change_that_becomes_a_dead_letter_fences_its_namespace(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """A bound table loses its primary key: its row changes cannot address a row and become dead letters
    (as before); its entries are fenced now. Before, an entry the application filled after the DDL stayed
    served with its old value."""
    p, _ = two_rows_cached(make_pipeline(), "ALTER TABLE assets COMMENT 'dead letter test'")
    cache = SyncCacheClient(p.redis, prefix=p.prefix)
    p.sql("ALTER TABLE assets DROP PRIMARY KEY")
    p.wait(lambda: (p.stats() or {}).get("events", {}).get("ddl", 0) >= 1, 60, "the worker to take the DDL")
    miss = cache.get(p.namespace, [1])  # the DDL moved the signature: the application reads through
    assert isinstance(miss, Miss) and miss.lease is not None
    assert cache.fill(miss.lease, b'{"content": "small one"}') is FillResult.FILLED
    assert isinstance(cache.get(p.namespace, [1]), Hit)
    p.sql("UPDATE assets SET content = 'lost' WHERE id = 1")
    letters = [decode_letter(r.value) for r in read_records(p.kafka, p.dead_letter_topic, expect=1)]
    assert [d.stage for d in letters] == ["connector"] and "has no primary key" in letters[0].reason
    p.wait(lambda: isinstance(cache.get(p.namespace, [1]), Miss), 60, "row 1 no longer served")
    p.wait(lambda: fence_events(p) == 3, 60, "the worker to take the three fence events")
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None


def test_binlog_compression_turned_on_while_running_fences_every_bound_table(
    on_private_mysql: tuple[LocalMariaDB, MySQLService, Pipeline],
) -> None:
    """MariaDB's log_bin_compress is global and dynamic: turned on after the connector started (which
    refuses it at its start), rows events over 256 bytes are compressed, and pymysqlreplication skips
    them as events it does not implement. The connector fences every bound table instead of missing the
    change."""
    _, _, p = on_private_mysql
    p, metrics_port = two_rows_cached(p, "ALTER TABLE assets COMMENT 'compression test'")
    cache = SyncCacheClient(p.redis, prefix=p.prefix)
    assert isinstance(cache.get(p.namespace, [1]), Hit)
    p.sql("SET GLOBAL log_bin_compress = ON")
    try:
        p.sql("UPDATE assets SET content = %s WHERE id = 1", ("lost " + "x" * 2000,))
    finally:
        p.sql("SET GLOBAL log_bin_compress = OFF")

    # Every table the connector reads is fenced (one count each), through the 3 partitions.
    def unreadable() -> int:
        return int(metric(metrics_text(metrics_port), "freshkey_connector_unreadable_events_total") or 0)

    p.wait(lambda: unreadable() > 0, 60, "the connector to fence")
    tables = settled(unreadable)  # the connector counts one table at a time: not a count read midway
    p.wait(lambda: fence_events(p) == 3 * tables, 60, "the worker to take the fence events")
    fenced(p, cache, 1)
    p.sql(ROW, (3, "three"))
    p.wait(lambda: isinstance(cache.get(p.namespace, [3]), Hit), 60, "row 3 served")
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None
    assert unreadable() == tables
    assert "compressed rows event" in connector_log(p)


def settled(count: Callable[[], int], quiet_s: float = 0.5, timeout_s: float = 30.0) -> int:
    """``count()`` once two reads ``quiet_s`` apart agree."""
    deadline = time.monotonic() + timeout_s
    last = count()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = count()
        if now == last:
            return now
        last = now
    raise AssertionError(f"the count kept changing for {timeout_s:.0f} s (last {last})")


def fenced(p: Pipeline, cache: SyncCacheClient, row_id: int) -> None:
    """The row is no longer served. The worker counts a fence event when it plans the batch, and fences in
    L2 just after (a Redis round trip, longer on a loaded machine): wait for that, a few seconds at most.
    Without the fence the row stays served and this fails."""
    p.wait(lambda: isinstance(cache.get(p.namespace, [row_id]), Miss), 10, f"row {row_id} fenced")


def fence_events(p: Pipeline) -> int:
    """The fence events the worker took (``events.fence_event`` of its stats)."""
    stats = p.stats()
    return int(stats["events"].get("fence_event", 0)) if stats else 0


def decode_letter(value: bytes) -> DeadLetter:
    return DeadLetter.model_validate_json(value)


# --- a database restart ------------------------------------------------------------------------------


def test_the_connector_rides_out_a_database_restart(
    on_private_mysql: tuple[LocalMariaDB, MySQLService, Pipeline],
) -> None:
    server, mysql, p = on_private_mysql
    metrics_port = free_port()
    p.start("connector", FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT=str(metrics_port), **FAST_RETRY)
    p.start("worker")
    for i in range(1, 6):
        p.sql(ROW, (i, f"before {i}"))
    p.wait_consistent(timeout=60)

    server.halt()  # p.conn dies with it: replaced below
    p.wait(lambda: "database unavailable" in connector_log(p), 30, "the connector to log a retry")
    p.wait(
        lambda: connector_log(p).count("next attempt") >= 3, 30, "several attempts while the server is down"
    )
    assert metric(metrics_text(metrics_port), "freshkey_connector_connected") == 0
    server.resume()

    # Changes while the connector is still waiting to reconnect, then after it did.
    p.conn = mysql.connect(p.database)
    for i in range(6, 11):
        p.sql(ROW, (i, f"during {i}"))
    p.sql("UPDATE assets SET content = 'changed during' WHERE id = 1")
    p.wait(lambda: metric(metrics_text(metrics_port), "freshkey_connector_connected") == 1, 30, "reconnected")
    for i in range(11, 16):
        p.sql(ROW, (i, f"after {i}"))
    p.sql("DELETE FROM assets WHERE id = 2")

    report = p.wait_consistent(timeout=90)
    assert report.rows == 14 and report.stale == 0 and report.missing == 0
    deleted = p.entry(2)
    assert deleted is not None and deleted.tombstone
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None, "never restarted"
    log = connector_log(p)
    assert re.search(r"session ended \(database unavailable\): .*next attempt \d+ in [\d.]+ s", log), log[
        -3000:
    ]
    retries = metric(metrics_text(metrics_port), "freshkey_connector_retries_total", cause="database")
    assert retries is not None and retries >= 3


# --- a broker restart that loses its topics -----------------------------------------------------------


def test_the_connector_rides_out_a_broker_restart_and_fences_the_lost_topic(
    mysql_service: MySQLService,
    private_kafka: LocalKafka,
    redis_url: str,
    tmp_path: Path,
    pipelines: list[Pipeline],
) -> None:
    p = Pipeline(mysql_service, private_kafka.bootstrap, redis_url, tmp_path, version_column=False)
    pipelines.append(p)
    metrics_port = free_port()
    p.start(
        "connector",
        FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT=str(metrics_port),
        FRESHKEY_CONNECTOR_DELIVERY_TIMEOUT_S="10",
        **FAST_RETRY,
    )
    for i in range(1, 4):
        p.sql(ROW, (i, f"before {i}"))
    assert ids(changes_on_topic(p, expect=3)) == {1, 2, 3}
    store = CheckpointStore(p.checkpoint_path)
    end = p.master_position()
    p.wait(lambda: connector_reached(store.load(), end), 30, "the checkpoint past the first rows")

    private_kafka.halt()
    for i in range(4, 7):
        p.sql(ROW, (i, f"during {i}"))
    p.wait(lambda: "kafka unavailable" in connector_log(p), 30, "the connector to log a retry")
    assert metric(metrics_text(metrics_port), "freshkey_connector_connected") == 0
    private_kafka.resume()  # empty: the topics and every event on them are gone
    for i in range(7, 10):
        p.sql(ROW, (i, f"after {i}"))
    # Read only once the connector recreated the topic: a consumer asking for a missing topic makes
    # this broker auto-create it with its default partition count.
    p.wait(lambda: "fenced 1 namespace(s)" in connector_log(p), 60, "the fence after the gap")

    # Rows from before the restart were acknowledged (checkpoint past them) and then lost with the
    # broker: the connector cannot replay them, so it fences every namespace before producing again.
    events = changes_on_topic(p, expect=6, timeout=60)
    assert ids(events) >= set(range(4, 10))
    assert p.starts["connector"] == 1 and p.procs["connector"].poll() is None, "never restarted"
    log = connector_log(p)
    assert "GAP: the change topic" in log and "was missing" in log
    fenced = log.index(f"fenced 1 namespace(s) after a gap: {p.namespace}")
    assert log.index("connector reading", fenced) > fenced, "fenced before the session that produced again"
    text = metrics_text(metrics_port)
    assert (metric(text, "freshkey_connector_retries_total", cause="kafka") or 0) >= 1
    assert metric(text, "freshkey_connector_gaps_total") == 1


# --- a purged binlog ---------------------------------------------------------------------------------


def _freshkey(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        env={**p.env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _purge_through(mysql: MySQLService, file: str) -> tuple[str, ...]:
    """Rotate twice and purge every binlog before the newest until ``file`` is gone; the files left."""
    with mysql.connect() as conn, conn.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW BINARY LOGS")
        newest = str(cur.fetchall()[-1][0])
        deadline = time.monotonic() + 20
        while True:
            # MariaDB keeps a file until its binlog checkpoint is written (about a second here).
            cur.execute("PURGE BINARY LOGS TO %s", (newest,))
            cur.execute("SHOW BINARY LOGS")
            left = tuple(str(row[0]) for row in cur.fetchall())
            if file not in left:
                return left
            assert time.monotonic() < deadline, f"{file} still there: {left}"
            time.sleep(0.2)


def test_a_purged_binlog_stops_the_connector_with_the_way_on_and_accept_gap_fences_first(
    on_private_mysql: tuple[LocalMariaDB, MySQLService, Pipeline], tmp_path: Path
) -> None:
    _, mysql, p = on_private_mysql
    p.start("connector")
    p.sql(ROW, (1, "read before the purge"))
    store = CheckpointStore(p.checkpoint_path)
    end = p.master_position()
    p.wait(lambda: connector_reached(store.load(), end), 30, "the checkpoint past row 1")
    assert p.stop("connector") == 0
    needed = store.load()
    assert needed is not None

    p.sql("FLUSH BINARY LOGS")
    p.sql(ROW, (2, "changed in the lost window"))
    left = _purge_through(mysql, needed.file)
    oldest = left[0]

    refused = _freshkey(p, "connector")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = refused.stderr
    assert "Traceback" not in message
    assert needed.file in message and oldest in message and "--accept-gap" in message, message
    assert "freshkey snapshot" in message
    assert store.load() == needed, "a refused connector keeps its checkpoint"

    doctor = _freshkey(p, "doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    flat = " ".join(doctor.stdout.replace("│", " ").split())
    assert "checkpoint binlog on the server" in flat and needed.file in flat and oldest in flat

    # --accept-gap: fence first, then continue from the current position.
    log_path = tmp_path / "connector.accept-gap.log"
    p.procs["connector"] = start_freshkey(["connector", "--accept-gap"], p.env, log_path)
    p.wait(lambda: "connector reading" in log_path.read_text(errors="replace"), 60, "the connector to start")
    p.sql(ROW, (3, "after the accepted gap"))
    events = changes_on_topic(p, expect=2)
    assert ids(events) == {1, 3}, "row 2 changed in the lost window: not replayed, hence the fence"
    log = " ".join(log_path.read_text(errors="replace").split())
    assert "ACCEPTING A BINLOG GAP" in log and needed.file in log
    fenced = log.index(f"fenced 1 namespace(s) after a gap: {p.namespace}")
    assert fenced < log.index("connector reading"), "the fence comes before anything is read or produced"
    moved = store.load()
    assert moved is not None and moved.file >= oldest


# --- DDL run from another database ---------------------------------------------------------------------


def test_a_ddl_naming_a_bound_table_from_another_database_is_emitted(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    p.start("connector")
    other = f"{p.database}_other"
    with p.mysql.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {other}")
        try:
            cur.execute(f"USE {other}")
            cur.execute(f"ALTER TABLE `{p.database}`.assets ADD COLUMN extra INT")
        finally:
            cur.execute(f"DROP DATABASE {other}")
    p.sql(ROW, (1, "after the DDL"))
    events = changes_on_topic(p, expect=2)
    ddl = [e for e in events if isinstance(e, DdlEvent)]
    assert len(ddl) == 1, events
    assert ddl[0].source.db == p.database and ddl[0].source.table == "assets"
    assert "ADD COLUMN extra" in ddl[0].query
