"""The worker's Faust app gets the Kafka security settings as ``broker_credentials``, and Faust hands
them to aiokafka as configured (Faust's own mapping, ``credentials_to_aiokafka_auth``)."""

from __future__ import annotations

import ssl

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from connectors.kafka.settings import KafkaSettings
from pipeline.app import faust_credentials
from tests.support.certs import CertificateAuthority


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("ca"))


def test_plaintext_has_no_credentials() -> None:
    assert faust_credentials(KafkaSettings()) is None


def test_ssl(ca: CertificateAuthority) -> None:
    credentials = faust_credentials(KafkaSettings(security_protocol="SSL", ssl_cafile=ca.cert_path))
    assert isinstance(credentials, faust.SSLCredentials)
    auth = credentials_to_aiokafka_auth(credentials)
    assert auth["security_protocol"] == "SSL"
    assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(("protocol", "tls"), [("SASL_SSL", True), ("SASL_PLAINTEXT", False)])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl(ca: CertificateAuthority, protocol: str, tls: bool, mechanism: str) -> None:
    settings = KafkaSettings(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username="freshkey",
        sasl_password="s3cret-s3cret",
        ssl_cafile=ca.cert_path if tls else None,
    )
    credentials = faust_credentials(settings)
    assert isinstance(credentials, faust.SASLCredentials)
    assert "s3cret" not in repr(credentials)
    auth = credentials_to_aiokafka_auth(credentials)
    assert auth["security_protocol"] == protocol
    assert auth["sasl_mechanism"] == mechanism
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("freshkey", "s3cret-s3cret")
    assert (auth["ssl_context"] is not None) is tls
