"""``freshkey snapshot`` on the real services: watermarks against a racing stream (and the same race
without them), a kill -9 mid-snapshot, Ctrl-C and resume, the purged-binlog recovery in one step, and the
signal table's grant in ``freshkey doctor``.

The rows are written before the connector starts, so only a snapshot can bring them into the caches;
the stream then races it with updates, deletes and re-inserts (hot rows in every chunk). The race test
ends with 0 stale and 0 missing in L2 and L3; the same race with the watermark step off
(``FRESHKEY_CONNECTOR_SNAPSHOT_UNSAFE_KEEP_CHANGED_ROWS``: a chunk's rows that changed between its
watermarks are sent anyway, with the high watermark's version) ends stale: the check can fail.
The large-table figure (rows/s of a 1,000,000-row snapshot) is a bench, not a test:
``python -m tests.benchmarks.snapshot_rows``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from cache_writer.client.core import Hit
from cache_writer.client.sync import SyncCacheClient
from cache_writer.entries import read_namespace
from connectors.checkpoint import CheckpointStore
from connectors.database import read_table
from connectors.doctor import signal_table_check
from connectors.settings import MySQLSettings
from connectors.snapshot.store import SnapshotStore
from pipeline.demo.catchup import high_watermarks, worker_reached
from pipeline.embedded import LocalMariaDB, MissingBinaryError, ServiceStartError
from pipeline.verify.judge import VerifyReport, expected_value, verify_namespace
from schemas import parse_bindings
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService
from tests.support.snapshot import (
    Churn,
    preload,
    run_snapshot,
    signal_grants,
    start_command,
    status,
    status_rows,
    worker_ops,
)

pytestmark = [pytest.mark.integration]

ROWS = 3000
RACE_ROUNDS = 4
"""At most this many snapshots race the churn, each with a fresh churn, until the race shows (rows
dropped by the watermark step; stale entries without it)."""


@pytest.fixture(autouse=True)
def signal_table_grants(mysql_service: MySQLService) -> None:
    signal_grants(mysql_service)


def l3_url(redis_url: str) -> str:
    """L3 for the tests: database 1 of the same Redis (the same key layout, another keyspace)."""
    base, _, db = redis_url.rpartition("/")
    assert db.isdigit(), redis_url
    return f"{base}/{int(db) + 1}"


def admin_settings(p: Pipeline) -> MySQLSettings:
    return MySQLSettings(
        host=p.mysql.host,
        port=p.mysql.port,
        user=p.mysql.admin_user,
        password=p.mysql.admin_password,  # type: ignore[arg-type]
    )


def verify_tier(p: Pipeline, url: str) -> VerifyReport:
    """Every row of the table against the tier at ``url``, entry by entry (one look: call it once the
    pipeline has caught up)."""

    async def entries() -> Any:
        client = aioredis.Redis.from_url(url)
        try:
            return await read_namespace(client, p.prefix, p.namespace)
        finally:
            await client.aclose()

    binding = parse_bindings(p.bindings_text).bindings[0]
    rows = list(read_table(admin_settings(p), p.database, "assets"))
    return verify_namespace(binding, rows, asyncio.run(entries()), prefix=p.prefix, key_columns=("id",))


@dataclass(frozen=True)
class Round:
    """One snapshot racing a churn, and every tier checked once the pipeline caught up after it."""

    figures: dict[str, Any]
    changes: int
    l2: VerifyReport
    l3: VerifyReport


def race(p: Pipeline, *, chunk_rows: int, rate: float, enough: Callable[[Round], bool]) -> list[Round]:
    """Preloaded rows; then, up to RACE_ROUNDS times: a steady churn, a snapshot in the middle of it, the
    churn stopped as soon as the snapshot ends (so an entry it left stale stays stale), both tiers checked
    entry by entry once the pipeline caught up. Stops after the first round that is ``enough``."""
    preload(p, ROWS)
    p.start("connector")
    p.start("worker", FRESHKEY_REDIS_L3_URL=l3_url(p.redis_url))
    rounds: list[Round] = []
    for attempt in range(RACE_ROUNDS):
        before = worker_ops(p).get("u", 0)
        churn = Churn(p, ROWS, rate, seed=7 + attempt)
        churn.start()
        try:
            p.wait(lambda b=before: worker_ops(p).get("u", 0) > b + 50, 60, "the stream in full flow")
            figures = run_snapshot(p, "--chunk-rows", str(chunk_rows))
        finally:
            churn.stop()
        p.wait_caught_up()
        rounds.append(Round(figures, churn.count, p.verify(), verify_tier(p, l3_url(p.redis_url))))
        if enough(rounds[-1]):
            break
    return rounds


def describe(rounds: list[Round]) -> str:
    return "\n".join(
        f"round {i + 1}: {r.figures['rows']} sent, {r.figures['dropped']} dropped, "
        f"{r.figures['rows_per_s']:,.0f} rows/s, {r.changes} changes raced; "
        f"L2 {r.l2.checked} checked, {r.l2.stale} stale, {r.l2.missing} missing; "
        f"L3 {r.l3.checked} checked, {r.l3.stale} stale, {r.l3.missing} missing"
        for i, r in enumerate(rounds)
    )


# -- tests ---------------------------------------------------------------------------------------------


def test_a_snapshot_racing_the_stream_ends_consistent_in_every_tier(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """Updates, deletes and re-inserts (hot rows in every chunk) race each snapshot: after every round
    both tiers hold every row as the database does, and rows did change between watermarks."""
    p = make_pipeline(version_column=False)
    rounds = race(p, chunk_rows=1000, rate=600, enough=lambda r: r.figures["dropped"] > 0)
    print(f"\nsnapshots of {ROWS} rows with watermarks:\n{describe(rounds)}")
    for r in rounds:
        assert r.figures["status"] == "done", r.figures
        assert r.l2.stale == 0 and r.l2.missing == 0, r.l2
        assert r.l3.stale == 0 and r.l3.missing == 0, r.l3
        assert r.l2.checked > ROWS // 2 and r.l3.checked > ROWS // 2
    assert rounds[-1].figures["dropped"] > 0, "no row changed between watermarks: the race never happened"
    assert "rows/s" in rounds[-1].figures["output"], rounds[-1].figures["output"]
    ops = worker_ops(p)
    assert ops.get("r", 0) >= sum(r.figures["rows"] for r in rounds), ops


def test_without_the_watermark_step_the_same_race_ends_stale(make_pipeline: Callable[..., Pipeline]) -> None:
    """Negative control. Protection off (every row of a chunk is sent, also those that changed between
    its watermarks, with the high watermark's version): the same race leaves stale entries."""
    p = make_pipeline(version_column=False)
    p.env["FRESHKEY_CONNECTOR_SNAPSHOT_UNSAFE_KEEP_CHANGED_ROWS"] = "true"
    rounds = race(p, chunk_rows=1000, rate=600, enough=lambda r: r.l2.stale > 0)
    print(f"\nsnapshots of {ROWS} rows WITHOUT watermarks:\n{describe(rounds)}")
    assert all(r.figures["dropped"] == 0 for r in rounds)
    assert rounds[-1].l2.stale > 0, (
        f"the watermark step protected nothing? the check cannot fail\n{describe(rounds)}"
    )
    assert rounds[-1].l3.stale > 0, rounds[-1].l3


def settled_ops(p: Pipeline, op: str, quiet_s: float = 3.0, timeout: float = 60) -> int:
    """The worker's count of ``op`` events once nothing more can come (the connector is down): the worker
    is past the topic's high watermarks (a hint: the test broker may under-report them by a batch) and
    its count has held still for ``quiet_s``."""
    highs = high_watermarks(p.kafka, p.change_topic)
    p.wait(
        lambda: worker_reached(p.stats(), p.change_topic, highs), timeout, "the worker at the high watermarks"
    )
    deadline = time.monotonic() + timeout
    last, since = worker_ops(p).get(op, 0), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the worker's {op} count never held still\n{p.logs()}"
        time.sleep(0.1)
        now = worker_ops(p).get(op, 0)
        if now != last:
            last, since = now, time.monotonic()
    return last


def test_kill9_of_the_connector_mid_snapshot_resumes_after_the_last_acknowledged_chunk(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """A version_column binding, a light stream, the connector killed with -9 while chunks are in
    flight: the restarted connector goes on after the last chunk it had counted (not from the first
    row): the rows sent twice are exactly those Kafka had beyond the saved progress; the command that
    follows it ends with every row, and the cache is consistent."""
    rows, chunk = 20_000, 500
    p = make_pipeline(version_column=True)
    preload(p, rows)
    p.start("connector")
    p.start("worker")
    churn = Churn(p, rows, 150)
    churn.start()
    out = p.workdir / "snapshot.json"
    command, log = start_command(
        p, "snapshot", "--chunk-rows", str(chunk), "--max-rows-per-s", "4000", "--json", str(out)
    )
    try:
        p.wait(lambda: status_rows(p) >= 4000, 60, "4,000 rows acknowledged")
        p.kill9("connector")
        saved = SnapshotStore(p.workdir / "checkpoint.snapshot.json").load()
        assert saved is not None and saved.status == "running" and 4000 <= saved.rows < rows, saved
        in_kafka = settled_ops(p, "r")  # the dead connector sends nothing more
        p.start("connector")
        assert command.wait(timeout=120) == 0, log.read_text() + p.logs()
    finally:
        churn.stop()
        if command.poll() is None:
            command.kill()
    figures = json.loads(out.read_text())
    assert figures["status"] == "done"
    assert rows * 0.9 <= figures["rows"] + figures["dropped"] <= rows, (
        "each row once (the stream deletes some)"
    )
    p.wait_caught_up()
    p.wait(lambda: worker_ops(p).get("r", 0) >= figures["rows"], 60, "every acknowledged row at the worker")
    report = p.verify()
    sent = worker_ops(p).get("r", 0)
    beyond_saved, resent = in_kafka - saved.rows, sent - figures["rows"]
    print(
        f"\nkill -9 with {saved.rows:,} rows counted and {in_kafka:,} in Kafka; after the restart "
        f"{figures['rows']:,} counted ({figures['dropped']:,} dropped), {sent:,} op r events in all: "
        f"{resent:,} sent twice (Kafka had {beyond_saved:,} beyond the saved progress); {report}"
    )
    assert report.stale == 0 and report.missing == 0, report
    assert beyond_saved >= 0, "progress counted rows Kafka did not have"
    assert 0 <= resent <= beyond_saved, "rows sent again that the saved progress had counted"
    assert resent < saved.rows, "the snapshot started over"
    assert "continuing snapshot" in " ".join((p.workdir / "connector.2.log").read_text().split())


def test_ctrl_c_cancels_and_the_next_snapshot_continues(make_pipeline: Callable[..., Pipeline]) -> None:
    rows, chunk = 20_000, 500
    p = make_pipeline(version_column=False)
    preload(p, rows)
    p.start("connector")
    p.start("worker")
    out = p.workdir / "cancelled.json"
    command, log = start_command(
        p, "snapshot", "--chunk-rows", str(chunk), "--max-rows-per-s", "3000", "--json", str(out)
    )
    p.wait(lambda: status_rows(p) >= 3000, 60, "3,000 rows acknowledged")
    command.send_signal(signal.SIGINT)
    assert command.wait(timeout=30) == 130, log.read_text()
    cancelled = json.loads(out.read_text())
    assert cancelled["status"] == "cancelled" and 3000 <= cancelled["rows"] < rows, cancelled
    assert "freshkey snapshot` continues it" in " ".join(log.read_text().split())
    p.wait(lambda: (status(p) or {}).get("status") == "cancelled", 30, "the connector to stop")
    time.sleep(1.0)
    stopped_at = status_rows(p)
    time.sleep(1.0)
    assert status_rows(p) == stopped_at, "no chunk after the cancel"
    again = run_snapshot(p, "--chunk-rows", str(chunk))
    assert again["status"] == "done" and again["resumed_rows"] == stopped_at and again["rows"] == rows
    p.wait_caught_up()
    report = p.verify()
    assert report.stale == 0 and report.missing == 0, report
    assert worker_ops(p).get("r", 0) < rows + 2 * chunk, "continued, not started over"


@pytest.fixture
def private_mysql() -> Iterator[MySQLService]:
    """A MariaDB of this test alone: it purges its binlog."""
    server = LocalMariaDB()
    try:
        server.start()
    except (MissingBinaryError, ServiceStartError) as exc:
        pytest.fail(f"cannot start LocalMariaDB: {exc}", pytrace=False)
    try:
        service = MySQLService(
            server.host, server.port, server.admin_user, server.admin_password, server.user, server.password
        )
        signal_grants(service)
        yield service
    finally:
        server.stop()


def purge_through(p: Pipeline, file: str) -> None:
    """Rotate and purge until the binlog file ``file`` is gone from the server."""
    p.sql("FLUSH BINARY LOGS")
    newest = str(p.sql("SHOW BINARY LOGS")[-1][0])
    deadline = time.monotonic() + 20
    while file in {str(row[0]) for row in p.sql("SHOW BINARY LOGS")}:
        assert time.monotonic() < deadline, f"{file} is still on the server"
        p.sql("PURGE BINARY LOGS TO %s", (newest,))  # MariaDB keeps it until its binlog checkpoint
        time.sleep(0.2)


def test_a_purged_binlog_is_recovered_in_one_step_fence_first_then_snapshot(
    private_mysql: MySQLService, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    """``freshkey connector --accept-gap --snapshot``: rows changed or deleted while the connector was
    down, in a binlog since purged, are never served stale once the fence is in (an application reading
    through the client sees the database's value or a miss), and the snapshot refills every row."""
    p = Pipeline(private_mysql, kafka_bootstrap, redis_url, tmp_path, version_column=False)
    try:
        p.start("connector")
        p.start("worker")
        with p.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))",
                [(i, f"row {i} before") for i in range(200)],
            )
        p.wait_consistent(timeout=60)
        p.stop("connector")
        needed = CheckpointStore(p.checkpoint_path).load()
        assert needed is not None
        p.sql("FLUSH BINARY LOGS")
        p.sql("UPDATE assets SET content = CONCAT(content, ' lost') WHERE id < 50")
        p.sql("DELETE FROM assets WHERE id BETWEEN 50 AND 59")
        purge_through(p, needed.file)
        assert p.verify().stale == 60, "the lost changes left the cache stale: the scenario holds"

        connector, log = start_command(p, "connector", "--accept-gap", "--snapshot", name="connector")
        p.procs["connector"] = connector
        p.wait(lambda: "after a gap" in log.read_text(errors="replace"), 60, "the fence")
        binding = parse_bindings(p.bindings_text).bindings[0]
        client = SyncCacheClient(redis.Redis.from_url(redis_url), prefix=p.prefix)
        served_stale: list[str] = []
        hits = 0
        deadline = time.monotonic() + 90
        while (status(p) or {}).get("status") != "done":
            assert time.monotonic() < deadline, log.read_text() + p.logs()
            current = {int(r["id"]): r for r in read_table(admin_settings(p), p.database, "assets")}
            for row_id in range(60):
                found = client.get(p.namespace, [row_id])
                if isinstance(found, Hit):
                    hits += 1
                    row = current.get(row_id)
                    if row is None or found.value != expected_value(binding, row):
                        served_stale.append(f"row {row_id}: {found.value!r}")
        assert served_stale == [], served_stale[:5]
        p.wait_caught_up()
        # As applications see it: every row a hit holding its value, every deleted row a miss. (The
        # deleted rows' old entries are still in Redis, under the fenced signature: never served.)
        current = {int(r["id"]): r for r in read_table(admin_settings(p), p.database, "assets")}
        wrong, missing = [], []
        for row_id in range(200):
            found, row = client.get(p.namespace, [row_id]), current.get(row_id)
            if row is None:
                if isinstance(found, Hit):
                    wrong.append(f"row {row_id} deleted, served {found.value!r}")
            elif not isinstance(found, Hit):
                missing.append(row_id)
            elif found.value != expected_value(binding, row):
                wrong.append(f"row {row_id}: served {found.value!r}")
        text = " ".join(log.read_text(errors="replace").split())
        print(
            f"\nafter --accept-gap --snapshot: {hits} hits while it refilled, none stale; then "
            f"{len(current)} rows served: {len(wrong)} stale, {len(missing)} missing"
        )
        assert wrong == [] and missing == [], (wrong[:5], missing[:5])
        assert text.index("fenced 1 namespace(s)") < text.index("connector reading")
    finally:
        p.close()


def test_doctor_names_the_grant_the_signal_table_needs(mysql_service: MySQLService) -> None:
    """An account without privileges on the signal table's database fails the check with the GRANT to
    run; with it, the table is created and the check passes."""
    tag = uuid.uuid4().hex[:8]
    database, user = f"freshkey_signal_{tag}", f"snapcheck_{tag}"
    with mysql_service.connect() as conn, conn.cursor() as cur:
        for host in ("127.0.0.1", "localhost"):
            cur.execute(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw'")
    settings = MySQLSettings(host=mysql_service.host, port=mysql_service.port, user=user, password="pw")  # type: ignore[arg-type]
    try:
        refused = signal_table_check(settings, f"{database}.signal")
        assert not refused.ok, refused
        assert f"GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'" in refused.fix
        with mysql_service.connect() as conn, conn.cursor() as cur:
            for host in ("127.0.0.1", "localhost"):
                cur.execute(
                    f"GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'@'{host}'"
                )
        ready = signal_table_check(settings, f"{database}.signal")
        assert ready.ok and "created now" in ready.found, ready
        assert signal_table_check(settings, f"{database}.signal").found.endswith("(present), writable")
    finally:
        with mysql_service.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
            for host in ("127.0.0.1", "localhost"):
                cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
