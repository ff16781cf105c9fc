"""Settings of the Kafka cluster and the topics freshkey creates on it, and the connector's default linger.

Every field is read from an environment variable ``FRESHKEY_KAFKA_`` plus the field name in upper case,
or from the config file the command line is given. Secrets are ``SecretStr``: their value is never
printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors.tls import require_readable
from schemas.codec import DEAD_LETTER_OVERHEAD_BYTES, dead_letter_size_bound

KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

LINGER_MS = 25.0
"""How long librdkafka waits to fill a batch (``linger.ms``) while the connector reads a backlog; when it
has read everything there is, :meth:`ChangeProducer.push` sends at once. Measured on one 2-core machine
(issue 9): 10 against 2 ms took the end-to-end drain of single-row transactions from 4.5-4.8k to 5.9-6.0k
changes/s and the broker's CPU per change from 111-119 to 43-51 µs. Under a sustained load (``freshkey
bench sysbench --time 40``, oltp_write_only unthrottled, the connector one core behind) 25 against 10 ms
took the catch-up from 7.8-8.1k to 9.3k changes/s and the broker's CPU per change from 75-78 to 45 µs
(50 ms: 9.5-9.7k and 26 µs, 100 ms: 9.3k and 18 µs); short backlogs (``freshkey bench pipeline --only
single,multi,connector,e2e --changes 20000``, six runs each, alternating) were no slower at 25 ms (end to
end 7,585 -> 7,856 single-row, 27,498 -> 28,904 multi-row changes/s) but were at 50 ms (the connector
alone on 1,000-row INSERTs 36k -> 28-31k rows/s). Lag at 1,000 and 2,000 changes/s (``--only
single,rates --rates 1000,2000 --rate-seconds 10``, p50/p99 ms, one run each; every change is pushed
there): 15.2/58.3 and 21.5/75.6 at 10 ms, 15.2/53.5 and 22.5/72.4 at 50, 16.6/60.9 and 23.5/69.3 at 25
(the broker alone 6.3/34.5 in that last run against 5.8/29.1 before: a busier machine). Alternating
runs of ``freshkey bench sysbench --time 30`` at 10, 25, 10, 25 ms: catch-up 6.2k and 6.9k against 7.8k
and 8.1k changes/s, broker 92 and 83 against 49 and 44 µs per change."""


class KafkaSettings(BaseSettings):
    """The Kafka cluster and the topics freshkey creates on it (explicitly, never auto-created)."""

    model_config = SettingsConfigDict(
        env_prefix="FRESHKEY_KAFKA_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,  # secrets
    )

    bootstrap: str = "127.0.0.1:9092"
    security_protocol: KafkaSecurityProtocol = Field(
        "PLAINTEXT",
        description="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT (a password over plain TCP: trusted networks only) "
        "or SASL_SSL. Every Kafka client of freshkey takes it (connectors/kafka/security.py).",
    )
    sasl_mechanism: KafkaSaslMechanism | None = Field(
        None, description="With SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    sasl_username: str | None = Field(None, description="With SASL_*: the user.")
    sasl_password: SecretStr | None = Field(None, description="With SASL_*: its password (never printed).")
    ssl_cafile: Path | None = Field(
        None, description="With SSL/SASL_SSL: CA certificate (PEM) of the brokers; the system's CAs if unset."
    )
    ssl_certfile: Path | None = Field(
        None, description="With SSL/SASL_SSL: client certificate (PEM), for brokers that ask for one."
    )
    ssl_keyfile: Path | None = Field(None, description="Private key (PEM) of FRESHKEY_KAFKA_SSL_CERTFILE.")
    ssl_key_password: SecretStr | None = Field(
        None, description="Password of an encrypted FRESHKEY_KAFKA_SSL_KEYFILE (never printed)."
    )
    ssl_check_hostname: bool = Field(
        True,
        description="Check that each broker's certificate names the host freshkey connects to. Turn off "
        "only for certificates without the advertised names (the CA is still checked).",
    )
    change_topic: str = "freshkey.changes"
    dead_letter_topic: str = "freshkey.dead-letters"
    model_update_topic: str = Field(
        "freshkey.model-updates", description="Model updates (freshkey model publish), read by the workers."
    )
    hotness_topic: str = Field(
        "freshkey.hotness",
        description="Hit counts (forwarded from the clients' Redis stream) and cutover commands, keyed by "
        "namespace: a namespace's hotness and its cutovers are handled by the same worker.",
    )
    debezium_topics: str | None = Field(
        None,
        description="With FRESHKEY_WORKER_INPUT=debezium: the Debezium topics, as comma-separated names, a "
        "JSON list, or regex:<pattern>.",
    )
    debezium_topic_check_s: float = Field(
        10.0,
        ge=0,
        description="With FRESHKEY_KAFKA_DEBEZIUM_TOPICS=regex:...: seconds between looks for new topics "
        "that match (a table Debezium starts capturing after the worker started); when one appears, the "
        "worker exits with status 70 so that its supervisor starts it again subscribed to it. 0: never.",
    )
    partitions: int = Field(4, ge=1, le=10_000)
    replication_factor: int = Field(1, ge=1)
    max_message_bytes: int = Field(
        1_000_000,
        ge=64 * 1024,
        le=1_000_000_000,
        description="Largest message freshkey produces (librdkafka message.max.bytes, aiokafka "
        "max_request_size). Keep it at or under the broker's and the topics' max.message.bytes "
        "(Apache Kafka's default: 1048588). A change event above it is sent as an invalidation.",
    )
    max_fetch_bytes: int = Field(
        1_048_576,
        ge=64 * 1024,
        description="Most bytes a worker fetches per partition (aiokafka max_partition_fetch_bytes); at "
        "least max_message_bytes, so that every message freshkey produces can be consumed.",
    )
    dead_letter_max_original_bytes: int = Field(
        256 * 1024,
        ge=0,
        description="Dead letters carry at most this many bytes of the original message (its size and "
        "SHA-256 always); base64 makes them 4/3 larger, and the whole must fit max_message_bytes.",
    )

    @field_validator("security_protocol", mode="before")
    @classmethod
    def _protocol_spelling(cls, value: object) -> object:
        return value.strip().upper().replace("-", "_") if isinstance(value, str) else value

    @field_validator("sasl_mechanism", mode="before")
    @classmethod
    def _mechanism_spelling(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().upper().replace("_", "-") or None
        return value

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        protocol = f"FRESHKEY_KAFKA_SECURITY_PROTOCOL={self.security_protocol}"
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username or self.sasl_password is None):
            raise ValueError(
                f"{protocol} needs FRESHKEY_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), "
                "FRESHKEY_KAFKA_SASL_USERNAME and FRESHKEY_KAFKA_SASL_PASSWORD"
            )
        if not sasl and (self.sasl_mechanism or self.sasl_username or self.sasl_password is not None):
            raise ValueError(
                f"FRESHKEY_KAFKA_SASL_* are set but {protocol} does not use them: set "
                "FRESHKEY_KAFKA_SECURITY_PROTOCOL=SASL_SSL (or SASL_PLAINTEXT), or remove them"
            )
        files = {
            "FRESHKEY_KAFKA_SSL_CAFILE": self.ssl_cafile,
            "FRESHKEY_KAFKA_SSL_CERTFILE": self.ssl_certfile,
            "FRESHKEY_KAFKA_SSL_KEYFILE": self.ssl_keyfile,
        }
        if not tls and any(path is not None for path in files.values()):
            raise ValueError(
                f"FRESHKEY_KAFKA_SSL_* files are set but {protocol} does not use TLS: set "
                "FRESHKEY_KAFKA_SECURITY_PROTOCOL=SSL (or SASL_SSL), or remove them"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "FRESHKEY_KAFKA_SSL_CERTFILE and FRESHKEY_KAFKA_SSL_KEYFILE go together: set both or neither"
            )
        for setting, path in files.items():
            require_readable(setting, path)
        return self

    @model_validator(mode="after")
    def _limits_fit(self) -> KafkaSettings:
        if self.max_fetch_bytes < self.max_message_bytes:
            raise ValueError(
                f"FRESHKEY_KAFKA_MAX_FETCH_BYTES ({self.max_fetch_bytes}) is below "
                f"FRESHKEY_KAFKA_MAX_MESSAGE_BYTES ({self.max_message_bytes}): a worker could not consume "
                "the largest message; raise the first or lower the second"
            )
        bound = dead_letter_size_bound(self.dead_letter_max_original_bytes)
        if bound > self.max_message_bytes:
            raise ValueError(
                f"a dead letter with FRESHKEY_KAFKA_DEAD_LETTER_MAX_ORIGINAL_BYTES="
                f"{self.dead_letter_max_original_bytes} can reach {bound} bytes, above "
                f"FRESHKEY_KAFKA_MAX_MESSAGE_BYTES ({self.max_message_bytes}); lower the first "
                f"(at most {(self.max_message_bytes - DEAD_LETTER_OVERHEAD_BYTES) * 3 // 4})"
            )
        return self
