"""``freshkey bench``: figures, not tests. Three commands:

- ``freshkey bench keys``: semantic-key throughput by batch size, the keying of a whole-namespace
  cutover, and a real cutover on Redis (below);
- ``freshkey bench pipeline``: the whole pipeline against its ceilings on the embedded stack (raw
  binlog decode, raw Redis CAS, connector alone, worker alone, end to end, 2 workers, fixed rates);
  see :mod:`pipeline.bench.pipeline`;
- ``freshkey bench sysbench``: sysbench ``oltp_write_only`` unthrottled while freshkey follows it, how
  far behind it ends and whether anything is stale; see :mod:`pipeline.bench.sysbench`.

``freshkey bench keys``: each throughput figure is the median of ``--repeats`` timed runs; the cutover
figure is one run that really computes ``--cutover-entries`` keys in batches (no extrapolation), with
the random embeddings generated outside the timed sections. The SHA-256 of the cutover's keys is printed
per device (over the keys as little-endian unsigned 64-bit words): equal digests on CPU and CUDA show the
keys are bit-identical at that scale.

The Redis part (``--redis-entries``, 0 to skip) starts a private redis-server (or uses ``--redis-url``),
loads a semantic namespace of that many entries built under model 1 (pipelined ``HSET``s), and runs the
worker's own cutover code (``pipeline.cutover.Cutovers.cutover``, prewarm-then-switch) to model 2 with
the ``--prewarm-entries`` hottest entries: the pending write, the prewarm (old entries read back,
rows reloaded from an in-memory loader, keys computed with the new weights, entries written with the
write script) and the switch, which is ONE compare-and-set of the signature key whatever the size of
the namespace. It then checks that no sampled old entry is served and every hot entry is.

torch is imported by ``keys`` only: ``bench pipeline`` measures processes next to its own, and its own
resident memory should not carry a library it does not use.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from pipeline.bench.config import Progress as BenchProgress

console = Console()

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks that print figures (not timed tests): `keys`, `pipeline` and `sysbench`.",
    no_args_is_help=True,
    add_completion=False,
)


@bench_app.command("keys")
def keys(
    device: Annotated[
        str, typer.Option("--device", help="auto: the CPU, and CUDA too when present; or cpu, cuda.")
    ] = "auto",
    batch_sizes: Annotated[
        list[int] | None, typer.Option("--batch-size", help="Batch sizes to measure (repeatable).")
    ] = None,
    dim: Annotated[int, typer.Option(help="Embedding dimension (384: all-MiniLM-L6-v2).")] = 384,
    shared_dim: Annotated[int, typer.Option(help="Shared projection dimension of the weights.")] = 256,
    key_bits: Annotated[int, typer.Option(help="64 or 128.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed runs per batch size; the median is reported.")] = 5,
    keys_per_run: Annotated[
        int, typer.Option(help="At least this many keys per timed run (small batches run many times).")
    ] = 2048,
    cutover_entries: Annotated[
        int, typer.Option(help="Entries whose keys a cutover regenerates.")
    ] = 1_000_000,
    cutover_batch: Annotated[int, typer.Option(help="Batch size of the cutover.")] = 4096,
    prewarm_entries: Annotated[int, typer.Option(help="Hot entries rekeyed by a prewarm.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the embeddings.")] = 0,
    redis_entries: Annotated[
        int, typer.Option(help="Entries of the namespace cut over on a real Redis (0: skip that part).")
    ] = 1_000_000,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this (empty, scratch) Redis instead of a private redis-server.")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
) -> None:
    """Measure semantic keys/s by batch size, the time to rekey a cutover and a prewarm, and a real
    cutover of a namespace on Redis (one signature write) with the prewarm of its hottest entries."""
    import torch

    from cache_writer.semantic import KeyHashWeights, SemanticKeyer
    from cache_writer.semantic.exceptions import DeviceUnavailableError
    from pipeline.bench import keys as bench_keys

    sizes = batch_sizes or [1, 16, 256, 4096]
    if key_bits not in (64, 128) or min(sizes) < 1 or repeats < 1 or cutover_batch < 1:
        console.print("[red]✗[/red] key bits must be 64 or 128; sizes and repeats positive")
        raise typer.Exit(2)
    try:
        devices = bench_keys.devices(device)
    except DeviceUnavailableError as exc:
        console.print(f"[red]✗[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    weights = KeyHashWeights.generate(seed, {"text": dim}, shared_dim=shared_dim, key_bits=key_bits)
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "dim": dim,
        "shared_dim": shared_dim,
        "key_bits": key_bits,
        "weights_sha256": weights.sha256,
        "throughput": [],
        "cutover": [],
    }
    for dev in devices:
        keyer = SemanticKeyer(weights, dev)
        keyer.keys("text", torch.randn(max(sizes), dim))  # warm-up: fused matrix, kernels, allocator
        for size in sizes:
            report["throughput"].append(bench_keys.throughput(keyer, size, dim, repeats, keys_per_run, seed))
        for label, entries in (("cutover", cutover_entries), ("prewarm", prewarm_entries)):
            if entries > 0:
                report["cutover"].append(bench_keys.rekey(keyer, label, entries, cutover_batch, dim, seed))
    if redis_entries > 0:
        from pipeline.bench.cutover import print_redis_cutover, redis_cutover

        report["redis_cutover"] = redis_cutover(
            entries=redis_entries,
            hot=min(prewarm_entries, redis_entries),
            dim=dim,
            shared_dim=shared_dim,
            key_bits=key_bits,
            seed=seed,
            device=str(devices[-1]),
            redis_url=redis_url,
            progress=console,
        )
    bench_keys.render(report, console)
    if "redis_cutover" in report:
        print_redis_cutover(report["redis_cutover"], console)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"figures written to {escape(str(json_path))}")


@bench_app.command("pipeline")
def pipeline_bench(
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Backlogs and scenarios to run, repeatable or comma-separated: single, multi (backlogs); "
            "raw-decode, raw-redis, connector, e2e, worker, workers-2, rates (scenarios). Naming no "
            "backlog runs both; naming no scenario runs them all.",
        ),
    ] = None,
    changes: Annotated[
        int | None,
        typer.Option(
            "--changes",
            min=1,
            help="Rows per backlog: single-row transactions, and rows of the multi-row INSERTs "
            "(default 10,000; --full 50,000).",
            show_default=False,
        ),
    ] = None,
    insert_rows: Annotated[
        int, typer.Option("--insert-rows", min=1, help="Rows per multi-row INSERT.")
    ] = 1000,
    rows: Annotated[
        int,
        typer.Option(
            "--rows",
            min=1,
            help="Distinct rows the single-row updates cycle over. The worker writes only the newest "
            "change of a key in a batch: --rows equal to --changes measures it with nothing superseded.",
        ),
    ] = 1000,
    rates: Annotated[
        str | None,
        typer.Option(
            "--rates",
            help="Changes/s of the fixed-rate runs, comma-separated (default 500,1000,2000,5000).",
            show_default=False,
        ),
    ] = None,
    rate_seconds: Annotated[
        float | None,
        typer.Option(
            "--rate-seconds",
            min=0.1,
            help="How long each fixed-rate run drives changes (default 2; --full 10). Sustained needs "
            "changes / (drive + catch-up) >= 0.95x the driven rate, so a short run judges strictly: 2 s "
            "fail with 0.11 s of catch-up, 10 s with 0.53 s.",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Runs of everything; medians with min/max are printed.")
    ] = 3,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of each topic.")] = 4,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="The sizes of issue 9: 50,000 single-row transactions, 50 INSERTs of 1,000 rows, 10 s "
            "per rate (explicit options still win).",
        ),
    ] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write every figure here.")] = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Keep the services' data and the processes' logs here."),
    ] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Longest wait for any one step, seconds.")
    ] = 300.0,
) -> None:
    """Measure the pipeline on the embedded stack: raw binlog decode and raw Redis CAS (the ceilings),
    connector alone, worker alone, end to end and 2 workers on a backlog of single-row transactions and
    one of multi-row INSERTs, then fixed rates with lag per stage; CPU and peak RSS per process."""

    from pipeline.bench.config import BenchConfig, parse_only
    from pipeline.bench.pipeline import PipelineBench
    from pipeline.bench.report import NOTES, render, summarize

    try:
        kinds, scenarios = parse_only(only or [])
        overrides: dict[str, Any] = {
            "insert_rows": insert_rows,
            "rows": rows,
            "runs": runs,
            "partitions": partitions,
            "kinds": kinds,
            "scenarios": scenarios,
            "timeout_s": timeout_s,
        }
        if changes is not None:
            overrides["changes"] = changes
        if rate_seconds is not None:
            overrides["rate_seconds"] = rate_seconds
        if rates is not None:
            overrides["rates"] = tuple(float(r) for r in rates.split(",") if r.strip())
        config = BenchConfig.full(**overrides) if full else BenchConfig(**overrides)
        config.check()
    except ValueError as exc:
        console.print(f"[red]✗[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None

    report = _run_bench(lambda: PipelineBench(config, _RichProgress(), workdir=workdir).run())
    report["summary"] = summarize(report)
    report["notes"] = list(NOTES)
    render(report, report["summary"], console)
    _finish(report, json_path)


@bench_app.command("sysbench")
def sysbench_bench(
    time_s: Annotated[int, typer.Option("--time", min=1, help="Seconds sysbench runs.")] = 60,
    threads: Annotated[int, typer.Option("--threads", min=1, help="sysbench threads.")] = 4,
    rate: Annotated[
        int,
        typer.Option(
            "--rate",
            min=0,
            help="Transactions per second sysbench aims at (its --rate); 0: unthrottled, the issue's run.",
        ),
    ] = 0,
    tables: Annotated[int, typer.Option("--tables", min=1, help="sbtest tables.")] = 4,
    table_size: Annotated[int, typer.Option("--table-size", min=1, help="Rows per sbtest table.")] = 10_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of the topic.")] = 4,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write every figure here.")] = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Keep the services' data and the processes' logs here."),
    ] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Longest wait for any one step, seconds.")
    ] = 600.0,
) -> None:
    """sysbench oltp_write_only, unthrottled (or at --rate), against the private MariaDB while a
    connector and a worker follow it: tps, row changes/s, how far behind freshkey is when sysbench ends
    and how long until it caught up, lag percentiles, CPU per process, then freshkey verify. Needs
    sysbench (Debian: apt-get install sysbench); see :mod:`pipeline.bench.sysbench`."""
    from pipeline.bench.sysbench import SysbenchBench
    from pipeline.bench.sysbench_report import render
    from pipeline.bench.sysbench_tool import SysbenchConfig

    config = SysbenchConfig(
        time_s=time_s,
        threads=threads,
        tables=tables,
        table_size=table_size,
        partitions=partitions,
        rate=rate,
        timeout_s=timeout_s,
    )
    try:
        config.check()
    except ValueError as exc:
        console.print(f"[red]✗[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    report = _run_bench(lambda: SysbenchBench(config, _RichProgress(), workdir=workdir).run())
    render(report, console)
    _finish(report, json_path)


def _run_bench(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s report. Ctrl-C and SIGTERM both unwind through the bench, which stops every process and
    service it started (exit 130); a bench that failed exits 1 with the reason."""
    import signal
    from types import FrameType

    from pipeline.bench.config import BenchError

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        report: dict[str, Any] = run()
        return report
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: everything the bench started has been stopped.")
        raise typer.Exit(130) from None
    except BenchError as exc:
        console.print(f"[red]bench failed[/red]: {escape(str(exc))}")
        raise typer.Exit(1) from None


def _finish(report: dict[str, Any], json_path: Path | None) -> None:
    import orjson

    console.print(f"finished in {report['seconds']:,.0f} s")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        console.print(f"figures written to {escape(str(json_path))}")


class _RichProgress(BenchProgress):
    """:class:`pipeline.bench.config.Progress` as a rich progress bar, with result lines above it."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: Any = None

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("starting", total=total)

    def step(self, description: str) -> None:
        if self.task is not None:
            started = self.bar.tasks[0].fields.get("started", False)
            self.bar.update(self.task, description=description, advance=1 if started else 0, started=True)

    def log(self, text: str) -> None:
        self.bar.console.log(text)

    def finish(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.bar.tasks[0].total)
        self.bar.stop()
