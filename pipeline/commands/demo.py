"""``freshkey demo``: the whole flow on private local services, with a consistency check at the end."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from pipeline.demo.run import DemoResult, Endpoints

console = Console(log_path=False)


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
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            "--keep",
            help="After the run, keep the stack up (dashboard, metrics, heartbeats) until Ctrl-C.",
        ),
    ] = False,
    heartbeat: Annotated[
        bool | None,
        typer.Option(
            "--heartbeat/--no-heartbeat",
            help="Write heartbeats while the pipeline runs (default: FRESHKEY_HEARTBEAT_ENABLED, on; "
            "every FRESHKEY_HEARTBEAT_INTERVAL_MS).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start MariaDB, Redis and a Kafka broker locally, run connector + worker, drive changes, verify.

    Everything runs on free local ports and stops at the end (or on Ctrl-C); the caller's FRESHKEY_*
    variables are ignored except those that tune the run (SLA targets, batching, traces).
    """
    from connectors.heartbeat import HeartbeatSettings
    from pipeline.config import load_settings
    from pipeline.demo.race import RaceConfig
    from pipeline.demo.run import DemoError, run_demo
    from pipeline.demo.run import Progress as DemoProgress

    heartbeat_settings = load_settings(HeartbeatSettings)
    beating = heartbeat_settings.enabled if heartbeat is None else heartbeat
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
            console.log(escape(text))

        def advance(self, done: int, total: int) -> None:
            if self.task is None:
                bar.start()
                self.task = bar.add_task("changes", total=total)
            bar.update(self.task, completed=done)
            if done >= total:
                bar.stop()

        def endpoints(self, endpoints: Endpoints) -> None:
            live = "live until Ctrl-C" if serve else "live while the demo runs"
            console.log(f"dashboard, {live}: {escape(endpoints.dashboard)}")

    def keep_serving(result: DemoResult, endpoints: Endpoints) -> None:
        _print_result(result, leases=leases, json_path=json_path)
        _print_endpoints(endpoints)
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            console.print("stopping everything the demo started…")

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
            heartbeat_interval_ms=heartbeat_settings.interval_ms if beating else None,
            serve=keep_serving if serve else None,
        )
    except KeyboardInterrupt:
        bar.stop()
        console.print("[yellow]interrupted[/yellow]: everything the demo started has been stopped.")
        raise typer.Exit(130) from None
    except DemoError as exc:
        bar.stop()
        console.print(f"[red]demo failed[/red]: {escape(str(exc))}")
        raise typer.Exit(1) from None
    if serve:
        console.print("stopped: everything the demo started has been stopped.")
    else:
        _print_result(result, leases=leases, json_path=json_path)
    if result.stale or result.missing or not result.accounting.adds_up:
        raise typer.Exit(1)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mark(ok: bool, text: str) -> str:
    return f"[{'green' if ok else 'red'}]{escape(text)}[/]"


def _print_result(result: DemoResult, *, leases: bool, json_path: Path | None) -> None:
    """The summary table, the warnings that explain its figures, and the JSON file."""
    table = Table(title="freshkey demo", box=box.SIMPLE_HEAD)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("detail")
    a = result.accounting
    w = a.written
    lag_text = " / ".join(_ms(v) for v in result.lag_ms.values())
    m = result.machine
    rows_out: list[tuple[str, str, str]] = [
        ("changes driven", f"{w.driven:,}", f"{w.inserts:,} ins, {w.updates:,} upd, {w.deletes:,} del"),
        ("heartbeats + sentinels", f"{w.heartbeats + w.sentinels:,}", f"{w.heartbeats:,} + {w.sentinels:,}"),
        ("  applied in Redis", f"{a.applied:,}", "compare-and-set landed"),
        ("  superseded in a batch", f"{a.superseded:,}", "a newer one came with it"),
        ("  refused as not newer", f"{a.not_newer:,}", "Redis had it, or newer"),
        ("  dead-lettered", _mark(a.dead_lettered == 0, f"{a.dead_lettered:,}"), ""),
        ("  unbound", f"{a.unbound:,}", ""),
        (
            "accounted for",
            _mark(a.adds_up, f"{a.seen:,} of {w.total:,}"),
            "every change, once" if a.adds_up else "[red]does not add up[/]",
        ),
        (
            "driven at",
            _mark(result.pace.held, f"{result.pace.achieved_per_s:,.0f}/s"),
            f"asked {result.pace.target_per_s:,.0f}/s",
        ),
        ("throughput to caught-up", f"{result.throughput_per_s:,.0f}/s", ""),
        (
            "catch-up after drive",
            f"{result.catch_up_s * 1000:,.0f} ms",
            f"sentinels on {result.sentinels} partitions",
        ),
        ("lag p50/p99/max ms", lag_text, "since start, sample table"),
        (
            "machine load (1 min)",
            _mark(not m.busy, f"{m.load_1m:.2f}"),
            f"on {m.cpus} CPU{'' if m.cpus == 1 else 's'}",
        ),
        ("entries checked", f"{result.verify.checked:,}", ""),
        ("stale", _mark(result.stale == 0, f"{result.stale}"), ""),
        ("missing", _mark(result.missing == 0, f"{result.missing}"), ""),
    ]
    if result.race is not None:
        r = result.race
        rows_out += [
            ("race readers", f"{r['readers']}", "leases" if leases else "plain cache-aside"),
            ("reads / fills / rejected", f"{r['reads']} / {r['fills']} / {r['fills_rejected']}", ""),
            ("stale in L1 / L2", f"{r['stale_l1']} / {r['stale_l2']}", ""),
        ]
    for name, value, detail in rows_out:
        table.add_row(name, value, detail)
    console.print(table)
    for example in result.verify.examples:
        console.print(f"  {example}", markup=False, highlight=False, soft_wrap=True)
    for problem in a.problems():
        console.print(f"[red]the accounting does not add up[/red]: {escape(problem)}", soft_wrap=True)
    warning = result.pace.warning(result.machine)
    if warning is not None:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}", soft_wrap=True)
    elif result.machine.busy:
        console.print(
            f"[yellow]note[/yellow]: the machine was busy ({escape(result.machine.text())}): the lag "
            "figures include time spent waiting for a CPU",
            soft_wrap=True,
        )
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2))
        console.print(f"figures written to {escape(str(json_path))}")


def _cli() -> str:
    """How this demo was started, for the commands it suggests (``freshkey`` may not be on PATH)."""
    argv0 = Path(sys.argv[0])
    return str(argv0) if argv0.name == "freshkey" else f"{sys.executable} -m pipeline"


def _print_endpoints(endpoints: Endpoints) -> None:
    """Where to look and what to try, one plain line each (never wrapped: they are copied)."""
    console.print(
        "\n[bold]The stack stays up[/bold], heartbeats on, until Ctrl-C (then everything the demo "
        "started is stopped):",
        soft_wrap=True,
    )
    for name, where, what in (
        ("dashboard", endpoints.dashboard, "the worker's live page"),
        ("worker stats", endpoints.stats, "JSON: events, outcomes, lag"),
        ("worker SLA", endpoints.sla, "JSON: the SLA targets"),
        ("worker metrics", endpoints.worker_metrics, "Prometheus"),
        ("connector metrics", endpoints.connector_metrics, "Prometheus"),
        ("settings", str(endpoints.env_file), "this stack's FRESHKEY_* settings, for --env-file"),
    ):
        console.print(f"  {name:<18} {where}   ({what})", markup=False, highlight=False, soft_wrap=True)
    console.print("Try, in another terminal:")
    env = f"--env-file {endpoints.env_file}"
    for command, why in (
        (f"{_cli()} sla {env}", "the SLA targets, as the worker judges them"),
        (f"{_cli()} verify {env}", "every cache entry against the database"),
        (endpoints.mysql, "change a row, then watch the dashboard"),
    ):
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"      {why}", markup=False, highlight=False, soft_wrap=True)
