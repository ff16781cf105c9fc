"""``freshkey heartbeat``: write the heartbeat row every N ms so lag is measured even when idle."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated

import typer

from pipeline.commands import EnvFile


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def heartbeat(
    env_file: EnvFile = None,
    interval_ms: Annotated[
        float | None,
        typer.Option("--interval-ms", min=10, help="Time between beats (FRESHKEY_HEARTBEAT_INTERVAL_MS)."),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
) -> None:
    """Write the heartbeat row until interrupted (SIGINT/SIGTERM); bind its table to see the lag.

    It writes FRESHKEY_HEARTBEAT_DATABASE.FRESHKEY_HEARTBEAT_TABLE (default freshkey.heartbeat, as
    deploy/bindings.yaml and ``freshkey demo`` bind it). The binding to add (see ``connectors.heartbeat``):
    that table, namespace freshkey_heartbeat, version_column and commit_time_column beat_at.
    """
    from connectors.exceptions import ConfigurationError
    from connectors.heartbeat import HeartbeatProber, HeartbeatSettings
    from connectors.settings import MySQLSettings
    from pipeline.config import load_settings, setup_logging

    setup_logging(log_level)
    mysql = load_settings(MySQLSettings, env_file)
    settings = load_settings(HeartbeatSettings, env_file)
    if interval_ms is not None:
        settings = settings.model_copy(update={"interval_ms": interval_ms})
    prober = HeartbeatProber(mysql, settings)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        prober.run()
    except KeyboardInterrupt:
        pass
    except ConfigurationError as exc:
        typer.echo(f"freshkey heartbeat: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        prober.stop()
    typer.echo(f"freshkey heartbeat: {prober.stats.beats} beat(s), {prober.stats.failures} failed write(s)")
