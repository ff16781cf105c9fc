"""``freshkey doctor``: can this MySQL/MariaDB server feed freshkey? Says exactly what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from connectors.doctor import run_checks
from connectors.exceptions import ConfigurationError
from connectors.settings import MySQLSettings
from pipeline.config import load_settings

console = Console()


def doctor(
    env_file: Annotated[
        Path | None, typer.Option("--env-file", help="Settings file (FRESHKEY_* lines).")
    ] = None,
) -> None:
    """Check the binlog settings and privileges of the source server."""
    settings = load_settings(MySQLSettings, env_file)
    try:
        info, checks = run_checks(settings)
    except ConfigurationError as exc:
        console.print(f"[red]✗[/red] {exc}")
        raise typer.Exit(2) from None
    table = Table(title=f"{settings.host}:{settings.port} — {info.version}")
    table.add_column("check")
    table.add_column("found")
    table.add_column("want")
    table.add_column("fix")
    for check in checks:
        mark = "[green]✓[/green]" if check.ok else "[red]✗[/red]"
        table.add_row(f"{mark} {check.name}", check.found, check.want, "" if check.ok else check.fix)
    console.print(table)
    failed = sum(not c.ok for c in checks)
    if failed:
        console.print(f"[red]{failed} check(s) failed[/red]: the connector will refuse to start.")
        raise typer.Exit(1)
    console.print("[green]ready[/green]: this server can feed freshkey.")
