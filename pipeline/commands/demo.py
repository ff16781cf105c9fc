"""``freshkey demo``: the whole flow on private local services, with a consistency check at the end."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()


def demo(
    changes: Annotated[int, typer.Option("--changes", min=1, help="Row changes to drive.")] = 2000,
    rate: Annotated[float, typer.Option("--rate", min=0.1, help="Changes per second.")] = 500.0,
    rows: Annotated[int, typer.Option("--rows", min=1, help="Distinct rows the changes touch.")] = 500,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions of the change topic.")
    ] = 4,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures to this file.")
    ] = None,
    race: Annotated[
        bool, typer.Option("--race", help="Add concurrent readers that fill after misses (cache-aside).")
    ] = False,
    readers: Annotated[int, typer.Option("--readers", min=1, help="Readers with --race.")] = 8,
    hot_rows: Annotated[int, typer.Option("--hot-rows", min=1, help="Rows readers and writers share.")] = 20,
    leases: Annotated[
        bool, typer.Option("--leases/--no-leases", help="With --race: fill under leases, or plainly.")
    ] = True,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Keep services' data and logs here.")
    ] = None,
) -> None:
    """Start MariaDB, Redis and a Kafka broker locally, run connector + worker, drive changes, verify."""
    from pipeline.demo.race import RaceConfig
    from pipeline.demo.run import DemoError, run_demo
    from pipeline.demo.run import Progress as DemoProgress

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )

    class RichProgress(DemoProgress):
        def __init__(self) -> None:
            self.task: TaskID | None = None

        def stage(self, text: str) -> None:
            console.log(text)

        def advance(self, done: int, total: int) -> None:
            if self.task is None:
                bar.start()
                self.task = bar.add_task("changes", total=total)
            bar.update(self.task, completed=done)
            if done >= total:
                bar.stop()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM both unwind through run_demo, which stops everything it started (SIGINT is
    # set explicitly: a shell starting the demo in the background would otherwise leave it ignored).
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        result = run_demo(
            changes=changes,
            rate=rate,
            rows=rows,
            partitions=partitions,
            workdir=workdir,
            progress=RichProgress(),
            race=RaceConfig(readers=readers, hot_rows=hot_rows, leases=leases) if race else None,
        )
    except KeyboardInterrupt:
        bar.stop()
        console.print("[yellow]interrupted[/yellow]: everything the demo started has been stopped.")
        raise typer.Exit(130) from None
    except DemoError as exc:
        bar.stop()
        console.print(f"[red]demo failed[/red]: {exc}")
        raise typer.Exit(1) from None

    table = Table(title="freshkey demo")
    table.add_column("figure")
    table.add_column("value", justify="right")
    lag = result.lag_ms
    rows_out = [
        ("changes", f"{result.changes}"),
        ("applied (Redis CAS landed)", f"{result.applied}"),
        ("driven at", f"{result.drive_rate_per_s:,.0f}/s"),
        ("throughput to caught-up", f"{result.throughput_per_s:,.0f}/s"),
        ("catch-up after last change", f"{result.catch_up_s * 1000:,.0f} ms"),
        (
            "lag p50 / p99 / max",
            "/".join(f"{v:,.1f}" if v is not None else "-" for v in lag.values()) + " ms",
        ),
        ("entries checked", f"{result.verify.checked}"),
        ("stale", f"[{'green' if result.stale == 0 else 'red'}]{result.stale}[/]"),
        ("missing", f"[{'green' if result.missing == 0 else 'red'}]{result.missing}[/]"),
    ]
    if result.race is not None:
        r = result.race
        rows_out += [
            ("race readers", f"{r['readers']} ({'leases' if leases else 'plain cache-aside'})"),
            ("reads / fills / fills rejected", f"{r['reads']} / {r['fills']} / {r['fills_rejected']}"),
            ("stale in L1 / L2", f"{r['stale_l1']} / {r['stale_l2']}"),
        ]
    for name, value in rows_out:
        table.add_row(name, value)
    console.print(table)
    for example in result.verify.examples:
        console.print(f"  {example}")
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2))
        console.print(f"figures written to {json_path}")
    if result.stale or result.missing:
        raise typer.Exit(1)
