"""Settings of the edges: the MySQL/MariaDB source, the Kafka cluster, the connector process.

Every field is read from an environment variable named by the class prefix plus the field name in upper
case (``FRESHKEY_MYSQL_HOST``...), or from the config file the command line is given. Secrets are
``SecretStr``: their value is never printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.codec import DEAD_LETTER_OVERHEAD_BYTES, dead_letter_size_bound


class MySQLSettings(BaseSettings):
    """Where the source database is and how the connector identifies itself as a replica."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_MYSQL_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(3306, ge=1, le=65535)
    user: str = "freshkey"
    password: SecretStr = SecretStr("")
    server_id: int = Field(
        4242, ge=1, le=2**32 - 1, description="Replica server id the binlog reader registers with; unique."
    )
    connect_timeout_s: float = Field(10.0, gt=0)

    def connection_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``pymysql.connect`` (and the binlog reader's connection settings)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password.get_secret_value(),
            "connect_timeout": int(self.connect_timeout_s),
        }


class KafkaSettings(BaseSettings):
    """The Kafka cluster and the topics freshkey creates on it (explicitly, never auto-created)."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_KAFKA_", extra="ignore", frozen=True)

    bootstrap: str = "127.0.0.1:9092"
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


class ConnectorSettings(BaseSettings):
    """The binlog connector process."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_CONNECTOR_", extra="ignore", frozen=True)

    checkpoint_path: Path = Path(".freshkey/checkpoint.json")
    flush_timeout_s: float = Field(30.0, gt=0, description="How long a shutdown waits for Kafka acks.")
    max_in_flight: int = Field(100_000, ge=1, description="Events produced but not yet acknowledged.")
    version_source: Literal["binlog", "gtid"] = Field(
        "binlog", description="How event versions are computed (see schemas.versions)."
    )
    model_registry_table: str | None = Field(
        None,
        pattern=r"^[^.]+\.[^.]+$",
        description="db.table of a model registry; its inserts become model updates (connectors/registry.py)",
    )
    start_from: Literal["current", "earliest"] = Field(
        "current", description="Where a connector without a checkpoint starts reading the binlog."
    )
    retry_initial_backoff_s: float = Field(
        0.5,
        gt=0,
        description="Wait before the first new session after a lost database or broker; it doubles with "
        "every consecutive failure (with jitter) up to retry_max_backoff_s.",
    )
    retry_max_backoff_s: float = Field(
        30.0, gt=0, description="Longest wait between two sessions while a database or broker is away."
    )
    retry_max_attempts: int = Field(
        0,
        ge=0,
        description="Consecutive failed sessions before the connector gives up (exit 1); 0 = never give up.",
    )
    delivery_timeout_s: float = Field(
        30.0,
        ge=1,
        description="How long Kafka may take to acknowledge an event (librdkafka message.timeout.ms) before "
        "the session ends and a new one replays from the checkpoint.",
    )
    kafka_timeout_s: float = Field(
        10.0, gt=0, description="Timeout of the broker requests a session starts with (topics, offsets)."
    )
    mysql_read_timeout_s: float = Field(
        30.0,
        ge=5,
        description="A binlog connection silent this long (the server sends a heartbeat every second) "
        "counts as lost; the session ends and a new one resumes from the checkpoint.",
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> ConnectorSettings:
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            raise ValueError(
                f"FRESHKEY_CONNECTOR_RETRY_MAX_BACKOFF_S ({self.retry_max_backoff_s}) is below "
                f"FRESHKEY_CONNECTOR_RETRY_INITIAL_BACKOFF_S ({self.retry_initial_backoff_s}); raise the "
                "first or lower the second"
            )
        return self
