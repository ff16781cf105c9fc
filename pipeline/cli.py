"""The ``freshkey`` command line."""

from __future__ import annotations

import sys

import typer

from connectors.exceptions import ConfigurationError
from pipeline.commands.connector import connector
from pipeline.commands.doctor import doctor
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


def _register_optional() -> None:
    from pipeline.commands.demo import demo

    app.command()(demo)


def main() -> None:
    _register_optional()
    try:
        app()
    except (SettingsError, BindingError, ConfigurationError) as exc:
        print(f"freshkey: {exc}", file=sys.stderr)
        sys.exit(2)
