"""Settings of the edges: the MySQL/MariaDB source, the Kafka cluster, the connector process.

Every field is read from an environment variable named by the class prefix plus the field name in upper
case (``FRESHKEY_MYSQL_HOST``...), or from the config file the command line is given. Secrets are
``SecretStr``: their value is never printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.codec import DEAD_LETTER_OVERHEAD_BYTES, dead_letter_size_bound

MySQLSslMode = Literal["auto", "disabled", "preferred", "required", "verify-ca", "verify-identity"]
KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def _readable(setting: str, path: Path | None) -> None:
    """ValueError naming ``setting`` when ``path`` is given but cannot be read (a typo, a missing mount)."""
    if path is None:
        return
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ValueError(f"{setting}={path}: {exc.strerror or exc}; set it to a readable PEM file") from None


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


class MySQLSettings(BaseSettings):
    """Where the source database is and how the connector identifies itself as a replica."""

    model_config = SettingsConfigDict(
        env_prefix="FRESHKEY_MYSQL_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,  # secrets
    )

    host: str = "127.0.0.1"
    port: int = Field(3306, ge=1, le=65535)
    user: str = "freshkey"
    password: SecretStr = SecretStr("")
    server_id: int = Field(
        4242, ge=1, le=2**32 - 1, description="Replica server id the binlog reader registers with; unique."
    )
    connect_timeout_s: float = Field(10.0, gt=0)
    ssl_mode: MySQLSslMode = Field(
        "auto",
        description="TLS to the server: disabled; preferred (TLS when the server offers it, nothing "
        "verified: pymysql's default); required (TLS, certificate not checked); verify-ca (TLS, "
        "certificate signed by FRESHKEY_MYSQL_SSL_CA); verify-identity (verify-ca and the certificate "
        "names FRESHKEY_MYSQL_HOST). auto: verify-identity when FRESHKEY_MYSQL_SSL_CA or _SSL_CERT is "
        "set, else preferred. Upper case and underscores (VERIFY_IDENTITY) are accepted.",
    )
    ssl_ca: Path | None = Field(
        None, description="CA certificate (PEM) the server's certificate must be signed by."
    )
    ssl_cert: Path | None = Field(
        None,
        description="Client certificate (PEM), for accounts that REQUIRE X509; with FRESHKEY_MYSQL_SSL_KEY.",
    )
    ssl_key: Path | None = Field(None, description="Private key (PEM) of FRESHKEY_MYSQL_SSL_CERT.")

    @field_validator("ssl_mode", mode="before")
    @classmethod
    def _ssl_mode_spelling(cls, value: object) -> object:
        return value.strip().lower().replace("_", "-") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _tls_consistent(self) -> MySQLSettings:
        if (self.ssl_cert is None) != (self.ssl_key is None):
            raise ValueError(
                "FRESHKEY_MYSQL_SSL_CERT and FRESHKEY_MYSQL_SSL_KEY go together: set both or neither"
            )
        if self.ssl_mode == "disabled" and (self.ssl_ca or self.ssl_cert):
            raise ValueError(
                "FRESHKEY_MYSQL_SSL_MODE=disabled but FRESHKEY_MYSQL_SSL_CA/_SSL_CERT are set: remove them, "
                "or choose a mode that uses TLS (verify-identity)"
            )
        for setting, path in (
            ("FRESHKEY_MYSQL_SSL_CA", self.ssl_ca),
            ("FRESHKEY_MYSQL_SSL_CERT", self.ssl_cert),
            ("FRESHKEY_MYSQL_SSL_KEY", self.ssl_key),
        ):
            _readable(setting, path)
        return self

    @property
    def effective_ssl_mode(self) -> MySQLSslMode:
        """The TLS mode in force: ``auto`` resolved (verify-identity when a CA or client certificate is
        configured, preferred otherwise)."""
        if self.ssl_mode != "auto":
            return self.ssl_mode
        return "verify-identity" if self.ssl_ca or self.ssl_cert else "preferred"

    def ssl_kwargs(self) -> dict[str, Any]:
        """The TLS part of :meth:`connection_kwargs` (pymysql's ``ssl``/``ssl_disabled``): empty in
        ``preferred`` mode (pymysql's own default), a verifying context in the verify modes, whose
        certificate failures raise :class:`~connectors.tls.TlsVerificationError` naming the setting."""
        from connectors.tls import MySQLClientContext, client_context

        mode = self.effective_ssl_mode
        if mode == "preferred":
            return {}
        if mode == "disabled":
            return {"ssl_disabled": True}
        context = client_context(
            cafile=self.ssl_ca,
            certfile=self.ssl_cert,
            keyfile=self.ssl_key,
            verify=mode != "required",
            check_hostname=mode == "verify-identity",
            context_class=MySQLClientContext,
        )
        assert isinstance(context, MySQLClientContext)
        context.describe = {"where": f"{self.host}:{self.port}", "cafile": self.ssl_ca}
        return {"ssl": context}

    def connection_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``pymysql.connect`` (and the binlog reader's connection settings),
        TLS included (:meth:`ssl_kwargs`)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password.get_secret_value(),
            "connect_timeout": int(self.connect_timeout_s),
            **self.ssl_kwargs(),
        }


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
            _readable(setting, path)
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
    linger_ms: float = Field(
        LINGER_MS,
        ge=0,
        le=1000,
        description="How long a batch of events waits to fill (librdkafka linger.ms) while the connector "
        "reads a backlog; whatever waits is sent at once when the binlog is read to its end, so a quiet "
        "database sees no such delay. Larger: fewer, fuller produce requests under load.",
    )
    fast_rows: bool = Field(
        True,
        description="Decode the rows of tables whose column types connectors/binlog/rowdecode covers "
        "straight from the binlog's bytes (the same images as pymysqlreplication gives), and read the "
        "events of plain transactions without pymysqlreplication's event objects (connectors/binlog/"
        "lean): each cut the connector's CPU per change by about a third here. false: every event and "
        "row is read by pymysqlreplication.",
    )
    mysql_read_timeout_s: float = Field(
        30.0,
        ge=5,
        description="A binlog connection silent this long (the server sends a heartbeat every second) "
        "counts as lost; the session ends and a new one resumes from the checkpoint.",
    )

    signal_table: str = Field(
        "freshkey.signal",
        pattern=r"^[A-Za-z0-9_$]{1,64}\.[A-Za-z0-9_$]{1,64}$",
        description="db.table of the signalling table: snapshot requests, watermarks and progress "
        "(connectors/snapshot). Created when missing; the connector's account needs CREATE, SELECT, "
        "INSERT, UPDATE and DELETE on it (freshkey snapshot tries it first and names the missing GRANT).",
    )
    snapshot_chunk_rows: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Rows per snapshot chunk (one SELECT between two watermarks), unless the request "
        "says otherwise.",
    )
    snapshot_max_rows_per_s: float = Field(
        0.0,
        ge=0,
        description="Most rows per second a snapshot reads from the source, unless the request says "
        "otherwise; 0 = no limit.",
    )
    snapshot_unsafe_keep_changed_rows: bool = Field(
        False,
        description="Tests only: keep the rows of a chunk that changed between its watermarks (the step "
        "that keeps a snapshot row from overwriting a newer change is off; caches end stale). Shows what "
        "the watermark step prevents.",
    )

    @property
    def snapshot_state_path(self) -> Path:
        """Where the snapshot's progress is kept: beside the checkpoint (``checkpoint.snapshot.json``)."""
        return self.checkpoint_path.with_name(self.checkpoint_path.stem + ".snapshot.json")

    @model_validator(mode="after")
    def _backoff_order(self) -> ConnectorSettings:
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            raise ValueError(
                f"FRESHKEY_CONNECTOR_RETRY_MAX_BACKOFF_S ({self.retry_max_backoff_s}) is below "
                f"FRESHKEY_CONNECTOR_RETRY_INITIAL_BACKOFF_S ({self.retry_initial_backoff_s}); raise the "
                "first or lower the second"
            )
        return self
