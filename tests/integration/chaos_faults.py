"""Faults the fault suite does not make, on demand: services and processes *paused*, and random faults
that *overlap*. Not part of ``make test`` (its name does not start with ``test_``, so pytest collects it
only when named): each run takes 3-4 minutes of a 2-core machine.

    .venv/bin/pytest -s tests/integration/chaos_faults.py [-k paused|-k overlapping]
    CHAOS_SEED=7 CHAOS_S=300 .venv/bin/pytest -s tests/integration/chaos_faults.py -k overlapping

The workload, the private services, the catch-up (sentinel rows served in L2) and the verifier are the
fault suite's (``test_faults.FaultRun``).

- ``paused``: one after another, three times each with longer pauses, L2, L3, the broker, the worker,
  the connector and the database are stopped with SIGSTOP and continued (a frozen container, a process
  that neither answers nor refuses); after each the pipeline catches up and every tier must hold 0
  stale entries, and the accounting of what the worker received must add up.
- ``overlapping``: for ``CHAOS_S`` seconds (150) a random fault starts every 1-5 s, at most two at a
  time, each lasting 0.5-8 s: kill -9 and restart of the connector or the worker, L2 or L3 restarted
  empty, the broker restarted without its topics, or L2, L3, the broker, the worker, the connector or the
  database paused. Then the writer stops, the pipeline must catch up by itself, and 0 stale in L2 and L3.

Stop 31 ran both (seeds 1, 2, 3 of ``overlapping``): every pause and every mix recovered with 0 stale;
the paused L3 held L2 back until the outer tier's attempts were bounded by the fence bound (see
``test_tier_fencing.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.test_faults import (  # noqa: F401  (services: the fixture)
    CONNECTOR_ENV,
    FaultRun,
    Services,
    services,
)

PAUSES_S = {"l2": (1.0, 4.0, 8.0), "l3": (1.0, 4.0, 8.0), "broker": (2.0, 6.0, 12.0)}
PAUSES_S |= {"worker": (1.5, 5.0, 12.0), "connector": (2.0, 6.0, 12.0), "db": (1.0, 4.0, 8.0)}
"""Seconds of each pause, by round: the longest are past the fence bound (1.5 s), the socket timeout
(5 s), the workers' session timeout (2 s here) and librdkafka's wait for an unreachable broker."""


def pause(pid: int | None, seconds: float, *, group: bool = False) -> None:
    """SIGSTOP ``pid`` (its process group with ``group``), then SIGCONT after ``seconds``."""
    assert pid is not None, "the process is not running"
    send: Callable[[int, int], None] = os.killpg if group else os.kill
    send(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        send(pid, signal.SIGCONT)


class PausedRun(FaultRun):
    """The fault suite's run with pauses as its faults (``fault(kind, n)`` calls them by name)."""

    def _paused(self, what: str, pid: int | None, n: int, *, group: bool = False) -> None:
        self.flow()
        pause(pid, PAUSES_S[what][n], group=group)

    def l2_paused(self, n: int) -> None:
        self._paused("l2", self.services.l2.server.pid, n)

    def l3_paused(self, n: int) -> None:
        self._paused("l3", self.services.l3.server.pid, n)

    def broker_paused(self, n: int) -> None:
        self._paused("broker", self.services.kafka.pid, n)

    def worker_paused(self, n: int) -> None:
        self._paused("worker", self.p.procs["worker"].pid, n, group=True)

    def connector_paused(self, n: int) -> None:
        self._paused("connector", self.p.procs["connector"].pid, n, group=True)

    def db_paused(self, n: int) -> None:
        self._paused("db", self.services.db.pid, n)


PAUSED = ("l2_paused", "l3_paused", "broker_paused", "worker_paused", "connector_paused", "db_paused")


def test_every_service_and_process_paused_three_times(services: Services, tmp_path: Path) -> None:  # noqa: F811
    run = PausedRun(services, tmp_path)
    try:
        run.start()
        run.catch_up()
        run.checkpoint()
        for n in range(3):
            for kind in PAUSED:
                started = time.monotonic()
                run.fault(kind, n)
                took = time.monotonic() - started
                seconds = PAUSES_S[kind.split("_")[0]][n]
                print(f"\n{kind} #{n + 1} ({seconds:.1f} s): caught up and verified in {took:.1f} s")
        run.finish()
        print("\n" + run.table())
    finally:
        run.writer.stop()
        run.close()


class Overlapping:
    """Random faults on their own threads, at most two at a time and one per thing."""

    KINDS = (
        "connector_killed", "worker_killed", "l2_restarted", "l3_restarted", "broker_restarted",
        "l2_paused", "l3_paused", "broker_paused", "worker_paused", "connector_paused", "db_paused",
    )  # fmt: skip

    def __init__(self, run: FaultRun) -> None:
        self.run = run
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.threads: list[threading.Thread] = []

    def _do(self, kind: str, seconds: float) -> None:
        run, s = self.run, self.run.services
        p = run.p
        if kind == "connector_killed":
            p.kill9("connector")
            time.sleep(seconds)
            p.launch("connector", **CONNECTOR_ENV)
        elif kind == "worker_killed":
            p.kill9("worker")
            time.sleep(seconds)
            p.launch("worker", **run.worker_env)
        elif kind in ("l2_restarted", "l3_restarted"):
            server = s.l2 if kind == "l2_restarted" else s.l3
            server.stop()
            time.sleep(seconds)
            server.start()
        elif kind == "broker_restarted":
            s.kafka.halt()
            time.sleep(seconds)
            s.kafka.resume()
        else:
            pids = {
                "l2": s.l2.server.pid, "l3": s.l3.server.pid, "broker": s.kafka.pid, "db": s.db.pid,
                "worker": p.procs["worker"].pid, "connector": p.procs["connector"].pid,
            }  # fmt: skip
            what = kind.removesuffix("_paused")
            pause(pids[what], seconds, group=what in ("worker", "connector"))

    def start(self, kind: str, seconds: float) -> None:
        what = kind.rsplit("_", 1)[0]
        with self.lock:
            if what in self.busy or len(self.busy) >= 2:
                return
            self.busy.add(what)
        self.log.append(f"{time.strftime('%H:%M:%S')} {kind} {seconds:.1f} s")
        print(self.log[-1], flush=True)

        def go() -> None:
            try:
                self._do(kind, seconds)
            except Exception as exc:  # a process another fault had killed: noted, the run goes on
                self.log.append(f"  {kind}: {exc!r}")
            finally:
                with self.lock:
                    self.busy.discard(what)

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        self.threads.append(thread)


def test_overlapping_random_faults(services: Services, tmp_path: Path) -> None:  # noqa: F811
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "1")))
    run = FaultRun(services, tmp_path)
    chaos = Overlapping(run)
    try:
        run.start()
        run.catch_up()
        end = time.monotonic() + float(os.environ.get("CHAOS_S", "150"))
        while time.monotonic() < end:
            chaos.start(rng.choice(Overlapping.KINDS), rng.uniform(0.5, 8.0))
            time.sleep(rng.uniform(1.0, 5.0))
        for thread in chaos.threads:
            thread.join(60)
        for name, env in (("connector", CONNECTOR_ENV), ("worker", run.worker_env)):
            if run.p.procs[name].poll() is not None:  # killed by the last fault, never started again
                with contextlib.suppress(AssertionError):
                    run.p.launch(name, **env)
        run.writer.stop()
        assert not run.writer.errors, run.writer.errors[:3]
        run.catch_up(timeout=180)
        verification = run.verify()
        print("\n" + "\n".join(chaos.log))
        print("verify: " + ", ".join(f"{r.tier} {r.to_json()}" for r in verification.reports))
        for report in verification.reports:
            assert report.stale == 0 and report.unverifiable is None, report.to_json()
    finally:
        run.writer.stop()
        run.close()
