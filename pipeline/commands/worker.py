"""``freshkey worker``: the Faust worker that applies changes to the cache tiers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cache_writer.redis.login import RedisLoginError, check_tiers
from connectors.exceptions import ConnectorError
from connectors.kafka.topics import ensure_topics
from pipeline.config import AllSettings, load_bindings


def worker(
    env_file: Annotated[
        Path | None, typer.Option("--env-file", help="Settings file (FRESHKEY_* lines).")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Run one worker; start as many as the change topic has partitions to share the load."""
    from pipeline.app import create_app
    from pipeline.faust_app import FreshkeyWorker

    settings = AllSettings.load(env_file)
    bindings = load_bindings(settings.bindings_path)
    try:  # a refused login is a setting to change, not an outage the tiers would retry forever
        check_tiers(settings.redis, settings.l3)
    except RedisLoginError as exc:
        typer.echo(f"freshkey worker: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        ensure_topics(settings.kafka, [settings.kafka.model_update_topic, settings.kafka.hotness_topic])
    except ConnectorError as exc:
        typer.echo(f"freshkey worker: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        settings.worker.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        typer.echo(
            f"freshkey worker: cannot create FRESHKEY_WORKER_DATA_DIR {settings.worker.data_dir} "
            f"({exc.strerror}); set it to a writable directory",
            err=True,
        )
        raise typer.Exit(2) from None
    worker_ = create_app(settings, bindings)
    FreshkeyWorker(
        worker_.app, loglevel=log_level.lower(), quiet=True, shutdown_grace_s=settings.worker.shutdown_grace_s
    ).execute_from_commandline()
