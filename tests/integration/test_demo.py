"""``freshkey demo`` end to end: its own private services, a driven workload, a verified cache.

Every test here runs on real services (the service-free parts are in tests/unit/pipeline/test_demo.py):
every change accounted for, catch-up decided by sentinel rows (the broker's watermarks shown to be
early), ``--serve`` keeping a private stack up until Ctrl-C, and an interrupt stopping everything the
demo started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
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
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import ensure_topics
from pipeline.config import load_settings
from pipeline.demo import stack as demo
from pipeline.demo.catchup import SentinelRows, high_watermarks, partition_of
from pipeline.settings import WorkerSettings
from schemas import message_key
from tests.support.compose import sql_statements
from tests.support.demo import DEMO, SERVING, start_demo
from tests.support.processes import left_running, processes_mentioning
from tests.support.services import MySQLService


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
        [*DEMO, "--changes", "600", "--rate", "400", "--json", str(out)],
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
    proc, text = start_demo(
        ["--changes", "200", "--rate", "200", "--serve", "--workdir", str(workdir)], until=SERVING
    )
    try:
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
        # Tansu holds the first join for half the session timeout: the demo's worker uses 2 s (1 s held).
        assert load_settings(WorkerSettings, env_file).session_timeout_s == 2
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
    assert proc.returncode == 0, text + rest
    assert "stopped: everything the demo started has been stopped." in rest, rest
    assert left_running(workdir) == [], "something the demo started is still running"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.integration
@pytest.mark.slow
def test_interrupting_the_demo_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    workdir = tmp_path / "demo"
    proc, output = start_demo(
        ["--changes", "100000", "--rate", "300", "--workdir", str(workdir)], "driving", 120
    )
    assert "driving" in output, output
    assert processes_mentioning(str(workdir)), "the services and the pipeline should be running now"
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output + rest
    assert "interrupted" in rest
    assert left_running(workdir) == [], "something the demo started is still running"
