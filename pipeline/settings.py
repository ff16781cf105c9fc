"""Settings of the Faust worker (``FRESHKEY_WORKER_*``) and the bindings file (``FRESHKEY_BINDINGS``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    """The Faust worker that applies changes to the cache tiers."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_WORKER_", extra="ignore")

    app_id: str = Field("freshkey", description="Faust app id; also the Kafka consumer group.")
    web_bind: str = "127.0.0.1"
    web_port: int = Field(6066, ge=1, le=65535)
    data_dir: Path = Path(".freshkey/worker")
    batch_max: int = Field(500, ge=1, description="Most events applied to Redis in one pipeline.")
    batch_within_ms: float = Field(5.0, gt=0, description="Longest wait to fill a batch.")
    session_timeout_s: float = Field(10.0, gt=0)
    commit_interval_s: float = Field(1.0, gt=0)
    fetch_max_wait_ms: int = Field(
        10, ge=1, le=30_000, description="Longest a Kafka fetch waits for data (latency vs idle requests)."
    )


class BindingSettings(BaseSettings):
    """Where the bindings (table -> cache namespace) are read from."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_", extra="ignore")

    bindings: Path = Path("bindings.yaml")
