"""``freshkey snapshot``: read the bound tables into the caches while the stream runs (watermarks).

The command does not read the tables itself: it writes a request row into the signal table
(``FRESHKEY_CONNECTOR_SIGNAL_TABLE``), which the running connector sees in its binlog and carries out
between its own binlog events (``connectors.snapshot``), then follows the progress the connector
publishes there. Ctrl-C cancels the snapshot (the connector finishes the chunk in hand); running the
command again continues it, ``--restart`` starts over.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import orjson
import pymysql
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from connectors.doctor import connect
from connectors.exceptions import ConnectorError
from connectors.snapshot.model import MAX_CHUNK_ROWS, SnapshotRequest, SnapshotStatus, SnapshotTable
from connectors.snapshot.signals import SignalTable
from pipeline.commands import EnvFile
from pipeline.commands.connector import snapshot_tables
from pipeline.config import AllSettings, load_bindings
from schemas import Bindings

console = Console()

POLL_S = 0.25
SILENT_WARN_S = 30.0
"""A running snapshot whose status has not moved for this long gets a note (the connector may be down:
it resumes the snapshot when it starts again)."""
CANCEL_WAIT_S = 15.0

EXIT_DONE, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 130


class RateColumn(ProgressColumn):
    """Rows per second of the snapshot (the connector's figure: acknowledged rows since it took the
    request), or as rich measures the task's progress."""

    def render(self, task: Task) -> Text:
        speed = task.fields.get("rate") or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed else "- rows/s", style="progress.data.speed")


def snapshot(
    env_file: EnvFile = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Namespace to snapshot (repeat for more); default: every namespace of an on_change: write "
            "binding. A named on_change: invalidate binding is snapshotted too: its rows invalidate "
            "entries older than the row.",
        ),
    ] = None,
    chunk_rows: Annotated[
        int | None,
        typer.Option(
            "--chunk-rows",
            min=1,
            max=MAX_CHUNK_ROWS,
            help="Rows per chunk (one SELECT between two watermarks); default "
            "FRESHKEY_CONNECTOR_SNAPSHOT_CHUNK_ROWS.",
        ),
    ] = None,
    max_rows_per_s: Annotated[
        float | None,
        typer.Option(
            "--max-rows-per-s",
            min=0,
            help="Most rows per second read from the source (0: no limit); default "
            "FRESHKEY_CONNECTOR_SNAPSHOT_MAX_ROWS_PER_S.",
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Start over instead of continuing an unfinished snapshot.")
    ] = False,
    status: Annotated[
        bool,
        typer.Option(
            "--status", help="Show the connector's snapshot (or follow it while it runs); ask nothing."
        ),
    ] = False,
    wait_s: Annotated[
        float,
        typer.Option(
            "--wait-s", min=1, help="How long to wait for the connector to take the request before giving up."
        ),
    ] = 60.0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
) -> None:
    """Read the bound tables into every cache tier while the stream runs, without ever overwriting a
    newer change (DBLog's watermarks; needs a running `freshkey connector`).

    Exit codes: 0 done; 1 failed, or no connector took the request; 2 a setting or grant to change;
    130 cancelled with Ctrl-C (run it again to continue).
    """
    settings = AllSettings.load(env_file)
    signal = SignalTable(settings.connector.signal_table, settings.mysql.server_id)
    try:
        conn = connect(settings.mysql)
    except ConnectorError as exc:
        console.print(f"[red]✗[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    try:
        if status:
            final = _follow(conn, signal, None, wait_s=wait_s)
            if final is None:
                console.print("no snapshot yet: the connector has published none.")
                return
        else:
            bindings = load_bindings(settings.bindings_path)
            tables = _tables(bindings, namespace or [])
            try:
                signal.ensure(conn, settings.mysql.user)
                signal.probe(conn, settings.mysql.user)
            except ConnectorError as exc:
                console.print(f"[red]✗[/red] {escape(str(exc))}")
                raise typer.Exit(2) from None
            request = SnapshotRequest(
                request=uuid.uuid4().hex[:16],
                tables=tuple(tables),
                chunk_rows=chunk_rows or settings.connector.snapshot_chunk_rows,
                max_rows_per_s=(
                    max_rows_per_s
                    if max_rows_per_s is not None
                    else settings.connector.snapshot_max_rows_per_s
                ),
                restart=restart,
            )
            signal.write(conn, "request", request.request, request.model_dump(mode="json"))
            console.print(
                f"asked the connector (server id {settings.mysql.server_id}) for snapshot {request.request}: "
                f"{len(tables)} table(s), {request.chunk_rows:,} rows per chunk, "
                + (
                    f"at most {request.max_rows_per_s:,g} rows/s"
                    if request.max_rows_per_s
                    else "no rate limit"
                )
                + (", starting over" if restart else "")
            )
            try:
                final = _follow(conn, signal, request.request, wait_s=wait_s)
            except KeyboardInterrupt:
                final = _cancel(conn, signal, request.request)
            if final is None:
                raise typer.Exit(EXIT_FAILED)
        _summary(final)
        if json_path is not None:
            json_path.write_bytes(orjson.dumps(_figures(final), option=orjson.OPT_INDENT_2))
        if final.status == "failed":
            raise typer.Exit(EXIT_FAILED)
        if final.status == "cancelled":
            console.print("cancelled: `freshkey snapshot` continues it, `--restart` starts over.")
            raise typer.Exit(EXIT_CANCELLED)
    finally:
        conn.close()


def _tables(bindings: Bindings, namespaces: list[str]) -> list[SnapshotTable]:
    known = {b.namespace for b in bindings.bindings}
    unknown = [n for n in namespaces if n not in known]
    if unknown:
        console.print(
            f"[red]✗[/red] no binding has namespace {escape(', '.join(unknown))}; the bound namespaces are "
            f"{escape(', '.join(sorted(known)))} (FRESHKEY_BINDINGS)"
        )
        raise typer.Exit(2)
    tables = snapshot_tables(bindings, namespaces)
    if not namespaces:
        for b in bindings.bindings:
            if b.on_change == "invalidate":
                console.print(
                    f"skipped {escape(b.namespace)} ({escape(b.table)}): on_change: invalidate, applications "
                    "fill after a miss (name it with --namespace to invalidate its entries row by row)"
                )
    if not tables:
        console.print("[red]✗[/red] nothing to snapshot: no binding of an on_change: write table")
        raise typer.Exit(2)
    return tables


def _read_status(conn: pymysql.connections.Connection, signal: SignalTable) -> SnapshotStatus | None:
    body = signal.read(conn, "status")
    if body is None:
        return None
    try:
        return SnapshotStatus.model_validate(body)
    except ValidationError:
        return None


def _follow(
    conn: pymysql.connections.Connection, signal: SignalTable, request: str | None, *, wait_s: float
) -> SnapshotStatus | None:
    """Show the progress of ``request`` (None: whatever snapshot the connector has) until it ends; None
    when no connector took it within ``wait_s`` (or it was taken over)."""
    deadline = time.monotonic() + wait_s
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
    )
    seen = False
    moved_at, last_rows = time.monotonic(), -1
    warned = False
    with Progress(*columns, console=console) as progress:
        tasks: dict[int, TaskID] = {}
        while True:
            current = _read_status(conn, signal)
            if current is None and request is None:
                return None
            if current is not None and (request is None or current.request == request):
                request = current.request
                seen = True
                _show(progress, tasks, current)
                if current.status != "running":
                    return current
                if current.rows + current.in_flight_rows != last_rows:
                    moved_at, last_rows, warned = (
                        time.monotonic(),
                        current.rows + current.in_flight_rows,
                        False,
                    )
                elif not warned and time.monotonic() - moved_at > SILENT_WARN_S:
                    warned = True
                    progress.console.print(
                        f"no progress for {SILENT_WARN_S:.0f} s: is `freshkey connector` running? It "
                        "resumes the snapshot when it starts again."
                    )
            elif seen:
                taker = current.request if current is not None else "?"
                progress.console.print(
                    f"[red]✗[/red] the snapshot was taken over by request {escape(taker)} (another `freshkey "
                    "snapshot`, or the connector after a gap); follow it with `freshkey snapshot --status`"
                )
                return None
            elif time.monotonic() > deadline:
                progress.console.print(
                    f"[red]✗[/red] no connector took the request within {wait_s:.0f} s. Is "
                    "`freshkey connector` running against this database with "
                    f"FRESHKEY_MYSQL_SERVER_ID={signal.server_id} and "
                    f"FRESHKEY_CONNECTOR_SIGNAL_TABLE={signal.name}? The request stays: the connector takes "
                    "it when its binlog reaches it (`freshkey snapshot --status` follows it)."
                )
                return None
            time.sleep(POLL_S)


def _show(progress: Progress, tasks: dict[int, TaskID], state: SnapshotStatus) -> None:
    for index, table in enumerate(state.tables):
        label = escape(f"{table.label or table.name}")
        finished = table.finished
        total = table.rows if finished else max(table.estimate or 0, table.rows + 1)
        if index not in tasks:
            tasks[index] = progress.add_task(label, total=total, completed=table.rows)
        note = " (skipped)" if table.skipped else ""
        progress.update(
            tasks[index], total=total, completed=table.rows, description=label + note, rate=state.rows_per_s()
        )


def _cancel(conn: pymysql.connections.Connection, signal: SignalTable, request: str) -> SnapshotStatus | None:
    """Ctrl-C: ask the connector to stop after the chunk in hand, and wait (briefly) for it to say so."""
    console.print("cancelling: the connector stops after the chunk in hand (Ctrl-C again to leave now)")
    signal.write(conn, "cancel", request, {"request": request})
    deadline = time.monotonic() + CANCEL_WAIT_S
    current = _read_status(conn, signal)
    try:
        while time.monotonic() < deadline:
            current = _read_status(conn, signal)
            if current is not None and current.request == request and current.status != "running":
                return current
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        pass
    console.print("the connector has not confirmed the cancel yet (it does once its binlog reaches it)")
    if current is not None and current.request == request:
        return current.model_copy(update={"status": "cancelled"})
    return None


def _summary(state: SnapshotStatus) -> None:
    table = Table(title=escape(f"snapshot {state.request}: {state.status}"))
    for column in ("namespace", "table", "rows sent", "dropped", "chunks", "state"):
        table.add_column(column, justify="right" if column in ("rows sent", "dropped", "chunks") else "left")
    for t in state.tables:
        what = "skipped: " + t.skipped if t.skipped else "done" if t.done else "unfinished"
        table.add_row(
            escape(t.label), escape(t.name), f"{t.rows:,}", f"{t.dropped:,}", f"{t.chunks:,}", escape(what)
        )
    table.add_row(
        "all", "", f"{state.rows:,}", f"{state.dropped:,}", f"{sum(t.chunks for t in state.tables):,}", ""
    )
    console.print(table)
    rate = state.rows_per_s()
    end = state.finished_at or time.time()
    console.print(
        f"{state.rows - state.resumed_rows:,} row(s) in {end - state.started_at:,.1f} s"
        + (f" = {rate:,.0f} rows/s" if rate is not None else "")
        + (f" (and {state.resumed_rows:,} from before it was resumed)" if state.resumed_rows else "")
        + "; dropped rows changed while their chunk was read: the stream carries their newer value."
    )
    if state.error:
        console.print(f"[red]{escape(state.error)}[/red]")


def _figures(state: SnapshotStatus) -> dict[str, Any]:
    end = state.finished_at or time.time()
    return {
        "request": state.request,
        "status": state.status,
        "reason": state.reason,
        "error": state.error,
        "seconds": round(end - state.started_at, 3),
        "rows": state.rows,
        "resumed_rows": state.resumed_rows,
        "dropped": state.dropped,
        "rows_per_s": state.rows_per_s(),
        "namespaces": {
            t.label or t.name: {
                "table": t.name,
                "rows": t.rows,
                "dropped": t.dropped,
                "chunks": t.chunks,
                "done": t.done,
                "skipped": t.skipped,
            }
            for t in state.tables
        },
    }
