"""The embedded-service launcher: real servers, real round trips, nothing left running afterwards."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pymysql
import pytest

from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, ServiceStartError
from tests.support.processes import gone

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- MariaDB -------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_mariadb_round_trip_binlog_and_connector_account() -> None:
    db = LocalMariaDB().start()
    try:
        pid, workdir = db.pid, db.workdir
        assert pid is not None
        assert workdir.is_dir()

        admin = db.connect(admin=True)
        try:
            with admin.cursor() as cur:
                cur.execute("CREATE DATABASE freshkey_test")
                cur.execute("CREATE TABLE freshkey_test.items (id INT PRIMARY KEY, name VARCHAR(40))")
                cur.execute("INSERT INTO freshkey_test.items VALUES (1, 'one'), (2, 'two')")
                cur.execute("SELECT id, name FROM freshkey_test.items ORDER BY id")
                assert cur.fetchall() == ((1, "one"), (2, "two"))
        finally:
            admin.close()

        conn = db.connect(admin=False)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT CURRENT_USER()")
                assert cur.fetchone() == ("freshkey@127.0.0.1",)
                cur.execute("SHOW MASTER STATUS")
                status = cur.fetchone()
                assert status is not None
                assert str(status[0]).startswith("binlog.")
                assert int(status[1]) > 4
                cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
                assert cur.fetchone() == (1, "ROW", "FULL", "FULL")
                cur.execute("SHOW GLOBAL VARIABLES LIKE 'log_bin'")
                assert cur.fetchone() == ("log_bin", "ON")
                # The connector account reads but cannot write.
                cur.execute("SELECT COUNT(*) FROM freshkey_test.items")
                assert cur.fetchone() == (2,)
                with pytest.raises(pymysql.err.OperationalError) as denied:
                    cur.execute("INSERT INTO freshkey_test.items VALUES (3, 'three')")
                assert denied.value.args[0] == 1142  # ER_TABLEACCESS_DENIED_ERROR
        finally:
            conn.close()
    finally:
        db.stop()

    assert gone(pid), f"process {pid} still exists"
    assert not workdir.exists()
    assert db.pid is None
    db.stop()  # a second stop is harmless


@pytest.mark.integration
def test_mariadb_keeps_a_workdir_it_was_given(tmp_path: Path) -> None:
    workdir = tmp_path / "db"
    with LocalMariaDB(workdir=workdir) as db:
        pid = db.pid
        assert pid is not None
        assert (workdir / "data" / "binlog.index").is_file()
    assert gone(pid), f"process {pid} still exists"
    assert (workdir / "data").is_dir()


# --- Redis ---------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_redis_round_trip() -> None:
    import redis

    with LocalRedis() as server:
        pid, workdir = server.pid, server.workdir
        assert pid is not None
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        try:
            assert client.set("freshkey:probe", b"value")
            assert client.get("freshkey:probe") == b"value"
            assert client.config_get("save") == {"save": ""}
        finally:
            client.close()
    assert gone(pid), f"process {pid} still exists"
    assert not workdir.exists()


@pytest.mark.integration
def test_redis_on_a_taken_port_raises_with_log_tail_and_leaves_nothing() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = LocalRedis(port=port)
        with pytest.raises(ServiceStartError, match=r"redis\.log"):
            server.start()
    assert server.pid is None
    assert not server.running


@pytest.mark.integration
@pytest.mark.parametrize("cls", [LocalMariaDB, LocalRedis, LocalKafka])
def test_second_server_on_a_taken_port_fails_instead_of_using_the_first(
    cls: type[LocalMariaDB] | type[LocalRedis] | type[LocalKafka],
) -> None:
    with cls() as first:
        second = cls(port=first.port)
        with pytest.raises(ServiceStartError, match="exited with status"):
            second.start()
        assert second.pid is None
        assert first.running


# --- Kafka (Tansu) -------------------------------------------------------------------------------------


async def _consume_one(bootstrap: str, topic: str) -> tuple[bytes | None, bytes | None]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
        return record.key, record.value
    finally:
        await consumer.stop()


@pytest.mark.integration
def test_kafka_topic_produce_consume() -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"freshkey-test-{uuid.uuid4().hex[:8]}"
    with LocalKafka() as broker:
        pid, workdir = broker.pid, broker.workdir
        assert pid is not None
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        futures = admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        futures[topic].result(timeout=30)
        metadata = admin.list_topics(topic=topic, timeout=10)
        assert len(metadata.topics[topic].partitions) == 3

        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        delivered: list[str | None] = []
        producer.produce(
            topic,
            key=b"k1",
            value=b"hello",
            on_delivery=lambda err, _msg: delivered.append(None if err is None else str(err)),
        )
        assert producer.flush(30) == 0
        assert delivered == [None]

        assert asyncio.run(_consume_one(broker.bootstrap, topic)) == (b"k1", b"hello")
    assert gone(pid), f"process {pid} still exists"
    assert not workdir.exists()


# --- no orphans ----------------------------------------------------------------------------------------

_CHILD_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pipeline.embedded import LocalKafka, LocalRedis
    redis_server = LocalRedis().start()
    kafka = LocalKafka().start()
    print(redis_server.pid, kafka.pid, redis_server.workdir, kafka.workdir, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
    # "exit": leave without calling stop(); the atexit handler must clean up.
    """
)


def _run_child(mode: str) -> tuple[subprocess.Popen[str], list[int], list[Path]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD_SCRIPT, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 4:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"child did not start its services: {err}")
    return proc, [int(line[0]), int(line[1])], [Path(line[2]), Path(line[3])]


@pytest.mark.integration
def test_atexit_stops_services_the_caller_forgot() -> None:
    proc, pids, workdirs = _run_child("exit")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for pid in pids:
        assert gone(pid), f"process {pid} still exists"
    for workdir in workdirs:
        assert not workdir.exists()


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkill_of_the_parent_takes_the_servers_down() -> None:
    proc, pids, workdirs = _run_child("hang")
    for pid in pids:
        os.kill(pid, 0)  # running
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # The servers were children of the killed process: init reaps them once the kernel kills them.
    for pid in pids:
        assert gone(pid, within=10.0), f"process {pid} still exists"
    for workdir in workdirs:  # nobody was left to remove them
        shutil.rmtree(workdir, ignore_errors=True)
