"""``freshkey bench sysbench``: does freshkey keep up with sysbench's ``oltp_write_only``, unthrottled?

On the services of ``freshkey bench pipeline`` (:class:`pipeline.bench.stack.Stack`: a private MariaDB
with a ROW binlog, a private Redis, the Tansu broker) and with its connector and worker processes
(:mod:`pipeline.bench.roles`):

1. ``sysbench oltp_write_only prepare`` fills ``tables`` tables of ``table_size`` rows in database
   ``sbtest``; each table then gets a ``freshkey_at DATETIME(6)`` column (default and ``ON UPDATE``
   ``CURRENT_TIMESTAMP(6)``, the server in UTC) which sysbench's statements leave alone and which freshkey
   reads as the commit time, so the worker's stats hold each change's lag in µs (without it the binlog
   timestamps only give whole seconds, which the worker does not put into its lag percentiles). It is the
   time the statement started, so a change's lag also counts the rest of its transaction.
2. Each ``sbtest<i>`` is bound (``on_change: write``, every column) to namespace ``sbtest<i>``, and a
   sentinel table (``freshkey_sentinel``) to ``sysbench_sentinel``; a connector and a worker start, one
   sentinel change goes through them (warm).
3. ``sysbench oltp_write_only run`` for ``time_s`` seconds with ``threads`` threads, unthrottled. Each
   transaction changes 4 rows (an indexed UPDATE, a non-indexed UPDATE, a DELETE and an INSERT of the
   same id). Every second the bench records the binlog end, the connector's checkpoint (saved when
   Kafka has the changes before it) and the worker's acknowledged messages.
4. When sysbench exits, sentinel rows are rewritten, one per partition of the change topic
   (:class:`pipeline.demo.catchup.SentinelRows`); freshkey has caught up when Redis holds every sentinel
   (a partition is applied in order, so every earlier change is in Redis too). *Behind at the end*: how
   many change messages the worker acknowledged after sysbench's end, and the seconds until caught up;
   split into the connector's part (seconds until its checkpoint reached the binlog end of sysbench's
   last transaction) and the worker's.
5. ``freshkey verify`` with the worker's settings: stale, in flight, missing (a row that is not in
   Redis: one sysbench never changed after freshkey started, since prepare's rows came before it).

CPU seconds per process (:class:`pipeline.bench.procs.Sampler`) are taken over the run and over the
catch-up separately; sysbench's own from its resource usage when it exits. The connector, the broker,
the worker and Redis each handle every change, so their CPU over both, per change, times sysbench's rate
of changes says how many cores each needs to keep up (``cpu_us_per_change``): on a 2-core machine shared
with sysbench and MariaDB, that tells whether a process is slow or only starved.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from pipeline.bench.config import BenchConfig, BenchError, Progress
from pipeline.bench.measure import Session
from pipeline.bench.pipeline import _environment
from pipeline.bench.procs import BenchProcessError, Sampler, wait_until
from pipeline.bench.roles import Connector, Worker, acked_count, acked_offsets, stop_all
from pipeline.bench.stack import Stack
from pipeline.demo.catchup import Sentinel, SentinelRows, redis_version_reader
from pipeline.embedded.process import MissingBinaryError, find_binary

SYSBENCH_INSTALL = "apt-get update && apt-get install -y sysbench"
DATABASE = "sbtest"
SENTINEL_TABLE = "freshkey_sentinel"
SENTINEL_NAMESPACE = "sysbench_sentinel"
COMMIT_TIME_COLUMN = "freshkey_at"
ROWS_PER_TRANSACTION = 4
"""Row changes of one oltp_write_only transaction: UPDATE (indexed), UPDATE (non-indexed), DELETE, INSERT."""
CAUGHT_UP_TARGET_S = 2.0


@dataclass(frozen=True)
class SysbenchConfig:
    """What ``freshkey bench sysbench`` runs: sysbench's size and length, and the topic's partitions."""

    time_s: int = 60
    threads: int = 4
    tables: int = 4
    table_size: int = 10_000
    partitions: int = 4
    timeout_s: float = 600.0
    window_ms: float = 1500.0

    def check(self) -> None:
        """ValueError saying which option to change."""
        if min(self.time_s, self.threads, self.tables, self.table_size, self.partitions) < 1:
            raise ValueError("--time, --threads, --tables, --table-size and --partitions must be at least 1")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sysbench_binary() -> str:
    """The sysbench on PATH; BenchError saying how to install it otherwise."""
    try:
        return find_binary(["sysbench"], SYSBENCH_INSTALL)
    except MissingBinaryError as exc:
        raise BenchError(str(exc)) from None


def parse_sysbench(text: str) -> dict[str, float]:
    """The figures of sysbench's final report: transactions, queries, errors, reconnects (count and per
    second), total time and latency (ms)."""
    figures: dict[str, float] = {}
    for name in ("transactions", "queries", "ignored errors", "reconnects"):
        match = re.search(rf"^\s*{name}:\s+(\d+)\s+\(([\d.]+) per sec\.\)", text, re.MULTILINE)
        if match:
            key = name.replace(" ", "_")
            figures[key] = int(match.group(1))
            figures[f"{key}_per_s"] = float(match.group(2))
    match = re.search(r"^\s*total time:\s+([\d.]+)s", text, re.MULTILINE)
    if match:
        figures["total_time_s"] = float(match.group(1))
    latency = text.partition("Latency (ms):")[2]
    for name, key in (("min", "min"), ("avg", "avg"), ("max", "max"), (r"95th percentile", "p95")):
        match = re.search(rf"^\s*{name}:\s+([\d.]+)", latency, re.MULTILINE)
        if match:
            figures[f"latency_{key}_ms"] = float(match.group(1))
    return figures


class SysbenchBench:
    """One ``freshkey bench sysbench`` run: :meth:`run` returns the report."""

    def __init__(
        self, config: SysbenchConfig, progress: Progress | None = None, workdir: Path | None = None
    ) -> None:
        config.check()
        self.config = config
        self.progress = progress or Progress()
        self.workdir = workdir
        self.binary = sysbench_binary()

    def run(self) -> dict[str, Any]:
        own_dir = self.workdir is None
        root = Path(tempfile.mkdtemp(prefix="freshkey-sysbench-")) if self.workdir is None else self.workdir
        root.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        environment = _environment()
        environment["sysbench"] = self._version()
        report: dict[str, Any] = {
            "bench": "sysbench",
            "config": self.config.to_json(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "environment": environment,
        }
        self.progress.start(6)
        try:
            with ExitStack() as stack:
                self.progress.step("starting MariaDB (binlog on), Redis and the Kafka broker")
                bench_config = BenchConfig(partitions=self.config.partitions, timeout_s=self.config.timeout_s)
                services = Stack(root, bench_config, stack)
                report["environment"].update(services.versions())
                session = Session(bench_config, self.progress, services)
                stack.callback(lambda: stop_all(session.procs))
                report.update(_Run(self, session, root).run())
        except (BenchProcessError, TimeoutError) as exc:
            where = "rerun with --workdir DIR to keep the logs" if own_dir else f"logs in {root}"
            raise BenchError(f"{exc}\n({where})") from None
        finally:
            self.progress.finish()
            if own_dir:
                shutil.rmtree(root, ignore_errors=True)
        report["environment"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        report["seconds"] = round(time.monotonic() - began, 1)
        return report

    def _version(self) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(
                [self.binary, "--version"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        return "?"


class _Run:
    """The steps of one run on started services."""

    def __init__(self, bench: SysbenchBench, session: Session, root: Path) -> None:
        self.binary = bench.binary
        self.config = bench.config
        self.progress = bench.progress
        self.session = session
        self.stack = session.stack
        self.root = root
        self.bindings = root / "bindings-sysbench.yaml"

    def sysbench_args(self, command: str) -> list[str]:
        db = self.stack.db
        return [
            self.binary,
            "oltp_write_only",
            "--db-driver=mysql",
            f"--mysql-host={db.host}",
            f"--mysql-port={db.port}",
            f"--mysql-user={db.admin_user}",
            f"--mysql-password={db.admin_password}",
            f"--mysql-db={DATABASE}",
            f"--tables={self.config.tables}",
            f"--table-size={self.config.table_size}",
            f"--threads={self.config.threads}",
            f"--time={self.config.time_s}",
            "--rate=0",
            "--report-interval=10",
            command,
        ]

    def run(self) -> dict[str, Any]:
        config = self.config
        self.progress.step(f"sysbench prepare: {config.tables} tables of {config.table_size:,} rows")
        self._prepare()
        self.progress.step("starting the connector and the worker")
        connector = Connector(self.stack, "sysbench", "connector-sysbench", self.bindings)
        worker = Worker(self.stack, "sysbench", "worker-sysbench", bindings=self.bindings)
        self._start(connector, worker)
        sentinels = SentinelRows(
            database=DATABASE,
            table=SENTINEL_TABLE,
            namespace=SENTINEL_NAMESPACE,
            prefix=worker.prefix,
            partitions=config.partitions,
            first_id=1,
        )
        self.progress.step(f"sysbench run: {config.threads} threads, {config.time_s} s, unthrottled")
        run = self._run(connector, worker)
        self.progress.step("waiting for freshkey to catch up")
        catch_up = self._catch_up(connector, worker, sentinels, run)
        stats = worker.stats() or {}
        self.progress.step("freshkey verify")
        verification = self._verify(worker)
        return _figures(run, catch_up, stats, verification, config)

    def _prepare(self) -> None:
        with self.stack.admin.cursor() as cur:
            cur.execute("SET GLOBAL time_zone = '+00:00'")
            cur.execute(f"CREATE DATABASE {DATABASE}")
        log = self.root / "sysbench-prepare.log"
        with log.open("wb") as out:
            try:
                result = subprocess.run(
                    self.sysbench_args("prepare"),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.config.timeout_s,
                )
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"sysbench prepare took over {self.config.timeout_s:.0f} s") from None
        if result.returncode != 0:
            raise BenchError(f"sysbench prepare exited with {result.returncode}:\n{_tail(log)}")
        tables = [f"sbtest{i}" for i in range(1, self.config.tables + 1)]
        with self.stack.admin.cursor() as cur:
            for table in tables:
                cur.execute(
                    f"ALTER TABLE {DATABASE}.{table} ADD COLUMN {COMMIT_TIME_COLUMN} DATETIME(6) NOT NULL "
                    "DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)"
                )
            cur.execute(
                f"CREATE TABLE {DATABASE}.{SENTINEL_TABLE} (id INT PRIMARY KEY, beat_at DATETIME(6) NOT NULL)"
            )
        lines = ["bindings:"]
        for table in tables:
            lines += [
                f"  - table: {DATABASE}.{table}",
                f"    namespace: {table}",
                f"    commit_time_column: {COMMIT_TIME_COLUMN}",
                "    on_change: write",
            ]
        lines += [
            f"  - table: {DATABASE}.{SENTINEL_TABLE}",
            f"    namespace: {SENTINEL_NAMESPACE}",
            "    version_column: beat_at",
            "    commit_time_column: beat_at",
        ]
        self.bindings.write_text("\n".join(lines) + "\n")

    def _start(self, connector: Connector, worker: Worker) -> None:
        """Start both, wait until the worker holds every partition and one change went through."""
        timeout, check = self.config.timeout_s, self.session.check
        self.session.start(connector.proc, worker.proc)
        wait_until(connector.checkpoint.exists, timeout, "the connector", check)
        wait_until(lambda: worker.progress() is not None, timeout, "the worker", check)
        self.session.wait_assigned([worker])
        with self.stack.admin.cursor() as cur:
            cur.execute(f"REPLACE INTO {DATABASE}.{SENTINEL_TABLE} VALUES (0, UTC_TIMESTAMP(6))")
        wait_until(lambda: acked_count(acked_offsets([worker])) >= 1, timeout, "the warm-up change", check)

    def _run(self, connector: Connector, worker: Worker) -> dict[str, Any]:
        """sysbench run; a sample every second of the binlog end, the connector's checkpoint and the
        worker's acknowledged messages."""
        base_acked = acked_count(acked_offsets([worker]))
        start_position = self.stack.position()
        log = self.root / "sysbench-run.log"
        sampler = self.session.sampler(connector=connector.proc, worker=worker.proc)
        samples: list[dict[str, Any]] = []
        with log.open("wb") as out:
            sampler.start()
            began = time.monotonic()
            proc = subprocess.Popen(
                self.sysbench_args("run"), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            try:
                rusage = self._follow(proc, began, samples, sampler, connector, worker, base_acked)
            finally:
                if proc.returncode is None:  # the bench failed or was interrupted: stop sysbench too
                    proc.kill()
                    proc.wait()
        ended = time.monotonic()
        end_position = self.stack.position()
        acked_at_end = acked_count(acked_offsets([worker]))
        connector_at_end = connector.position()
        processes = sampler.stop()
        if proc.returncode != 0:
            raise BenchError(f"sysbench run exited with {proc.returncode}:\n{_tail(log)}")
        figures = parse_sysbench(log.read_text(errors="replace"))
        if "transactions" not in figures:
            raise BenchError(f"no figures in sysbench's output:\n{_tail(log)}")
        processes["sysbench"] = {"cpu_s": round(rusage.ru_utime + rusage.ru_stime, 3)}
        return {
            "began": began,
            "ended": ended,
            "base_acked": base_acked,
            "acked_at_end": acked_at_end - base_acked,
            "start_position": start_position,
            "end_position": end_position,
            "connector_at_end": connector_at_end[0] if connector_at_end else None,
            "sysbench": figures,
            "samples": samples,
            "processes": processes,
            "background_cores": sampler.background_cores,
        }

    def _follow(
        self,
        proc: subprocess.Popen[bytes],
        began: float,
        samples: list[dict[str, Any]],
        sampler: Sampler,
        connector: Connector,
        worker: Worker,
        base_acked: int,
    ) -> Any:
        """Until sysbench exits (its resource usage returned), a sample every second and a progress line
        every 10 s."""
        next_sample = began
        next_line = began + 10
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            now = time.monotonic()
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage
            if now >= next_sample:
                samples.append(self._sample(now - began, connector, worker, base_acked))
                sampler.sample()
                self.session.check()
                next_sample += 1.0
                if now >= next_line:
                    next_line += 10
                    self.progress.log(_sample_line(samples[-1], self.config.time_s))
            if now - began > self.config.time_s + self.config.timeout_s:
                proc.kill()
            time.sleep(0.05)

    def _sample(self, t: float, connector: Connector, worker: Worker, base_acked: int) -> dict[str, Any]:
        end = self.stack.position()
        saved = connector.position()
        acked = acked_offsets([worker])
        return {
            "t_s": round(t, 2),
            "binlog": list(end),
            "connector": list(saved[0]) if saved else None,
            "connector_behind_bytes": _bytes_behind(end, saved[0] if saved else None),
            "acked": None if acked is None else acked_count(acked) - base_acked,
        }

    def _catch_up(
        self, connector: Connector, worker: Worker, sentinels: SentinelRows, run: dict[str, Any]
    ) -> dict[str, Any]:
        """Rewrite the sentinels; the seconds (from sysbench's end) until the connector's checkpoint reached
        the binlog end and until Redis held every sentinel."""
        import redis

        client = redis.Redis.from_url(self.stack.cache.url)
        sampler = self.session.sampler(connector=connector.proc, worker=worker.proc)
        sampler.start()
        written: list[Sentinel] = sentinels.write(self.stack.admin)
        target = run["end_position"]
        connector_s: float | None = None
        last_line = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if connector_s is None and connector.reached(target):
                    connector_s = now - run["ended"]
                if connector_s is not None and not SentinelRows.missing(
                    written, [redis_version_reader(client)]
                ):
                    break
                if now - run["ended"] > self.config.timeout_s:
                    raise TimeoutError(
                        f"timed out after {self.config.timeout_s:.0f} s waiting for the catch-up"
                    )
                sampler.sample()
                self.session.check()
                if now - last_line > 10:
                    last_line = now
                    sample = self._sample(now - run["began"], connector, worker, run["base_acked"])
                    self.progress.log(f"catching up: {_sample_line(sample, None)}")
                time.sleep(0.02)
        finally:
            client.close()
        caught = time.monotonic()
        processes = sampler.stop()
        acked_total = acked_count(acked_offsets([worker])) - run["base_acked"] - len(written)
        return {
            "caught_up_s": caught - run["ended"],
            "connector_caught_up_s": connector_s,
            "acked_total": acked_total,
            "processes": processes,
            "background_cores": sampler.background_cores,
        }

    def _verify(self, worker: Worker) -> dict[str, Any]:
        """``freshkey verify --json`` with the worker's settings (exit 0 or 1 both carry figures)."""
        out = self.root / "verify.json"
        log = self.root / "verify.log"
        with log.open("wb") as fh:
            result = subprocess.run(
                [
                    *(sys.executable, "-m", "pipeline", "verify"),
                    *("--window-ms", str(self.config.window_ms), "--json", str(out)),
                ],
                env=worker.proc.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=self.config.timeout_s,
            )
        if not out.exists():
            raise BenchError(f"freshkey verify exited with {result.returncode} and no figures:\n{_tail(log)}")
        figures: dict[str, Any] = orjson.loads(out.read_bytes())
        figures["exit_code"] = result.returncode
        return figures


def _bytes_behind(end: tuple[str, int], saved: tuple[str, int] | None) -> int | None:
    """Binlog bytes between the connector's checkpoint and the end (None across a binlog rotation)."""
    if saved is None or saved[0] != end[0]:
        return None
    return max(0, end[1] - saved[1])


def _sample_line(sample: dict[str, Any], total_s: int | None) -> str:
    behind = sample["connector_behind_bytes"]
    of = f"/{total_s}" if total_s else ""
    return (
        f"t={sample['t_s']:.0f}{of} s: worker applied {sample['acked'] or 0:,} changes, connector "
        f"{'?' if behind is None else f'{behind / 1e6:,.1f} MB'} of binlog behind"
    )


def _rate(samples: list[dict[str, Any]], key: str) -> float | None:
    """Per second over the samples' span (first to last)."""
    usable = [s for s in samples if s.get(key) is not None]
    if len(usable) < 2 or usable[-1]["t_s"] <= usable[0]["t_s"]:
        return None
    return float(usable[-1][key] - usable[0][key]) / float(usable[-1]["t_s"] - usable[0]["t_s"])


def _figures(
    run: dict[str, Any],
    catch_up: dict[str, Any],
    stats: dict[str, Any],
    verification: dict[str, Any],
    config: SysbenchConfig,
) -> dict[str, Any]:
    sysbench = run["sysbench"]
    seconds = sysbench.get("total_time_s") or (run["ended"] - run["began"])
    changes = catch_up["acked_total"]
    start, end = run["start_position"], run["end_position"]
    binlog_bytes = end[1] - start[1] if start[0] == end[0] else None
    connector_at_end = run["connector_at_end"]
    samples = run["samples"]
    for sample in samples:
        sample["connector_bytes"] = (
            sample["connector"][1] - start[1]
            if sample["connector"] and sample["connector"][0] == start[0]
            else None
        )
    lag = stats.get("lag_ms", {})
    reports = verification.get("reports", [])
    behind = changes - run["acked_at_end"]
    return {
        "sysbench": sysbench,
        "row_changes": changes,
        "row_changes_per_s": round(changes / seconds, 1),
        "sysbench_row_changes": sysbench["transactions"] * ROWS_PER_TRANSACTION,
        "binlog_bytes": binlog_bytes,
        "binlog_bytes_per_s": round(binlog_bytes / seconds, 1) if binlog_bytes is not None else None,
        "at_sysbench_end": {
            "changes_not_applied": behind,
            "changes_applied": run["acked_at_end"],
            "connector_behind_bytes": _bytes_behind(
                end, tuple(connector_at_end) if connector_at_end else None
            ),
            "caught_up_s": round(catch_up["caught_up_s"], 3),
            "connector_caught_up_s": None
            if catch_up["connector_caught_up_s"] is None
            else round(catch_up["connector_caught_up_s"], 3),
            "caught_up_within_target": catch_up["caught_up_s"] <= CAUGHT_UP_TARGET_S,
            "target_s": CAUGHT_UP_TARGET_S,
        },
        "during_run": {
            "worker_applied_per_s": _round(_rate(samples, "acked")),
            "connector_binlog_bytes_per_s": _round(_rate(samples, "connector_bytes")),
            "binlog_written_bytes_per_s": _round(
                binlog_bytes / (run["ended"] - run["began"]) if binlog_bytes is not None else None
            ),
        },
        "lag_ms": {ns: lag[ns] for ns in sorted(lag) if ns.startswith("sbtest")},
        "stages_ms": stats.get("stages_ms", {}),
        "processes": {"run": run["processes"], "catch_up": catch_up["processes"]},
        "cpu_us_per_change": _cpu_per_change(run["processes"], catch_up["processes"], changes),
        "background_cores": {"run": run["background_cores"], "catch_up": catch_up["background_cores"]},
        "verify": {
            "exit_code": verification["exit_code"],
            "checked": verification.get("checked", 0),
            "stale": verification.get("stale", 0),
            "in_flight": verification.get("in_flight", 0),
            "missing": sum(r.get("missing", 0) for r in reports),
            "rows": sum(r.get("rows", 0) for r in reports),
            "unverifiable": verification.get("unverifiable", []),
            "nines_text": verification.get("nines_text"),
        },
        "samples": samples,
    }


def _cpu_per_change(
    run: dict[str, dict[str, float]], catch_up: dict[str, dict[str, float]], changes: int
) -> dict[str, float]:
    """CPU µs per row change of the processes that handle every change (over the run and the catch-up
    together): what following sysbench's rate costs each, whatever the machine left it."""
    return {
        name: round(
            (run[name]["cpu_s"] + catch_up.get(name, {}).get("cpu_s", 0.0)) / max(1, changes) * 1e6, 1
        )
        for name in ("connector", "kafka", "worker", "redis")
        if name in run
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def render(report: dict[str, Any], console: Any) -> None:
    """The report as rich tables."""
    from rich.table import Table

    config, sysbench, end = report["config"], report["sysbench"], report["at_sysbench_end"]
    table = Table(
        title=f"freshkey bench sysbench: oltp_write_only, {config['threads']} threads, {config['time_s']} s "
        f"unthrottled, {config['tables']} x {config['table_size']:,} rows"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    verify = report["verify"]
    during = report["during_run"]

    def num(value: Any, fmt: str = ",.0f") -> str:
        return "-" if value is None else format(value, fmt)

    rows = [
        ("sysbench tps (transactions/s)", num(sysbench.get("transactions_per_s"), ",.1f")),
        (
            "sysbench latency avg / p95 (ms)",
            f"{num(sysbench.get('latency_avg_ms'), '.2f')} / {num(sysbench.get('latency_p95_ms'), '.2f')}",
        ),
        (
            "row changes applied (per s of sysbench)",
            f"{report['row_changes']:,} ({num(report['row_changes_per_s'])}/s)",
        ),
        (
            "binlog written (MB/s)",
            num(during["binlog_written_bytes_per_s"] and during["binlog_written_bytes_per_s"] / 1e6, ".2f"),
        ),
        (
            "connector read rate during the run (MB/s)",
            num(
                during["connector_binlog_bytes_per_s"] and during["connector_binlog_bytes_per_s"] / 1e6, ".2f"
            ),
        ),
        ("worker applied rate during the run (changes/s)", num(during["worker_applied_per_s"])),
        ("at sysbench's end: changes not yet applied", f"{end['changes_not_applied']:,}"),
        (
            "at sysbench's end: connector behind (MB of binlog)",
            num(end["connector_behind_bytes"] and end["connector_behind_bytes"] / 1e6, ".2f"),
        ),
        ("connector at the binlog end after (s)", num(end["connector_caught_up_s"], ".2f")),
        (
            f"caught up after (s; target {end['target_s']:g})",
            f"[{'green' if end['caught_up_within_target'] else 'red'}]{end['caught_up_s']:.2f}[/]",
        ),
    ]
    for namespace, summary in report["lag_ms"].items():
        rows.append(
            (
                f"lag p50 / p99 / max, {namespace} (ms)",
                f"{num(summary.get('p50'), ',.1f')} / {num(summary.get('p99'), ',.1f')} / "
                f"{num(summary.get('max'), ',.1f')}",
            )
        )
    rows += [
        (
            "verify: checked / stale / in flight / missing",
            f"{verify['checked']:,} / [{'red' if verify['stale'] else 'green'}]{verify['stale']}[/] / "
            f"{verify['in_flight']} / {verify['missing']}",
        ),
        (
            "other load on the machine, run / catch-up (cores)",
            f"{report['background_cores']['run']:.2f} / {report['background_cores']['catch_up']:.2f}",
        ),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    cpu = Table(title="CPU per process (µs per change: run and catch-up together; cores at sysbench's rate)")
    cpu.add_column("process")
    cpu.add_column("s during the run", justify="right")
    cpu.add_column("s catch-up", justify="right")
    cpu.add_column("µs per change", justify="right")
    cpu.add_column("cores at sysbench's rate", justify="right")
    processes, per_change = report["processes"], report["cpu_us_per_change"]
    for name in dict.fromkeys([*processes["run"], *processes["catch_up"]]):
        us = per_change.get(name)
        cpu.add_row(
            name,
            num(processes["run"].get(name, {}).get("cpu_s"), ".2f"),
            num(processes["catch_up"].get(name, {}).get("cpu_s"), ".2f"),
            num(us, ",.1f"),
            num(None if us is None else us * report["row_changes_per_s"] / 1e6, ".2f"),
        )
    console.print(cpu)
