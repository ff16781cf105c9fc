"""Loading settings and bindings for the commands, with errors that say what to change."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.logging import RichHandler

from cache_writer.settings import L3Settings, RedisSettings
from connectors.heartbeat import HeartbeatSettings
from connectors.kafka.settings import KafkaSettings
from connectors.settings import ConnectorSettings, MySQLSettings
from pipeline.settings import (
    BindingSettings,
    DebeziumSettings,
    HotnessSettings,
    ModelSettings,
    SlaSettings,
    TelemetrySettings,
    WorkerSettings,
)
from schemas import Bindings, parse_bindings
from schemas.debezium import DebeziumOptions, DebeziumTopics
from schemas.errors import Misconfigured

S = TypeVar("S", bound=BaseSettings)


class SettingsError(Misconfigured):
    """Settings are invalid; the message names the environment variable to fix."""


def load_settings(cls: type[S], env_file: Path | None = None) -> S:
    try:
        return cls(_env_file=env_file)
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        lines = []
        for e in exc.errors(include_url=False):
            if not e["loc"]:  # a check across fields: the message names them (and never their input)
                lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
                continue
            name = f"{prefix}{str(e['loc'][0]).upper()}"
            shown = "(secret)" if "password" in name.lower() or "token" in name.lower() else e.get("input")
            lines.append(f"  {name}: {e['msg']} (got {shown!r})")
        raise SettingsError("invalid settings:\n" + "\n".join(lines)) from None


@dataclass(frozen=True)
class AllSettings:
    """Every settings class, read from the same environment and ``--env-file`` (the one place that loads
    them: a command that takes ``--env-file`` passes it here, so no class is read without the file)."""

    mysql: MySQLSettings
    kafka: KafkaSettings
    connector: ConnectorSettings
    redis: RedisSettings
    l3: L3Settings
    worker: WorkerSettings
    model: ModelSettings
    hotness: HotnessSettings
    sla: SlaSettings
    telemetry: TelemetrySettings
    heartbeat: HeartbeatSettings
    debezium: DebeziumSettings
    bindings_path: Path

    @classmethod
    def load(cls, env_file: Path | None = None) -> AllSettings:
        return cls(
            mysql=load_settings(MySQLSettings, env_file),
            kafka=load_settings(KafkaSettings, env_file),
            connector=load_settings(ConnectorSettings, env_file),
            redis=load_settings(RedisSettings, env_file),
            l3=load_settings(L3Settings, env_file),
            worker=load_settings(WorkerSettings, env_file),
            model=load_settings(ModelSettings, env_file),
            hotness=load_settings(HotnessSettings, env_file),
            sla=load_settings(SlaSettings, env_file),
            telemetry=load_settings(TelemetrySettings, env_file),
            heartbeat=load_settings(HeartbeatSettings, env_file),
            debezium=load_settings(DebeziumSettings, env_file),
            bindings_path=load_settings(BindingSettings, env_file).bindings,
        )


def debezium_options(settings: AllSettings) -> DebeziumOptions:
    """How the worker reads its input (``FRESHKEY_WORKER_INPUT``, ``FRESHKEY_KAFKA_DEBEZIUM_TOPICS``,
    ``FRESHKEY_DEBEZIUM_*``), checked together; SettingsError says what to change."""
    try:
        topics = DebeziumTopics.parse(settings.kafka.debezium_topics or "")
        return DebeziumOptions(
            input=settings.worker.input,
            topics=topics,
            **settings.debezium.model_dump(),
        )
    except (ValidationError, ValueError) as exc:
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise SettingsError("invalid settings:\n  " + message.removeprefix("Value error, ")) from None


def load_bindings(path: Path) -> Bindings:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SettingsError(
            f"cannot read the bindings file {path} ({exc.strerror}); set FRESHKEY_BINDINGS to its path"
        ) from None
    return parse_bindings(text, source=str(path))


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(name)s: %(message)s",
        handlers=[RichHandler(show_path=False, rich_tracebacks=False, omit_repeated_times=False)],
        force=True,
    )
