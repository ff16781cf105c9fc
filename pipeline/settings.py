"""Settings of the pipeline: the worker, models and hotness, SLA targets, telemetry, the bindings file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    """The Faust worker that applies changes to the cache tiers."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_WORKER_", extra="ignore", frozen=True)

    app_id: str = Field("freshkey", description="Faust app id; also the Kafka consumer group.")
    input: Literal["freshkey", "debezium"] = Field(
        "freshkey",
        description="What the worker reads: freshkey's change topic, or Debezium MySQL topics "
        "(FRESHKEY_KAFKA_DEBEZIUM_TOPICS, FRESHKEY_DEBEZIUM_*; docs/debezium.md).",
    )
    web_bind: str = "127.0.0.1"
    web_port: int = Field(6066, ge=1, le=65535)
    data_dir: Path = Path(".freshkey/worker")
    batch_max: int = Field(500, ge=1, description="Most changes applied to the tiers in one batch.")
    batch_within_ms: float = Field(
        0.0,
        ge=0,
        description="Longest extra wait for a batch to fill once changes are waiting (0: a batch is what "
        "the last fetches brought; waiting trades lag for fewer, fuller batches).",
    )
    session_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Consumer group session: a worker that sends no heartbeat for this long is dropped "
        "from the group (heartbeats come from Faust's consumer thread, not from the loop that applies "
        "batches). Apache Kafka refuses less than its group.min.session.timeout.ms (6 s by default). The "
        "embedded Tansu broker holds the first join of a group for half of it, in whole seconds: 10 s -> "
        "5 s at every worker start, 2 s -> 1 s.",
    )
    commit_interval_s: float = Field(1.0, gt=0)
    fetch_max_wait_ms: int = Field(
        10, ge=1, le=30_000, description="Longest a Kafka fetch waits for data (latency vs idle requests)."
    )
    fetch_min_bytes: int = Field(
        1,
        ge=1,
        le=52_428_800,
        description="Bytes a Kafka fetch waits for (at most fetch_max_wait_ms) before the broker answers: "
        "1 answers at the first change; more gives fewer, fuller fetches for less worker CPU at a "
        "steady low rate, each change waiting up to fetch_max_wait_ms longer.",
    )
    fence_after_s: float | None = Field(
        None,
        gt=0,
        description="How long a cache tier may fail before it is fenced (outer tiers: skipped, then "
        "flushed on return; L2: every namespace fenced on return). Default: the SLA window.",
    )
    shutdown_grace_s: float = Field(
        15.0, gt=0, description="After SIGTERM/SIGINT, the worker exits within this long, stopped or not."
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="Where semantic keys are computed: auto (CUDA when present), cpu, cuda or cuda:N. "
        "Keys are bit-identical on every device.",
    )


class ModelSettings(BaseSettings):
    """Model updates and cutovers (``FRESHKEY_MODEL_*``)."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_MODEL_", extra="ignore", frozen=True)

    cutover: Literal["prewarm-then-switch", "switch-then-prewarm"] = Field(
        "prewarm-then-switch",
        description="prewarm-then-switch: the hot entries are built under the new signature before it "
        "becomes active (no cold start; namespaces keyed by row, whose entries keep their key, always "
        "switch first); switch-then-prewarm: switch at once, then rebuild the hot entries.",
    )
    prewarm_top_n: int = Field(10_000, ge=0, description="Hot entries rebuilt per namespace at a cutover.")
    prewarm_batch: int = Field(1000, ge=1, description="Rows reloaded, keyed and written per step.")
    weights_dir: Path | None = Field(
        None, description="Base directory of relative weights references in model updates."
    )


class HotnessSettings(BaseSettings):
    """How hot an entry is (``FRESHKEY_HOTNESS_*``): alpha * sigmoid(hits / hit_scale) +
    (1 - alpha) * exp(-age / tau_s), age = seconds since its last hit."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_HOTNESS_", extra="ignore", frozen=True)

    alpha: float = Field(0.7, ge=0, le=1, description="Weight of the hit count against recency.")
    tau_s: float = Field(3600.0, gt=0, description="Recency time constant, seconds.")
    hit_scale: float = Field(1.0, gt=0, description="Hits are divided by this before the sigmoid.")
    forward_interval_s: float = Field(
        0.5, gt=0, description="How often a worker moves client hit counts from Redis to Kafka."
    )


class BindingSettings(BaseSettings):
    """Where the bindings (table -> cache namespace) are read from."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_", extra="ignore", frozen=True)

    bindings: Path = Path("bindings.yaml")


class SlaSettings(BaseSettings):
    """The promises: how far behind the database the caches may be, and how that is judged."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_SLA_", extra="ignore", frozen=True)

    p99_lag_ms: float = Field(200.0, gt=0, description="Target for the p99 of commit-to-cache lag.")
    window_ms: float = Field(
        1500.0, gt=0, description="Consistency window: changes must be visible in every tier within it."
    )
    window_fraction: float = Field(
        0.9999, gt=0, le=1, description="Share of changes that must be visible within window_ms."
    )
    evaluation_window_s: float = Field(60.0, gt=0, description="Sliding window the targets are judged on.")
    evaluation_interval_s: float = Field(1.0, gt=0, description="How often the worker evaluates.")
    violations_topic: str = Field("freshkey.sla-violations", description="Where violations are published.")
    namespaces: tuple[str, ...] = Field(
        (), description="Namespaces whose lag counts (JSON list); empty: all of them."
    )


class TelemetrySettings(BaseSettings):
    """Where metrics and traces go. The Prometheus endpoints listen on localhost unless configured."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_TELEMETRY_", extra="ignore", frozen=True)

    prometheus_bind: str = "127.0.0.1"
    prometheus_port: int = Field(9464, ge=0, le=65535, description="Worker's /metrics port; 0: off.")
    connector_prometheus_port: int = Field(9465, ge=0, le=65535, description="Connector's port; 0: off.")
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces (extra 'otlp')."
    )
    trace_sample_every: int = Field(100, ge=0, description="Trace one cache action in N; 0: none.")
    consumer_lag_interval_s: float = Field(2.0, gt=0, description="How often consumer lag is sampled.")


class DebeziumSettings(BaseSettings):
    """Reading Debezium MySQL topics (``FRESHKEY_WORKER_INPUT=debezium``; docs/debezium.md). The
    ``*_handling_mode`` settings repeat the Debezium connector's own: they decode messages without a
    schema."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_DEBEZIUM_", extra="ignore", frozen=True)

    version_source: Literal["binlog", "gtid"] = "binlog"
    gtid_debezium_only: bool = False
    schemaless: Literal["types", "as-is"] = "types"
    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    time_precision_mode: Literal["adaptive_time_microseconds", "adaptive", "connect", "isostring"] = (
        "adaptive_time_microseconds"
    )
    bigint_unsigned_handling_mode: Literal["long", "precise"] = "long"
