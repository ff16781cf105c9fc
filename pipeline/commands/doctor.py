"""``freshkey doctor``: can this MySQL/MariaDB server feed freshkey? Says exactly what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from connectors.doctor import checkpoint_check, run_checks
from connectors.exceptions import ConnectorError
from connectors.settings import ConnectorSettings, MySQLSettings
from pipeline.config import load_settings

console = Console()


def doctor(
    env_file: Annotated[
        Path | None, typer.Option("--env-file", help="Settings file (FRESHKEY_* lines).")
    ] = None,
) -> None:
    """Check the binlog settings and privileges of the source server, and that the binlog file the
    connector's checkpoint needs is still on it."""
    settings = load_settings(MySQLSettings, env_file)
    connector = load_settings(ConnectorSettings, env_file)
    try:
        info, checks = run_checks(settings)
        checks.append(checkpoint_check(settings, connector.checkpoint_path))
    except ConnectorError as exc:
        console.print(f"[red]✗[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    # Server texts and fixes hold square brackets ("under [mysqld]"): escaped, or rich eats them as markup.
    table = Table(title=escape(f"{settings.host}:{settings.port} — {info.version}"))
    table.add_column("check")
    table.add_column("found")
    table.add_column("want")
    table.add_column("fix")
    for check in checks:
        mark = "[green]✓[/green]" if check.ok else "[red]✗[/red]"
        table.add_row(
            f"{mark} {escape(check.name)}",
            escape(check.found),
            escape(check.want),
            "" if check.ok else escape(check.fix),
        )
    console.print(table)
    failed = sum(not c.ok for c in checks)
    if failed:
        console.print(f"[red]{failed} check(s) failed[/red]: the connector will refuse to start.")
        raise typer.Exit(1)
    console.print("[green]ready[/green]: this server can feed freshkey.")
