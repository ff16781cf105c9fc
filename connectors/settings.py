"""Settings of the edges: the MySQL/MariaDB source and the connector process (the Kafka cluster's are
:mod:`connectors.kafka.settings`).

Every field is read from an environment variable named by the class prefix plus the field name in upper
case (``FRESHKEY_MYSQL_HOST``...), or from the config file the command line is given. Secrets are
``SecretStr``: their value is never printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors.kafka.settings import LINGER_MS
from connectors.tls import require_readable

MySQLSslMode = Literal["auto", "disabled", "preferred", "required", "verify-ca", "verify-identity"]


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
            require_readable(setting, path)
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
