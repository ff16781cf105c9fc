"""What every measurement of ``freshkey bench pipeline`` shares: the :class:`Session` of one bench run
(its settings, services, freshkey processes and random numbers), polling for the end of a measurement,
and the record of one."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.bench.config import BenchConfig, BenchError, Progress
from pipeline.bench.procs import FreshkeyProcess, Sampler, wait_until
from pipeline.bench.roles import Worker
from pipeline.bench.stack import Stack


class Session:
    """One bench run: its config and progress, the private services (``stack``), the freshkey processes
    it started (``procs``: each is checked while the bench waits, and stopped at the end) and the random
    numbers of every change it writes (``rng``)."""

    def __init__(self, config: BenchConfig, progress: Progress, stack: Stack) -> None:
        self.config = config
        self.progress = progress
        self.stack = stack
        self.rng = random.Random(config.seed)
        self.procs: list[FreshkeyProcess] = []

    def check(self) -> None:
        for proc in self.procs:
            proc.check()

    def start(self, *procs: FreshkeyProcess) -> None:
        for proc in procs:
            self.procs.append(proc)
            proc.start()

    def sampler(self, **named: FreshkeyProcess) -> Sampler:
        pids = {name: proc.pid for name, proc in named.items()}
        return Sampler({**pids, **self.stack.service_pids(), "bench": os.getpid()})

    def wait_assigned(self, workers: Sequence[Worker]) -> None:
        """Until ``workers`` (one consumer group) hold every partition between them, each at least one,
        and the same assignment is seen twice 0.5 s apart."""
        partitions = set(range(self.config.partitions))

        def settled() -> tuple[frozenset[int], ...] | None:
            held: list[frozenset[int]] = []
            for worker in workers:
                progress = worker.progress()
                if progress is None:
                    return None
                held.append(frozenset(p for p, (_, assigned) in progress.items() if assigned))
            union = set().union(*held)
            if union != partitions or any(not h for h in held) or sum(map(len, held)) != len(partitions):
                return None
            return tuple(held)

        def stable() -> bool:
            first = settled()
            if first is None:
                return False
            time.sleep(0.5)
            return settled() == first

        wait_until(
            stable,
            self.config.timeout_s,
            f"{len(workers)} worker(s) to hold every partition",
            self.check,
            0.2,
        )


class Scenario:
    """A scenario of one bench run, with its session's config, progress, services and rng at hand."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.config = session.config
        self.progress = session.progress
        self.stack = session.stack
        self.rng = session.rng


def poll(
    done: Callable[[], float | None],
    sampler: Sampler,
    check: Callable[[], None],
    timeout_s: float,
    what: str,
) -> float:
    """Poll ``done`` (the fraction done, None when unknown) until it reaches 1; the monotonic time it
    was seen. Sleeps half the predicted remaining time (5 ms to 100 ms), so polling stays cheap for the
    processes measured and the end is seen within a few milliseconds."""
    start = time.monotonic()
    while True:
        fraction = done()
        now = time.monotonic()
        if fraction is not None and fraction >= 1:
            return now
        sampler.sample()
        check()
        if now - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        if fraction is not None and fraction > 0:
            remaining = (now - start) * (1 - fraction) / fraction
            time.sleep(min(0.1, max(0.005, remaining / 2)))
        else:
            time.sleep(0.02)


def measurement(
    items: int, seconds: float, processes: Mapping[str, Mapping[str, float]], sampler: Sampler
) -> dict[str, Any]:
    if seconds <= 0:
        raise BenchError(f"a measurement took {seconds:.6f} s: the clock went wrong")
    return {
        "items": items,
        "seconds": round(seconds, 6),
        "per_s": round(items / seconds, 1),
        "processes": per_item(processes, items),
        "background_cores": sampler.background_cores,
    }


def per_item(processes: Mapping[str, Mapping[str, float]], items: int) -> dict[str, dict[str, float]]:
    """Each process's figures plus its CPU µs per item (change, row or write)."""
    return {
        name: {**figures, "cpu_us_per_item": round(figures["cpu_s"] / max(1, items) * 1e6, 1)}
        for name, figures in processes.items()
    }
