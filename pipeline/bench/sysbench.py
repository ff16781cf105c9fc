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

import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson

from pipeline.bench.config import BenchConfig, BenchError, Progress
from pipeline.bench.measure import Session
from pipeline.bench.procs import Sampler, wait_until
from pipeline.bench.roles import Connector, Worker, acked_count, acked_offsets, stop_all
from pipeline.bench.runs import bench_folder, finish_report, new_report, tool_version
from pipeline.bench.stack import Stack
from pipeline.bench.sysbench_report import bytes_behind, figures, sample_line
from pipeline.bench.sysbench_tool import (
    COMMIT_TIME_COLUMN,
    DATABASE,
    SENTINEL_NAMESPACE,
    SENTINEL_TABLE,
    SysbenchConfig,
    parse_sysbench,
    sysbench_args,
    sysbench_binary,
)
from pipeline.demo.catchup import Sentinel, SentinelRows, redis_version_reader


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
        began = time.monotonic()
        report = new_report("sysbench", self.config.to_json())
        report["environment"]["sysbench"] = tool_version(self.binary, "--version")
        self.progress.start(6)
        with bench_folder(self.workdir, "freshkey-sysbench-", self.progress) as root, ExitStack() as stack:
            self.progress.step("starting MariaDB (binlog on), Redis and the Kafka broker")
            bench_config = BenchConfig(partitions=self.config.partitions, timeout_s=self.config.timeout_s)
            services = Stack(root, bench_config, stack)
            report["environment"].update(services.versions())
            session = Session(bench_config, self.progress, services)
            stack.callback(lambda: stop_all(session.procs))
            report.update(_Run(self, session, root).run())
        return finish_report(report, began)


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
        return sysbench_args(self.binary, self.config, self.stack.db, command)

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
        self.progress.step(f"sysbench run: {config.threads} threads, {config.time_s} s, {config.pace}")
        run = self._run(connector, worker)
        self.progress.step("waiting for freshkey to catch up")
        catch_up = self._catch_up(connector, worker, sentinels, run)
        stats = worker.stats() or {}
        self.progress.step("freshkey verify")
        verification = self._verify(worker)
        return figures(run, catch_up, stats, verification, config)

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
                    self.progress.log(sample_line(samples[-1], self.config.time_s))
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
            "connector_behind_bytes": bytes_behind(end, saved[0] if saved else None),
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
                    self.progress.log(f"catching up: {sample_line(sample, None)}")
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


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
