"""``freshkey demo`` end to end: its own private services, a driven workload, a verified cache.

The first tests need no service (the demo's accounting, pace, sentinel rows and private settings);
the rest start the demo for real: every change accounted for, catch-up decided by sentinel rows (the
broker's watermarks shown to be early), ``--serve`` keeping a private stack up until Ctrl-C, and an
interrupt stopping everything the demo started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import orjson
import pytest

from connectors.kafka.producer import ChangeProducer
from connectors.kafka.topics import ensure_topics
from connectors.settings import KafkaSettings
from pipeline.config import load_settings
from pipeline.demo import run as demo
from pipeline.demo.accounting import Accounting, Written
from pipeline.demo.catchup import Sentinel, SentinelRows, high_watermarks, partition_of
from pipeline.demo.machine import MachineLoad, Pace
from pipeline.settings import TelemetrySettings, WorkerSettings
from schemas import message_key
from tests.conftest import MySQLService
from tests.support.compose import sql_statements

DEMO = [sys.executable, "-m", "pipeline", "demo"]

# --- without services -------------------------------------------------------------------------------


def test_accounting_adds_up_and_says_why_not() -> None:
    written = Written(inserts=300, updates=250, deletes=50, heartbeats=12, sentinels=4)
    events = {
        "change_applied": 590,
        "change_superseded": 20,
        "change_not_newer": 3,
        "dead_lettered": 2,
        "unbound": 1,
        "c": 310,
        "u": 253,
        "d": 50,
        "ddl": 3,  # not a row change: not counted
    }
    accounting = Accounting.from_events(written, events)
    assert (accounting.seen, written.total) == (616, 616)
    assert accounting.adds_up and accounting.to_json()["adds_up"], accounting.problems()

    short = Accounting.from_events(written, {**events, "change_applied": 587, "c": 307})
    assert not short.adds_up
    assert short.problems() == [
        "3 of the 616 changes written are not accounted for by the worker (not yet handled, or lost: "
        "see events in /freshkey/stats)"
    ]
    extra = Accounting.from_events(written, {**events, "unbound": 5})
    assert "4 more changes than the 616 written" in extra.problems()[0]
    by_op = Accounting.from_events(written, {**events, "u": 250})
    assert by_op.problems() == [
        "the worker's counts by op (610) differ from its applied + superseded + not newer (613)"
    ]


def test_pace_warns_when_the_driver_fell_behind() -> None:
    busy = MachineLoad(cpus=2, load_1m=6.1, load_5m=5.0, load_15m=4.0)
    quiet = MachineLoad(cpus=8, load_1m=0.5, load_5m=0.4, load_15m=0.3)
    assert Pace(500, 490, 0.01).warning(busy) is None, "98 % of the rate is holding it"
    warning = Pace(500, 310, 1.25).warning(busy)
    assert warning is not None
    assert "could not hold 500 changes/s: it reached 310/s and fell up to 1.25 s behind" in warning
    assert "the machine is busy (load 6.10 / 5.00 / 4.00 (1/5/15 min) on 2 CPUs)" in warning
    slow = Pace(500, 310, 1.25).warning(quiet)
    assert slow is not None and "the database or this process was too slow" in slow
    assert busy.busy and not quiet.busy
    now = MachineLoad.now()
    assert now.cpus >= 1 and now.load_1m >= 0


def test_sentinel_rows_cover_every_partition() -> None:
    for partitions in (1, 4, 12):
        rows = SentinelRows(
            database="freshkey", table="heartbeat", namespace="hb", prefix="fk", partitions=partitions
        )
        assert sorted(rows.ids) == list(range(partitions))
        for partition, row_id in rows.ids.items():
            assert row_id >= 1_000_000, "clear of the prober's row"
            assert partition_of(message_key("freshkey", "heartbeat", {"id": row_id}), partitions) == partition


def test_a_sentinel_counts_only_at_its_version_in_every_tier() -> None:
    sentinels = [Sentinel(0, 1_000_000, "a", 100), Sentinel(1, 1_000_001, "b", 200)]
    l2 = {"a": 100, "b": 250}
    l3: dict[str, int] = {"a": 100}
    assert SentinelRows.missing(sentinels, [l2.get]) == []
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == [sentinels[1]], "b not in L3 yet"
    l3["b"] = 199
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == [sentinels[1]], "an older b is not it"
    l3["b"] = 200
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == []


def test_the_demo_ignores_the_callers_addresses(tmp_path: Path) -> None:
    inherited = {
        "PATH": "/usr/bin",
        "FRESHKEY_REDIS_L3_URL": "redis://production:6379/0",
        "FRESHKEY_REDIS_KEY_PREFIX": "prod",
        "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": "9464",
        "FRESHKEY_SLA_P99_LAG_MS": "500",
        "FRESHKEY_WORKER_BATCH_MAX": "64",
    }
    env = demo.private_env(inherited, {"FRESHKEY_REDIS_KEY_PREFIX": "fk"})
    assert env == {
        "PATH": "/usr/bin",
        "FRESHKEY_SLA_P99_LAG_MS": "500",
        "FRESHKEY_WORKER_BATCH_MAX": "64",
        "FRESHKEY_REDIS_KEY_PREFIX": "fk",
    }


def test_the_env_file_is_private_and_read_by_the_commands(tmp_path: Path) -> None:
    path = tmp_path / "freshkey.env"
    demo.write_env_file(
        path, {"FRESHKEY_WORKER_WEB_PORT": "41234", "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": "0"}
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "it holds the database password"
    assert load_settings(WorkerSettings, path).web_port == 41234
    assert load_settings(TelemetrySettings, path).prometheus_port == 0
    with pytest.raises(ValueError, match="newline"):
        demo.write_env_file(path, {"FRESHKEY_MYSQL_PASSWORD": "a\nb"})


# --- on the services --------------------------------------------------------------------------------


@pytest.mark.integration
def test_partition_of_is_the_producers_and_the_watermarks_are_early(kafka_bootstrap: str) -> None:
    """Sentinel rows land where :func:`partition_of` says (the connector's own producer); the broker's
    high watermarks, after a burst it acknowledged in full, say less than it holds: deciding catch-up
    on them would be early, which is why they are only a hint."""
    topic = f"freshkey.test-partitions.{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap=kafka_bootstrap, partitions=4)
    ensure_topics(settings, [topic])
    producer = ChangeProducer(settings)
    try:
        sentinels = SentinelRows(
            database="freshkey", table="heartbeat", namespace="hb", prefix="fk", partitions=4
        )
        keys = [message_key("freshkey", "heartbeat", {"id": row_id}) for row_id in sentinels.ids.values()]
        keys += [message_key("freshkey_demo", "assets", {"id": i}) for i in range(40)]
        for key in keys:
            before = producer.acked_ends(topic)
            producer.produce(topic, key, b"{}", lambda: None)
            assert producer.flush(10) == 0
            after = producer.acked_ends(topic)
            moved = [p for p, end in after.items() if end != before.get(p)]
            assert moved == [partition_of(key, 4)], key
        for i in range(3000):
            producer.produce(topic, message_key("d", "t", {"id": i}), b"x" * 50, lambda: None)
        assert producer.flush(30) == 0
        acknowledged = producer.acked_ends(topic)
    finally:
        producer.close(5)
    reported = high_watermarks(kafka_bootstrap, topic)
    assert sum(acknowledged.values()) == len(keys) + 3000
    assert all(reported[p] <= acknowledged[p] for p in acknowledged), (reported, acknowledged)
    if not os.environ.get("FRESHKEY_TEST_KAFKA"):  # the private test broker (Apache Kafka is exact)
        assert sum(reported.values()) < sum(acknowledged.values()), (reported, acknowledged)


def _heartbeat_cli(env_file: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "heartbeat", "--env-file", str(env_file), "--interval-ms", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.integration
def test_the_heartbeat_service_writes_with_the_grants_of_init_sql(
    mysql_service: MySQLService, tmp_path: Path
) -> None:
    """What the compose heartbeat service runs (``freshkey heartbeat``), as an account granted what
    deploy/mysql/init.sql grants the freshkey user on the heartbeat's database: it creates the table and
    beats; without that grant it stops at once and says what to grant."""
    tag = uuid.uuid4().hex[:8]
    database, user, password = f"freshkey_hb_{tag}", f"hb_{tag}", f"pw-{tag}"
    init = sql_statements((Path(__file__).resolve().parents[2] / "deploy/mysql/init.sql").read_text())
    grant = next(s for s in init if s.startswith("GRANT CREATE, INSERT, DELETE ON freshkey.* TO"))
    env_file = tmp_path / "heartbeat.env"
    demo.write_env_file(
        env_file,
        {
            "FRESHKEY_MYSQL_HOST": mysql_service.host,
            "FRESHKEY_MYSQL_PORT": str(mysql_service.port),
            "FRESHKEY_MYSQL_USER": user,
            "FRESHKEY_MYSQL_PASSWORD": password,
            "FRESHKEY_HEARTBEAT_DATABASE": database,
        },
    )
    admin = mysql_service.connect()
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
            cur.execute(f"GRANT SELECT ON *.* TO '{user}'@'%'")  # init.sql grants it with the replica's
        refused = _heartbeat_cli(env_file)
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 2, out
        assert f"cannot create the heartbeat table {database}.heartbeat as '{user}'" in out, out
        assert "grant CREATE, INSERT, DELETE on it" in out, out

        with admin.cursor() as cur:
            cur.execute(grant.replace("freshkey.*", f"`{database}`.*").replace("'freshkey'@", f"'{user}'@"))
        beating = _heartbeat_cli(env_file)
        try:
            deadline = time.monotonic() + 30
            beats = 0
            while beats < 3 and time.monotonic() < deadline and beating.poll() is None:
                with admin.cursor() as cur:
                    cur.execute(
                        "SELECT COUNT(*) FROM information_schema.tables "
                        "WHERE table_schema = %s AND table_name = 'heartbeat'",
                        (database,),
                    )
                    if cur.fetchone()[0]:
                        cur.execute(f"SELECT beat_at FROM `{database}`.heartbeat WHERE id = 1")
                        row = cur.fetchone()
                        beats += row is not None
                time.sleep(0.1)
        finally:
            beating.send_signal(signal.SIGTERM)
            out, _ = beating.communicate(timeout=30)
        assert beating.returncode == 0, out
        written = re.search(r"freshkey heartbeat: (\d+) beat\(s\), 0 failed write\(s\)", out)
        assert written and int(written[1]) >= 3, out
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()


@pytest.mark.integration
@pytest.mark.slow
def test_demo_drives_changes_and_accounts_for_every_one(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--changes", "600", "--rate", "400", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"dashboard, live while the demo runs: http://127\.0\.0\.1:\d+/dashboard", result.stdout)
    figures = orjson.loads(out.read_bytes())
    assert figures["changes"] == 600
    assert figures["stale"] == 0 and figures["missing"] == 0
    accounting = figures["accounting"]
    written = accounting["written"]
    assert written["driven"] == written["inserts"] + written["updates"] + written["deletes"] == 600
    assert written["heartbeats"] >= 1, "heartbeats are on by default"
    assert written["sentinels"] == figures["catch_up"]["partitions"] == 4
    assert accounting["adds_up"], accounting["problems"]
    assert accounting["seen"] == written["total"] == 600 + written["heartbeats"] + 4
    assert accounting["applied"] + accounting["superseded"] + accounting["not_newer"] == sum(
        accounting["by_op"].values()
    )
    assert figures["applied"] == accounting["applied"]
    assert "accounted for" in result.stdout and f"{written['total']} of {written['total']}" in result.stdout
    assert set(figures["lag_ms"]) == {"p50", "p99", "max"}
    assert 0 < figures["lag_ms"]["p50"] <= figures["lag_ms"]["p99"] <= figures["lag_ms"]["max"]
    assert figures["verify"]["versions_checked"] and figures["verify"]["checked"] > 0
    assert figures["machine"]["cpus"] >= 1 and "machine load (1 min)" in result.stdout
    assert figures["driver"]["target_per_s"] == 400
    if not figures["driver"]["held"]:
        assert "could not hold 400 changes/s" in result.stdout, result.stdout


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


def _all_gone(workdir: Path, timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while _processes_mentioning(str(workdir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _processes_mentioning(str(workdir))


@pytest.fixture
def default_metrics_ports_taken() -> Iterator[None]:
    """Something else listens on the default Prometheus ports (9464, 9465) while the test runs."""
    with ExitStack() as stack:
        for port in (9464, 9465):
            sock = stack.enter_context(closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)))
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
            except OSError:
                pass  # taken already, which is what the test wants
        yield


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
        return text


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("default_metrics_ports_taken")
def test_demo_serve_keeps_a_private_stack_up_until_interrupted(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [*DEMO, "--changes", "200", "--rate", "200", "--serve", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    output: list[str] = []
    try:
        deadline = time.monotonic() + 150
        for line in proc.stdout:
            output.append(line)
            if "change a row, then watch the dashboard" in line or time.monotonic() > deadline:
                break
        text = "".join(output)
        assert "The stack stays up" in text, text
        urls = dict(re.findall(r"^  (dashboard|worker metrics|connector metrics) +(http://\S+)", text, re.M))
        assert set(urls) == {"dashboard", "worker metrics", "connector metrics"}, text
        ports = {name: int(url.split(":")[2].split("/")[0]) for name, url in urls.items()}
        assert not {9464, 9465} & set(ports.values()), f"the demo took a default port: {ports}"
        assert "<title>freshkey" in _get(urls["dashboard"])
        for name in ("worker metrics", "connector metrics"):
            assert "# TYPE" in _get(urls[name]), f"{name} at {urls[name]} serves no Prometheus metrics"
        env_file = workdir / "freshkey.env"
        assert f"sla --env-file {env_file}" in text and f"verify --env-file {env_file}" in text, text
        cli = [sys.executable, "-m", "pipeline"]

        # The heartbeat prober runs again while serving: the SLA's heartbeat target has data.
        deadline = time.monotonic() + 30
        while True:
            sla = subprocess.run(
                [*cli, "sla", "--env-file", str(env_file), "--json", str(tmp_path / "sla.json")],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert sla.returncode in (0, 1), sla.stdout + sla.stderr
            targets = {t["name"]: t for t in json.loads((tmp_path / "sla.json").read_text())["targets"]}
            if targets["heartbeat"]["status"] != "no_data" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert targets["heartbeat"]["status"] in ("ok", "violated"), targets["heartbeat"]
        verify = subprocess.run(
            [*cli, "verify", "--env-file", str(env_file), "--json", str(tmp_path / "verify.json")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert json.loads((tmp_path / "verify.json").read_text())["stale"] == 0
        assert proc.poll() is None, "the demo stays up until interrupted"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, "".join(output) + rest
    assert "stopped: everything the demo started has been stopped." in rest, rest
    assert _all_gone(workdir) == [], "something the demo started is still running"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.integration
@pytest.mark.slow
def test_interrupting_the_demo_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "demo",
            "--changes",
            "100000",
            "--rate",
            "300",
            "--workdir",
            workdir,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    output = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        output.append(line)
        if "driving" in line or time.monotonic() > deadline:
            break
    assert any("driving" in line for line in output), "".join(output)
    assert _processes_mentioning(str(workdir)), "the services and the pipeline should be running now"
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(output) + rest
    assert "interrupted" in rest
    assert _all_gone(workdir) == [], "something the demo started is still running"
