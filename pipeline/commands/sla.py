"""``freshkey sla``: the worker's SLA state (``/freshkey/sla``) as a table; exit code 1 when violated."""

from __future__ import annotations

import datetime as dt
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pipeline.commands import EnvFile
from pipeline.config import load_settings
from pipeline.observe.sla import SlaState, TargetState, format_ms
from pipeline.settings import WorkerSettings

console = Console()

_STYLE = {"ok": "green", "violated": "red", "no_data": "yellow"}


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _value(target: TargetState, value: float | None) -> str:
    if value is None:
        return "-"
    # A measured figure keeps its comparison with the threshold when printed (200.04 ms, not 200.0 ms).
    return f"{value:.4%}" if target.unit == "fraction" else format_ms(value, target.threshold)


def fetch_sla(url: str, timeout_s: float = 5.0) -> tuple[SlaState, bytes]:
    """The worker's SLA state and the raw JSON it answered. Raises OSError or ValueError."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        raw: bytes = response.read()
    return SlaState.model_validate(orjson.loads(raw)), raw


def sla(
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help="The worker's SLA endpoint (default: http://<FRESHKEY_WORKER_WEB_*>/freshkey/sla)."
        ),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the state here.")] = None,
    env_file: EnvFile = None,
) -> None:
    """Print the SLA targets and how the worker measures against them (exit 1: violated, 2: no answer)."""
    if url is None:
        worker = load_settings(WorkerSettings, env_file)
        host = "127.0.0.1" if worker.web_bind in ("0.0.0.0", "::", "") else worker.web_bind
        url = f"http://{host}:{worker.web_port}/freshkey/sla"
    try:
        state, raw = fetch_sla(url)
    except (OSError, ValueError, ValidationError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        console.print(
            f"[red]✗[/red] no SLA state from {escape(url)}: {escape(str(reason))} (is the worker running?)"
        )
        raise typer.Exit(2) from None
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2) + b"\n")
    style = _STYLE[state.status]
    table = Table(
        title=f"freshkey SLA of {escape(state.worker or url)} (last {state.evaluation_window_s:g} s, "
        f"{state.samples} samples): [{style}]{state.status}[/{style}] since {_when(state.since_ms)}"
    )
    for column in ("target", "status", "measured", "threshold", "since", "detail"):
        table.add_column(column, justify="right" if column in ("measured", "threshold") else "left")
    for target in state.targets:
        s = _STYLE[target.status]
        table.add_row(
            target.name,
            f"[{s}]{target.status}[/{s}]",
            _value(target, target.measured),
            _value(target, target.threshold),
            _when(target.since_ms),
            Text(target.detail),  # plain text: a detail may hold brackets that rich would take for markup
        )
    console.print(table)
    if state.p50_ms is not None and state.p99_ms is not None and state.max_ms is not None:
        p99_target = next((t for t in state.targets if t.name == "p99_lag"), None)
        window = f"last {state.evaluation_window_s:g} s"
        if state.window_end_ms is not None:
            window += f" to {_when(state.window_end_ms)}"
        threshold = p99_target.threshold if p99_target is not None else None
        console.print(
            f"lag over the {window}: p50 {format_ms(state.p50_ms, threshold)}, "
            f"p99 {format_ms(state.p99_ms, threshold)}, max {format_ms(state.max_ms, threshold)} "
            "(nearest-rank percentiles, at most 4.43 % high, never low); "
            f"{state.violations} violation(s) since the worker started",
            markup=False,
        )
    if state.unknown_partitions is not None:
        age = "unknown" if state.backlog_age_ms is None else f"{state.backlog_age_ms:.0f} ms"
        unknown = state.unknown_partitions
        console.print(
            f"oldest change waiting on the change topic: {age}; "
            f"{unknown} partition{'' if unknown == 1 else 's'} without a figure"
            + (" (counted against the SLA, see /freshkey/consumer-lag)" if unknown else "")
        )
    if state.last_event is not None:
        console.print(
            f"last event ({_when(state.last_event.at_ms)}): {state.last_event.message}", markup=False
        )
    if state.violated:
        raise typer.Exit(1)
