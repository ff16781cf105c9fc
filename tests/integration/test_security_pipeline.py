"""The whole pipeline with every connection secured, every secret set, and the worker's HTTP surface.

Servers started here with certificates made here: MariaDB with TLS (``--ssl-cert/--ssl-key/--ssl-ca``)
and an account ``REQUIRE SSL``; the Kafka broker behind its TLS + SASL front (SCRAM and PLAIN users:
the connector logs in with SCRAM-SHA-512, the worker with PLAIN, the mechanism whose password travels in
clear inside the TLS); Redis TLS-only with an ACL user and the default user off. The connector (binlog
over TLS, producer over SASL_SSL) and the worker (aiokafka over SASL_SSL, Redis over TLS as the ACL user)
run as processes at DEBUG, with a web token.

Checked: the changes reach Redis; ``/freshkey/health`` answers without the token, everything else is 401
without it; Faust's own pages are 404; ``/freshkey/verify`` hides row values; a browser logs in once and
the dashboard shows the worker's figures; and no secret (the MySQL, Kafka, Redis and key passwords, the
token) appears in either process's log, in ``--help``, or in any HTTP answer.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from cache_writer.layout import entry_key, latest_verification_key
from cache_writer.redis.security import client_kwargs
from cache_writer.settings import RedisSettings
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, free_port, preexec_die_with_parent
from tests.support.browser import CHROMIUM_ARGS, chromium, playwright_or_fail, watch_console
from tests.support.certs import CertificateAuthority

pytestmark = pytest.mark.integration

MYSQL_PASSWORD = "mysql-secret-6d1f0a"
KAFKA_PASSWORD = "kafka-secret-93be27"
WORKER_KAFKA_PASSWORD = "kafka-plain-secret-4c8d"
REDIS_PASSWORD = "redis-secret-2a7c55"
KEY_PASSWORD = "key-secret-e41b09"
TOKEN = "web-token-secret-0f5a9c7e3d"
SECRETS = (MYSQL_PASSWORD, KAFKA_PASSWORD, WORKER_KAFKA_PASSWORD, REDIS_PASSWORD, KEY_PASSWORD, TOKEN)


@dataclass
class _Stack:
    workdir: Path
    db: LocalMariaDB
    cache: LocalRedis
    kafka: LocalKafka
    env: dict[str, str]
    database: str
    namespace: str
    prefix: str
    web_port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    answers: list[bytes] = field(default_factory=list)
    """Every HTTP answer (status line, headers, body) the test got from the worker."""

    def redis_settings(self) -> RedisSettings:
        return RedisSettings(
            url=self.env["FRESHKEY_REDIS_URL"],
            password=REDIS_PASSWORD,
            ssl_ca=self.env["FRESHKEY_REDIS_SSL_CA"],
        )

    def start(self, name: str, worker_env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "pipeline", name, "--log-level", "debug"],
            env={**self.env, **(worker_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(),
        )
        log.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-6000:]}" for p in self.workdir.glob("*.log")
        )

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{name} exited with {proc.returncode} while waiting for {what}\n{self.logs()}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.1)

    def http(self, path: str, *, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request to the worker, redirects not followed; the answer is recorded."""
        conn = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=5)
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        head = "\n".join(f"{k}: {v}" for k, v in response.getheaders())
        self.answers.append(f"{response.status}\n{head}\n\n".encode() + data)
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def bearer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return self.http(path, headers={"Authorization": f"Bearer {TOKEN}"})


def _encrypted_client_key(ca: CertificateAuthority) -> tuple[Path, Path]:
    """A client certificate whose key is encrypted with KEY_PASSWORD (FRESHKEY_KAFKA_SSL_KEY_PASSWORD)."""
    files = ca.issue("kafka-client", ("freshkey-client",), client=True)
    key = load_pem_private_key(files.key.read_bytes(), password=None)
    encrypted = files.key.with_name("kafka-client.encrypted.key")
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    return files.cert, encrypted


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[_Stack]:
    ca = CertificateAuthority.create(tmp_path / "certs")
    db = LocalMariaDB(tls=ca.issue("mariadb"))
    cache = LocalRedis(tls=ca.issue("redis"), users={"freshkey": REDIS_PASSWORD})
    kafka = LocalKafka(
        tls=ca.issue("kafka"), sasl_users={"connector": KAFKA_PASSWORD, "worker": WORKER_KAFKA_PASSWORD}
    )
    services = [db, cache, kafka]
    found: _Stack | None = None
    try:
        for service in services:
            service.start()
        tag = uuid.uuid4().hex[:8]
        database, namespace, prefix = f"secure_{tag}", f"assets_{tag}", f"s{tag}"
        admin = db.connect(admin=True)
        with admin.cursor() as cur:
            for host in ("127.0.0.1", "localhost"):
                account = f"'fk_secure'@'{host}'"
                cur.execute(f"CREATE USER {account} IDENTIFIED BY %s REQUIRE SSL", (MYSQL_PASSWORD,))
                cur.execute(f"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {account}")
            cur.execute(f"CREATE DATABASE {database}")
            cur.execute(
                f"CREATE TABLE {database}.assets (id INT PRIMARY KEY, content TEXT NOT NULL, "
                "updated_at DATETIME(6) NOT NULL)"
            )
        admin.close()
        bindings = tmp_path / "bindings.yaml"
        bindings.write_text(
            f"bindings:\n  - table: {database}.assets\n    namespace: {namespace}\n"
            "    value_columns: [content, updated_at]\n"
        )
        cert, key = _encrypted_client_key(ca)
        web_port = free_port()
        env = {
            **os.environ,
            "FRESHKEY_MYSQL_HOST": "127.0.0.1",
            "FRESHKEY_MYSQL_PORT": str(db.port),
            "FRESHKEY_MYSQL_USER": "fk_secure",
            "FRESHKEY_MYSQL_PASSWORD": MYSQL_PASSWORD,
            "FRESHKEY_MYSQL_SSL_CA": str(ca.cert_path),  # verify-identity
            "FRESHKEY_MYSQL_SERVER_ID": str(20_000 + int(tag[:3], 16)),
            "FRESHKEY_KAFKA_BOOTSTRAP": kafka.bootstrap,
            "FRESHKEY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "FRESHKEY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "FRESHKEY_KAFKA_SASL_USERNAME": "connector",
            "FRESHKEY_KAFKA_SASL_PASSWORD": KAFKA_PASSWORD,
            "FRESHKEY_KAFKA_SSL_CAFILE": str(ca.cert_path),
            "FRESHKEY_KAFKA_SSL_CERTFILE": str(cert),
            "FRESHKEY_KAFKA_SSL_KEYFILE": str(key),
            "FRESHKEY_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD,
            "FRESHKEY_KAFKA_PARTITIONS": "2",
            "FRESHKEY_KAFKA_CHANGE_TOPIC": f"sec.changes.{tag}",
            "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": f"sec.dead.{tag}",
            "FRESHKEY_KAFKA_MODEL_UPDATE_TOPIC": f"sec.models.{tag}",
            "FRESHKEY_KAFKA_HOTNESS_TOPIC": f"sec.hotness.{tag}",
            "FRESHKEY_REDIS_URL": cache.url_for("freshkey"),
            "FRESHKEY_REDIS_PASSWORD": REDIS_PASSWORD,
            "FRESHKEY_REDIS_SSL_CA": str(ca.cert_path),
            "FRESHKEY_REDIS_KEY_PREFIX": prefix,
            "FRESHKEY_BINDINGS": str(bindings),
            "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(tmp_path / "checkpoint.json"),
            "FRESHKEY_WORKER_APP_ID": f"sec-{tag}",
            "FRESHKEY_WORKER_DATA_DIR": str(tmp_path / "worker"),
            "FRESHKEY_WORKER_WEB_PORT": str(web_port),
            "FRESHKEY_WORKER_WEB_TOKEN": TOKEN,
            "FRESHKEY_WORKER_DEVICE": "cpu",
            "FRESHKEY_WORKER_SESSION_TIMEOUT_S": "6",
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(free_port()),
        }
        found = _Stack(tmp_path, db, cache, kafka, env, database, namespace, prefix, web_port)
        yield found
    finally:
        for proc in found.procs.values() if found is not None else []:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for service in reversed(services):
            service.stop()


def _applied(stats: dict[str, object]) -> int:
    """Entries applied in every tier, as the dashboard's "applied" tile sums them (outcomes ``*:applied``)."""
    outcomes = stats["outcomes"]
    assert isinstance(outcomes, dict)
    return sum(int(n) for key, n in outcomes.items() if key.rsplit(":", 1)[-1] == "applied")


def _health(s: _Stack) -> bool:
    try:
        status, _, _ = s.http("/freshkey/health")
    except OSError:
        return False
    return status == 200


def test_a_secured_pipeline_applies_changes_and_keeps_its_secrets(stack: _Stack) -> None:
    s = stack
    s.start("connector")
    worker_kafka = {  # the worker logs in with PLAIN: its password travels in clear inside the TLS
        "FRESHKEY_KAFKA_SASL_MECHANISM": "PLAIN",
        "FRESHKEY_KAFKA_SASL_USERNAME": "worker",
        "FRESHKEY_KAFKA_SASL_PASSWORD": WORKER_KAFKA_PASSWORD,
    }
    s.start("worker", worker_kafka)
    s.wait(lambda: _health(s), 120, "the worker's /freshkey/health to answer 200")

    admin = s.db.connect(admin=True)
    with admin.cursor() as cur:
        for row in range(1, 6):
            cur.execute(
                f"INSERT INTO {s.database}.assets VALUES (%s, %s, UTC_TIMESTAMP(6))", (row, f"caption {row}")
            )
        cur.execute(f"UPDATE {s.database}.assets SET content = 'edited' WHERE id = 2")
    admin.close()
    cache = redis.Redis.from_url(s.redis_settings().url, **client_kwargs(s.redis_settings()))
    keys = [entry_key(s.prefix, s.namespace, [row]) for row in range(1, 6)]

    def applied() -> bool:
        values = [cache.hget(key, "d") for key in keys]  # the value columns (README, "Redis layout")
        return all(values) and b"edited" in (values[1] or b"")

    s.wait(applied, 90, "the changes in Redis (binlog over TLS -> SASL_SSL -> worker -> Redis over TLS)")
    assert s.kafka.front is not None
    assert {user for user, _ in s.kafka.front.logins} == {"connector", "worker"}
    assert ("worker", "PLAIN") in s.kafka.front.logins
    assert ("connector", "SCRAM-SHA-512") in s.kafka.front.logins

    # --- the HTTP surface ---------------------------------------------------------------------------
    status, _, body = s.http("/freshkey/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["consuming"] is True
    assert health["tiers"] == {"redis": "ok"}
    for path in (
        "/freshkey/stats",
        "/freshkey/sla",
        "/freshkey/consumer-lag",
        "/freshkey/verify",
        "/dashboard",
    ):
        status, headers, _ = s.http(path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
    status, _, body = s.bearer("/freshkey/stats")
    assert status == 200 and _applied(json.loads(body)) >= 5  # the update may supersede its insert
    for path in ("/router/", "/table/", "/graph/", "/assignment/", "/performance/"):
        assert s.bearer(path)[0] == 404, f"Faust's {path} is served"
    status, headers, _ = s.http("/dashboard", headers={"Accept": "text/html"})
    assert status == 303 and headers["location"].startswith("/freshkey/login")

    verification = {
        "reports": [
            {
                "namespace": s.namespace,
                "examples": [f"stale: {keys[0]}: value b'caption 1 (a row value)' != database b'caption 0'"],
            }
        ]
    }
    cache.set(latest_verification_key(s.prefix), orjson.dumps(verification))
    status, _, body = s.bearer("/freshkey/verify")
    assert status == 200
    [example] = json.loads(body)["reports"][0]["examples"]
    assert example == f"stale: {keys[0]}: value <hidden> != database <hidden>"

    _browser_logs_in(s)

    # --- no secret anywhere ---------------------------------------------------------------------------
    helps = [
        subprocess.run(
            [sys.executable, "-m", "pipeline", *command, "--help"],
            env=s.env,
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout
        for command in ([], ["connector"], ["worker"], ["verify"], ["doctor"])
    ]
    cache.close()
    for proc in s.procs.values():
        proc.terminate()
        proc.wait(30)
    logs = {p.name: p.read_bytes() for p in s.workdir.glob("*.log")}
    assert set(logs) == {"connector.log", "worker.log"}
    # Something to look through: the worker at DEBUG logs every Kafka request (megabytes); the connector
    # logs little even at DEBUG (librdkafka's own debug is off), but its run from start to the changes.
    assert len(logs["worker.log"]) > 100_000, len(logs["worker.log"])
    # rich wraps long lines at the console's width: compare with the whitespace folded. The start and
    # the end of its session are always logged (a progress line comes only every few seconds).
    connector_text = b" ".join(logs["connector.log"].split())
    assert b"connector reading" in connector_text, connector_text[-3000:]
    assert b"session ended at checkpoint" in connector_text, connector_text[-3000:]
    for secret in SECRETS:
        for name, text in logs.items():
            assert secret.encode() not in text, f"{name} holds a secret"
        for text in helps:
            assert secret.encode() not in text, "--help shows a secret"
        for answer in s.answers:
            assert secret.encode() not in answer, f"an HTTP answer holds a secret: {answer[:200]!r}"
    assert b"SASL payload hidden" in logs["worker.log"]  # aiokafka logged the PLAIN login, filtered


def _browser_logs_in(s: _Stack) -> None:
    """Chromium (tests/support/browser.py): /dashboard sends it to the login form; the token typed there
    gives a session cookie; the dashboard's own requests then succeed, nothing errs in the console, and
    it shows the applied count of /freshkey/stats."""
    sync_playwright = playwright_or_fail()
    statuses: list[tuple[int, str]] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("response", lambda r: statuses.append((r.status, r.url)))
            page.goto(f"http://127.0.0.1:{s.web_port}/dashboard")
            assert "/freshkey/login" in page.url
            watch_console(page, problems)  # from the login on: the redirect before it logs nothing
            page.fill("input[name=token]", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_url(f"http://127.0.0.1:{s.web_port}/dashboard", timeout=15_000)
            applied = page.locator("#t-applied")
            page.wait_for_function(
                "() => /^[0-9]/.test(document.querySelector('#t-applied').textContent)", timeout=20_000
            )
            shown = int(applied.text_content().replace(",", ""))  # type: ignore[union-attr]
            cookies = page.context.cookies()
        finally:
            browser.close()
    assert shown >= 5
    stats = json.loads(s.bearer("/freshkey/stats")[2])
    assert shown <= _applied(stats)
    [cookie] = [c for c in cookies if c["name"] == "freshkey_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != TOKEN
    after_login = [status for status, url in statuses if "/freshkey/" in url and "/login" not in url]
    assert after_login and all(status in (200, 404) for status in after_login), statuses
    assert not problems, problems
