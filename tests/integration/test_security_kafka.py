"""Kafka over TLS and SASL (PLAIN, SCRAM-SHA-512) with every Kafka client freshkey has.

The broker is Tansu behind the test broker's front (:mod:`pipeline.embedded.kafka_front`): Tansu 0.6.0
refuses ``--cert`` with ``--key`` and its ``--authentication`` accepts no mechanism, so the front does
TLS (a certificate made here) and the SASL login (users given here), and forwards to Tansu. The clients
speak real TLS and real SASL to it: confluent-kafka (the connector's admin client and producer, its
probe consumer, the worker's offset reader) and aiokafka (what Faust gives the worker's consumer and
producer). Settings: ``FRESHKEY_KAFKA_SECURITY_PROTOCOL``, ``_SASL_MECHANISM``, ``_SASL_USERNAME``,
``_SASL_PASSWORD``, ``_SSL_CAFILE``, ``_SSL_CHECK_HOSTNAME``. Each negative (a wrong password, another
CA, another host's certificate, no credentials) fails, and the connector's clients say which setting to
change.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from connectors.exceptions import ConfigurationError, ConnectorError
from connectors.kafka.producer import ChangeProducer
from connectors.kafka.security import aiokafka_options, librdkafka_config
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import end_offsets, prepare_topics, record_exists, topic_names
from connectors.tls import TlsVerificationError
from pipeline.embedded import LocalKafka, free_port
from pipeline.observe.broker import BrokerOffsets
from tests.support.certs import CertificateAuthority

pytestmark = pytest.mark.integration

USER, PASSWORD = "freshkey", "kafka-sasl-pa55word-91c2"


class _Brokers:
    def __init__(self, ca: CertificateAuthority, other: CertificateAuthority) -> None:
        self.ca, self.other = ca, other
        self.tls = LocalKafka(tls=ca.issue("kafka"))
        self.sasl_tls = LocalKafka(tls=ca.issue("kafka-sasl"), sasl_users={USER: PASSWORD})
        self.sasl_plain = LocalKafka(sasl_users={USER: PASSWORD})
        self.elsewhere = LocalKafka(tls=ca.issue("kafka-elsewhere", ("kafka.example.internal",)))
        self.all = [self.tls, self.sasl_tls, self.sasl_plain, self.elsewhere]

    def for_protocol(self, protocol: str) -> LocalKafka:
        return {"SSL": self.tls, "SASL_SSL": self.sasl_tls, "SASL_PLAINTEXT": self.sasl_plain}[protocol]

    def settings(self, protocol: str, mechanism: str | None = None, **overrides: Any) -> KafkaSettings:
        broker = self.for_protocol(protocol)
        values: dict[str, Any] = {
            "bootstrap": broker.bootstrap,
            "security_protocol": protocol,
            "partitions": 2,
        }
        if protocol.endswith("SSL"):
            values["ssl_cafile"] = self.ca.cert_path
        if mechanism is not None:
            values.update(sasl_mechanism=mechanism, sasl_username=USER, sasl_password=PASSWORD)
        tag = uuid.uuid4().hex[:8]
        values.update(change_topic=f"sec.changes.{tag}", dead_letter_topic=f"sec.dead.{tag}")
        return KafkaSettings(**{**values, **overrides})


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Brokers]:
    certs = tmp_path_factory.mktemp("kafka-certs")
    found = _Brokers(
        CertificateAuthority.create(certs / "ca"), CertificateAuthority.create(certs / "o", "other")
    )
    try:
        for broker in found.all:
            broker.start()
        yield found
    finally:
        for broker in found.all:
            broker.stop()


def _connector_round_trip(settings: KafkaSettings) -> None:
    """What the connector and the worker's offset reader do: create topics, produce and wait for the
    acknowledgement, read the end offsets, probe a record, read watermarks and committed offsets."""
    report = prepare_topics(settings, timeout_s=10)
    assert report.partitions[settings.change_topic] == 2
    producer = ChangeProducer(settings)
    acked: list[bool] = []
    producer.produce(settings.change_topic, b"row-1", b"value-1", lambda: acked.append(True))
    assert producer.close(15.0) == 0 and acked == [True]
    producer.raise_if_failed()
    [(partition, end)] = [(p, e) for p, e in producer.acked_ends(settings.change_topic).items()]
    assert end_offsets(settings, settings.change_topic, 2)[partition] >= 1
    assert record_exists(settings, settings.change_topic, partition, end - 1)
    assert settings.change_topic in topic_names(settings)
    offsets = BrokerOffsets(
        settings.bootstrap,
        group_id="sec-group",
        topic=settings.change_topic,
        config=librdkafka_config(settings),
    )
    try:
        figures = offsets.read()
    finally:
        offsets.close()
    assert sum(figures.highs.values()) >= 1


def _aiokafka_round_trip(settings: KafkaSettings) -> list[bytes]:
    """What Faust does for the worker (same aiokafka options): produce, then consume in a group."""

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(**aiokafka_options(settings))
        try:
            await producer.start()
            await producer.send_and_wait(settings.change_topic, b"value-2", key=b"row-2")
        finally:
            await producer.stop()  # also after a failed start: it holds a client
        consumer = AIOKafkaConsumer(
            settings.change_topic,
            group_id=f"sec-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
            **aiokafka_options(settings),
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            deadline = time.monotonic() + 20
            while len(values) < 2 and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(m.value or b"" for m in batch)
        finally:
            await consumer.stop()
        return sorted(values)

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        ("SSL", None),
        ("SASL_SSL", "SCRAM-SHA-512"),
        ("SASL_SSL", "PLAIN"),
        ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
        ("SASL_PLAINTEXT", "PLAIN"),
    ],
)
def test_every_client_connects(brokers: _Brokers, protocol: str, mechanism: str | None) -> None:
    settings = brokers.settings(protocol, mechanism)
    broker = brokers.for_protocol(protocol)
    logins_before = len(broker.front.logins) if broker.front else 0
    _connector_round_trip(settings)
    assert _aiokafka_round_trip(settings) == [b"value-1", b"value-2"]
    if mechanism is not None:
        assert broker.front is not None
        new = broker.front.logins[logins_before:]
        assert new and set(new) == {(USER, mechanism)}  # every connection logged in, as configured


@pytest.mark.parametrize(
    ("protocol", "mechanism"), [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN")]
)
def test_a_wrong_password_is_refused(brokers: _Brokers, protocol: str, mechanism: str) -> None:
    settings = brokers.settings(protocol, mechanism, sasl_password="not-the-password")
    with pytest.raises(ConfigurationError) as raised:
        prepare_topics(settings, timeout_s=5)
    message = str(raised.value)
    assert f"refused the login of user '{USER}' ({mechanism})" in message
    assert "FRESHKEY_KAFKA_SASL_PASSWORD" in message and "not-the-password" not in message
    with pytest.raises(KafkaConnectionError):
        _aiokafka_round_trip(settings)


def test_no_credentials_get_no_answer(brokers: _Brokers) -> None:
    """A client without SASL at a SASL listener: the broker closes every connection."""
    settings = brokers.settings("SASL_PLAINTEXT", None, security_protocol="PLAINTEXT")
    with pytest.raises(ConnectorError):
        prepare_topics(settings, timeout_s=3)


def test_another_ca_names_the_ca_setting(brokers: _Brokers) -> None:
    settings = brokers.settings("SASL_SSL", "SCRAM-SHA-512", ssl_cafile=brokers.other.cert_path)
    with pytest.raises(TlsVerificationError) as raised:
        prepare_topics(settings, timeout_s=5)
    assert f"FRESHKEY_KAFKA_SSL_CAFILE={brokers.other.cert_path}" in str(raised.value)
    assert "unable to get local issuer certificate" in str(raised.value)
    with pytest.raises(KafkaConnectionError):
        _aiokafka_round_trip(settings)


def test_another_hosts_certificate(brokers: _Brokers) -> None:
    """A certificate for kafka.example.internal at 127.0.0.1: refused, naming the host check; accepted
    with FRESHKEY_KAFKA_SSL_CHECK_HOSTNAME=false (the CA is still checked)."""
    settings = brokers.settings("SSL", bootstrap=brokers.elsewhere.bootstrap)
    with pytest.raises(TlsVerificationError) as raised:
        prepare_topics(settings, timeout_s=5)
    assert "is not for the name freshkey connects to" in str(raised.value)
    assert "FRESHKEY_KAFKA_SSL_CHECK_HOSTNAME=false" in str(raised.value)
    with pytest.raises(KafkaConnectionError):
        _aiokafka_round_trip(settings)
    unchecked = brokers.settings("SSL", bootstrap=brokers.elsewhere.bootstrap, ssl_check_hostname=False)
    _connector_round_trip(unchecked)
    assert _aiokafka_round_trip(unchecked) == [b"value-1", b"value-2"]


def test_the_worker_stops_on_a_wrong_password(brokers: _Brokers, tmp_path: Path) -> None:
    """``freshkey worker`` with a wrong FRESHKEY_KAFKA_SASL_PASSWORD exits 2 at once, naming the setting
    and not the password (its Redis is away, which it would wait for: the Kafka check decides)."""
    settings = brokers.settings("SASL_SSL", "SCRAM-SHA-512")
    bindings = tmp_path / "bindings.yaml"
    bindings.write_text("bindings:\n  - table: db.t\n    namespace: ns\n    value_columns: [v]\n")
    env = {
        **os.environ,
        "FRESHKEY_KAFKA_BOOTSTRAP": settings.bootstrap,
        "FRESHKEY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FRESHKEY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "FRESHKEY_KAFKA_SASL_USERNAME": USER,
        "FRESHKEY_KAFKA_SASL_PASSWORD": "not-the-password",
        "FRESHKEY_KAFKA_SSL_CAFILE": str(brokers.ca.cert_path),
        "FRESHKEY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "FRESHKEY_BINDINGS": str(bindings),
        "FRESHKEY_WORKER_DATA_DIR": str(tmp_path / "worker"),
        "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),  # not the default 9464
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"refused the login of user '{USER}' (SCRAM-SHA-512)" in output, output
    assert "FRESHKEY_KAFKA_SASL_PASSWORD" in output and "not-the-password" not in output
