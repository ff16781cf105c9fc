"""The ``freshkey`` command line."""

from __future__ import annotations

import sys

import typer

from connectors.exceptions import ConfigurationError
from pipeline.commands.connector import connector
from pipeline.commands.doctor import doctor
from pipeline.commands.verify import verify
from pipeline.commands.worker import worker
from pipeline.config import SettingsError
from schemas import BindingError

app = typer.Typer(
    name="freshkey",
    help="Keeps inference caches consistent with their database: binlog -> Kafka -> Faust -> Redis.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command()(doctor)
app.command()(connector)
app.command()(worker)
app.command()(verify)


def _register_optional() -> None:
    """Commands whose modules import heavier things (torch, the embedded services) load lazily."""
    from pipeline.commands.bench import bench_app
    from pipeline.commands.demo import demo
    from pipeline.commands.heartbeat import heartbeat
    from pipeline.commands.model import model_app
    from pipeline.commands.sla import sla
    from pipeline.commands.snapshot import snapshot

    app.command()(demo)
    app.command()(sla)
    app.command()(snapshot)
    app.command()(heartbeat)
    app.add_typer(bench_app, name="bench")
    app.add_typer(model_app, name="model")


def main() -> None:
    _register_optional()
    try:
        app()
    except (SettingsError, BindingError, ConfigurationError) as exc:
        print(f"freshkey: {exc}", file=sys.stderr)
        sys.exit(2)
