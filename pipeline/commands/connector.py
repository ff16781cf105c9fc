"""``freshkey connector``: read the binlog of the bound tables into the change topic."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated

import typer

from connectors.exceptions import ConnectorError
from connectors.runner import run_connector
from pipeline.commands import EnvFile
from pipeline.config import AllSettings, load_bindings, load_settings, setup_logging
from pipeline.telemetry import TelemetrySettings, configure_telemetry


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def connector(
    env_file: EnvFile = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
) -> None:
    """Run the binlog connector until interrupted (SIGINT/SIGTERM stop it cleanly)."""
    setup_logging(log_level)
    settings = AllSettings.load(env_file)
    bindings = load_bindings(settings.bindings_path)
    configure_telemetry(load_settings(TelemetrySettings, env_file), service="connector")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_connector(settings.mysql, settings.kafka, settings.connector, list(bindings.tables()))
    except KeyboardInterrupt:
        pass
    except ConnectorError as exc:
        typer.echo(f"freshkey connector: {exc}", err=True)
        raise typer.Exit(2) from None
