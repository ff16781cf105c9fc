"""Kafka security settings in each client's own terms: the one place that maps them.

``FRESHKEY_KAFKA_SECURITY_PROTOCOL`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``_SASL_MECHANISM``
(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), ``_SASL_USERNAME``, ``_SASL_PASSWORD``, ``_SSL_CAFILE``,
``_SSL_CERTFILE``, ``_SSL_KEYFILE``, ``_SSL_KEY_PASSWORD`` and ``_SSL_CHECK_HOSTNAME``
(:class:`~connectors.kafka.settings.KafkaSettings`) become:

- :func:`librdkafka_config`: confluent-kafka's configuration (the connector's producer, every admin
  client, the worker's offset reader, ``freshkey model publish``);
- :func:`aiokafka_options`: aiokafka's keyword arguments (what Faust hands the worker's consumer and
  producer, see ``pipeline.app``; the test helpers);
- :class:`SecurityErrors`: a librdkafka ``error_cb`` that keeps a certificate or login failure, so that
  it is raised as a :class:`~connectors.exceptions.ConfigurationError` naming the setting to change
  rather than retried as "Kafka does not answer".

Secrets (the SASL password, the key password) appear only in the returned mappings, never in a log line
or a message.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from typing import Any

from confluent_kafka import KafkaError

from connectors.exceptions import ConfigurationError
from connectors.kafka.settings import KafkaSettings
from connectors.tls import TlsVerificationError, client_context, explain_verification

log = logging.getLogger(__name__)


def uses_sasl(settings: KafkaSettings) -> bool:
    return settings.security_protocol.startswith("SASL_")


def uses_tls(settings: KafkaSettings) -> bool:
    return settings.security_protocol.endswith("SSL")


def librdkafka_config(settings: KafkaSettings) -> dict[str, Any]:
    """``bootstrap.servers`` and the security properties of a confluent-kafka client."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "security.protocol": settings.security_protocol.lower(),
    }
    if uses_sasl(settings):
        assert settings.sasl_password is not None  # KafkaSettings checked it
        config["sasl.mechanism"] = settings.sasl_mechanism
        config["sasl.username"] = settings.sasl_username
        config["sasl.password"] = settings.sasl_password.get_secret_value()
    if uses_tls(settings):
        if settings.ssl_cafile is not None:
            config["ssl.ca.location"] = str(settings.ssl_cafile)
        if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:
            config["ssl.certificate.location"] = str(settings.ssl_certfile)
            config["ssl.key.location"] = str(settings.ssl_keyfile)
        if settings.ssl_key_password is not None:
            config["ssl.key.password"] = settings.ssl_key_password.get_secret_value()
        config["ssl.endpoint.identification.algorithm"] = "https" if settings.ssl_check_hostname else "none"
    return config


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of the Python clients (aiokafka); None without TLS."""
    if not uses_tls(settings):
        return None
    return client_context(
        cafile=settings.ssl_cafile,
        certfile=settings.ssl_certfile,
        keyfile=settings.ssl_keyfile,
        key_password=settings.ssl_key_password.get_secret_value() if settings.ssl_key_password else None,
        check_hostname=settings.ssl_check_hostname,
    )


class HideSaslPayloads(logging.Filter):
    """aiokafka logs every request and response at DEBUG with its fields, the SASL login's bytes included:
    a PLAIN password in clear (seen here with ``--log-level debug``). This filter keeps those lines and
    replaces the SaslAuthenticate request and response in them by a placeholder."""

    HIDDEN = "<SASL payload hidden>"

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(_is_sasl(arg) for arg in record.args):
            record.args = tuple(self.HIDDEN if _is_sasl(arg) else arg for arg in record.args)
        return True


def _is_sasl(value: object) -> bool:
    return type(value).__name__.startswith("SaslAuthenticate")


_AIOKAFKA_CONN_LOGGER = "aiokafka.conn"


def hide_sasl_in_client_logs() -> None:
    """Install :class:`HideSaslPayloads` on aiokafka's connection logger (once)."""
    logger = logging.getLogger(_AIOKAFKA_CONN_LOGGER)
    if not any(isinstance(f, HideSaslPayloads) for f in logger.filters):
        logger.addFilter(HideSaslPayloads())


def aiokafka_options(settings: KafkaSettings) -> dict[str, Any]:
    """``bootstrap_servers`` and the security keyword arguments of an aiokafka client. With SASL, also
    keeps the login out of aiokafka's DEBUG log (:func:`hide_sasl_in_client_logs`)."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap,
        "security_protocol": settings.security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if uses_sasl(settings):
        assert settings.sasl_password is not None
        hide_sasl_in_client_logs()
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return options


_VERIFY_REASON = re.compile(r"certificate verify failed:?\s*(?P<reason>[^,(]*)", re.IGNORECASE)
_BROKER = re.compile(r"(?:sasl_)?ssl://(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<port>\d+)/", re.IGNORECASE)
_AUTH_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
PROBE_TIMEOUT_S = 3.0


def verification_probe(settings: KafkaSettings, host: str, port: int) -> ssl.SSLCertVerificationError | None:
    """Why the broker at ``host:port`` fails verification, as Python's TLS sees it with the same settings
    (librdkafka says only "broker certificate could not be verified", whether the CA or the name is
    wrong); None when it verifies or cannot be reached. One TLS handshake, on failure only."""
    context = ssl_context(settings)
    if context is None:
        return None
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=PROBE_TIMEOUT_S) as sock:
            context.wrap_socket(sock, server_hostname=host.strip("[]")).close()
    except ssl.SSLCertVerificationError as exc:
        return exc
    except (OSError, ssl.SSLError):
        return None
    return None


def security_failure(settings: KafkaSettings, err: KafkaError) -> ConfigurationError | None:
    """The configuration error a librdkafka error stands for (a broker certificate that does not verify,
    a refused SASL login), or None when it is something else (a broker away: retried)."""
    text = err.str()
    code = err.code()
    if code == KafkaError._SSL and "certificate verify failed" in text.lower():
        match = _VERIFY_REASON.search(text)
        reason = match.group("reason").strip() if match and match.group("reason").strip() else text
        verify_code: int | None = None
        where = settings.bootstrap
        broker = _BROKER.search(text)
        if broker is not None:
            where = f"{broker.group('host')}:{broker.group('port')}"
            probed = verification_probe(settings, broker.group("host"), int(broker.group("port")))
            if probed is not None:
                reason, verify_code = str(probed.verify_message or reason), probed.verify_code
        return TlsVerificationError(
            explain_verification(
                "Kafka broker's",
                where,
                reason,
                verify_code=verify_code,
                ca_setting="FRESHKEY_KAFKA_SSL_CAFILE",
                cafile=settings.ssl_cafile,
                host_setting="FRESHKEY_KAFKA_BOOTSTRAP and the brokers' advertised listeners",
                hostname_hint="set FRESHKEY_KAFKA_SSL_CHECK_HOSTNAME=false to check the CA only",
            )
        )
    if code in _AUTH_CODES:
        who = f"user {settings.sasl_username!r} ({settings.sasl_mechanism})" if uses_sasl(settings) else "it"
        return ConfigurationError(
            f"Kafka at {settings.bootstrap} refused the login of {who}: {text}; check "
            "FRESHKEY_KAFKA_SECURITY_PROTOCOL, FRESHKEY_KAFKA_SASL_MECHANISM, FRESHKEY_KAFKA_SASL_USERNAME "
            "and FRESHKEY_KAFKA_SASL_PASSWORD"
        )
    return None


class SecurityErrors:
    """A librdkafka ``error_cb`` that keeps the first certificate or login failure
    (:func:`security_failure`) and logs every other error at DEBUG (freshkey says itself what it does
    about an unreachable broker)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._failure: ConfigurationError | None = None
        self.client: Any = None
        """The client whose ``poll`` serves the callbacks (an admin client serves them only then)."""

    def __call__(self, err: KafkaError) -> None:
        failure = security_failure(self.settings, err)
        if failure is not None and self._failure is None:
            self._failure = failure
        log.debug("librdkafka: %s", err.str())

    @property
    def failure(self) -> ConfigurationError | None:
        """The first certificate or login failure reported so far (after serving pending callbacks)."""
        if self._failure is None and self.client is not None:
            self.client.poll(0)
        return self._failure
