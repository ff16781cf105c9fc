"""What an idle worker costs: CPU of the worker and of the broker while nothing is written.

A worker's Kafka fetch returns after ``FRESHKEY_WORKER_FETCH_MAX_WAIT_MS`` when no change arrives, and the
next one is sent at once, so an idle worker and its broker still work. This harness starts the bench's
stack (:class:`pipeline.bench.stack.Stack`: private MariaDB, Redis and Kafka broker), one
``freshkey worker`` per value of ``--fetch-max-wait-ms`` in turn, waits for it to join its group, and
measures the cores each process uses over ``--seconds`` (:class:`pipeline.bench.procs.Sampler`)::

    .venv/bin/python -m tests.benchmarks.idle_cost --fetch-max-wait-ms 10,500 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

from pipeline.bench.config import BenchConfig
from pipeline.bench.procs import Sampler
from pipeline.bench.roles import Worker, stop_all
from pipeline.bench.stack import Stack


def measure(stack: Stack, wait_ms: int, seconds: float, join_timeout_s: float = 60.0) -> dict[str, float]:
    """Cores per process (worker, kafka, redis) and of the rest of the machine, worker idle."""
    worker = Worker(stack, f"idle{wait_ms}", f"worker-{wait_ms}")
    worker.proc.env["FRESHKEY_WORKER_FETCH_MAX_WAIT_MS"] = str(wait_ms)
    worker.proc.start()
    try:
        deadline = time.monotonic() + join_timeout_s
        while worker.joins() < 1:
            worker.proc.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker did not join its group in {join_timeout_s:.0f} s")
            time.sleep(0.2)
        time.sleep(3.0)  # past the start-up work (assignment, first fetches, first commit)
        pids = {"worker": worker.proc.pid, "kafka": stack.broker.pid, "redis": stack.cache.pid}
        sampler = Sampler({name: pid for name, pid in pids.items() if pid is not None})
        sampler.start()
        started = time.monotonic()
        time.sleep(seconds)
        spent = sampler.stop()
        wall = time.monotonic() - started
    finally:
        stop_all([worker.proc])
    cores = {name: figures["cpu_s"] / wall for name, figures in spent.items()}
    cores["others"] = sampler.background_cores
    return cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch-max-wait-ms", default="10,500", help="comma-separated values")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    waits = [int(v) for v in args.fetch_max_wait_ms.split(",") if v.strip()]
    with tempfile.TemporaryDirectory() as root, contextlib.ExitStack() as services:
        stack = Stack(Path(root), BenchConfig(rates=(), kinds=("single",)), services)
        stack.prepare()
        for wait_ms in waits:
            cores = measure(stack, wait_ms, args.seconds)
            figures = "  ".join(f"{name} {value:.3f}" for name, value in cores.items())
            print(f"fetch_max_wait_ms {wait_ms:>5}: cores  {figures}", flush=True)


if __name__ == "__main__":
    main()
