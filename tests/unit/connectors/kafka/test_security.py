"""The Kafka security settings and their mapping into every client's configuration.

Tansu 0.6.0 (the test broker) has no working SASL (``--authentication`` answers every mechanism with
NoSharedMechanism and users cannot be created): SASL is tested here, as what each client is configured
with, and the clients are built with it (librdkafka and aiokafka check their configuration when
built). TLS is tested end to end in tests/integration/test_security_kafka.py.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from connectors.exceptions import ConfigurationError
from connectors.kafka.security import (
    HideSaslPayloads,
    SecurityErrors,
    aiokafka_options,
    librdkafka_config,
    security_failure,
)
from connectors.kafka.settings import KafkaSettings
from connectors.tls import TlsVerificationError
from tests.support.certs import CertificateAuthority

SECRET = "kafka-pa55word-never-shown"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("ca"))


def _sasl_ssl(ca: CertificateAuthority, **extra: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap="broker-1:9093,broker-2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="freshkey",
        sasl_password=SECRET,
        ssl_cafile=ca.cert_path,
        **extra,  # type: ignore[arg-type]
    )


def _plain_sasl() -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u", sasl_password="p"
    )


def test_plaintext_is_the_default_and_maps_to_nothing_more() -> None:
    settings = KafkaSettings(bootstrap="b:9092")
    assert librdkafka_config(settings) == {"bootstrap.servers": "b:9092", "security.protocol": "plaintext"}
    assert aiokafka_options(settings) == {"bootstrap_servers": "b:9092", "security_protocol": "PLAINTEXT"}


def test_sasl_ssl_scram_maps_into_librdkafka(ca: CertificateAuthority) -> None:
    config = librdkafka_config(_sasl_ssl(ca))
    assert config == {
        "bootstrap.servers": "broker-1:9093,broker-2:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "freshkey",
        "sasl.password": SECRET,
        "ssl.ca.location": str(ca.cert_path),
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_sasl_ssl_scram_maps_into_aiokafka(ca: CertificateAuthority) -> None:
    options = aiokafka_options(_sasl_ssl(ca))
    context = options.pop("ssl_context")
    assert options == {
        "bootstrap_servers": "broker-1:9093,broker-2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "freshkey",
        "sasl_plain_password": SECRET,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_each_mechanism(mechanism: str) -> None:
    settings = KafkaSettings(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="u", sasl_password=SECRET
    )
    config = librdkafka_config(settings)
    assert config["security.protocol"] == "sasl_plaintext"
    assert config["sasl.mechanism"] == mechanism
    assert "ssl.ca.location" not in config
    options = aiokafka_options(settings)
    assert options["sasl_mechanism"] == mechanism
    assert "ssl_context" not in options


def test_ssl_with_client_certificate_and_without_hostname_check(ca: CertificateAuthority) -> None:
    client = ca.issue("client", ("freshkey-connector",), client=True)
    settings = KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=client.ca,
        ssl_certfile=client.cert,
        ssl_keyfile=client.key,
        ssl_check_hostname=False,
    )
    config = librdkafka_config(settings)
    assert config["security.protocol"] == "ssl"
    assert config["ssl.certificate.location"] == str(client.cert)
    assert config["ssl.key.location"] == str(client.key)
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    context = aiokafka_options(settings)["ssl_context"]
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED  # the CA is still checked


def test_spellings_are_normalised() -> None:
    settings = KafkaSettings(
        security_protocol="sasl-ssl", sasl_mechanism="scram_sha_256", sasl_username="u", sasl_password="p"
    )
    assert settings.security_protocol == "SASL_SSL"
    assert settings.sasl_mechanism == "SCRAM-SHA-256"


def test_librdkafka_accepts_every_mapped_property(ca: CertificateAuthority) -> None:
    """Each confluent-kafka client freshkey builds takes the mapping (unknown or unsupported properties,
    such as a mechanism this librdkafka lacks, fail at construction)."""
    for settings in (
        _sasl_ssl(ca),
        _plain_sasl(),
        KafkaSettings(security_protocol="SSL", ssl_cafile=ca.cert_path, ssl_check_hostname=False),
    ):
        config = librdkafka_config(settings)
        Producer({**config, "enable.idempotence": True}).flush(0)
        AdminClient(config)
        Consumer({**config, "group.id": "freshkey-test"}).close()


def test_aiokafka_accepts_every_mapped_option(ca: CertificateAuthority) -> None:
    async def build() -> None:
        for settings in (
            _sasl_ssl(ca),
            KafkaSettings(
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="PLAIN",
                sasl_username="u",
                sasl_password="p",
            ),
            KafkaSettings(security_protocol="SSL", ssl_cafile=ca.cert_path),
        ):
            producer = AIOKafkaProducer(**aiokafka_options(settings))
            await producer.stop()
            consumer = AIOKafkaConsumer(**aiokafka_options(settings))
            await consumer.stop()

    asyncio.run(build())


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs FRESHKEY_KAFKA_SASL_MECHANISM"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
            "FRESHKEY_KAFKA_SASL_PASSWORD",
        ),
        ({"sasl_username": "u", "sasl_password": SECRET}, "SASL_SSL (or SASL_PLAINTEXT)"),
        ({"ssl_cafile": "/etc/hostname"}, "FRESHKEY_KAFKA_SECURITY_PROTOCOL=SSL (or SASL_SSL)"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "FRESHKEY_KAFKA_SSL_CAFILE"),
        ({"security_protocol": "SSL", "ssl_certfile": "/etc/hostname"}, "set both or neither"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
    ],
)
def test_inconsistent_settings_say_what_to_change(values: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as raised:
        KafkaSettings(**values)  # type: ignore[arg-type]
    assert says in str(raised.value)


def test_the_password_is_never_printed(ca: CertificateAuthority) -> None:
    settings = _sasl_ssl(ca)
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)
    with pytest.raises(ValidationError) as raised:  # an error about another field shows no input
        KafkaSettings(security_protocol="SSL", sasl_password=SECRET)
    assert SECRET not in str(raised.value)


def test_security_failures_name_the_setting(ca: CertificateAuthority) -> None:
    settings = _sasl_ssl(ca)
    verify = KafkaError(
        KafkaError._SSL,
        "ssl://broker-1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
        "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
        "configured or root CA certificates are installed (install ca-certificates package)",
    )
    failure = security_failure(settings, verify)
    assert isinstance(failure, TlsVerificationError)
    assert f"FRESHKEY_KAFKA_SSL_CAFILE={ca.cert_path}" in str(failure)
    assert "broker certificate could not be verified" in str(failure)

    login = KafkaError(
        KafkaError._AUTHENTICATION,
        "SASL authentication error: Authentication failed during authentication due to invalid credentials "
        "with SASL mechanism SCRAM-SHA-512",
    )
    failure = security_failure(settings, login)
    assert isinstance(failure, ConfigurationError)
    assert "user 'freshkey' (SCRAM-SHA-512)" in str(failure)
    assert "FRESHKEY_KAFKA_SASL_PASSWORD" in str(failure)
    assert SECRET not in str(failure)

    away = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#10.0.0.1:9093 failed: Connection refused")
    assert security_failure(settings, away) is None

    errors = SecurityErrors(settings)
    errors(away)
    assert errors.failure is None
    errors(login)
    errors(verify)
    assert errors.failure is not None and "refused the login" in str(errors.failure)  # the first one


def test_aiokafka_debug_lines_keep_the_login_out() -> None:
    """aiokafka logs each request at DEBUG with its fields: a PLAIN login carries the password in
    clear. Without the filter the line shows it; with it, a placeholder."""
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1

    request = SaslAuthenticateRequest_v1(b"\x00freshkey\x00" + SECRET.encode())  # what aiokafka logs

    def line(filtered: bool) -> str:
        record = logging.LogRecord(
            "aiokafka.conn", logging.DEBUG, __file__, 1, "Request %d: %s", (3, request), None
        )
        if filtered:
            assert HideSaslPayloads().filter(record)
        return record.getMessage()

    assert SECRET in line(filtered=False)
    assert SECRET not in line(filtered=True) and HideSaslPayloads.HIDDEN in line(filtered=True)
    aiokafka_options(_plain_sasl())  # installs it on aiokafka's logger
    assert any(isinstance(f, HideSaslPayloads) for f in logging.getLogger("aiokafka.conn").filters)
