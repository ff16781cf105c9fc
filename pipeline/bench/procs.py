"""Child processes of ``freshkey bench pipeline``: freshkey commands it can freeze, and what they cost.

:class:`FreshkeyProcess` runs one ``freshkey`` command (``python -m pipeline connector`` or ``worker``)
as a child in its own session, its output in a log file. The bench *freezes* it (SIGSTOP) while it is
not the thing being measured and *thaws* it (SIGCONT) when its clock starts: an idle Faust worker polls
the broker every 10 ms and burns about a tenth of a core here, which would otherwise be charged to
whatever else is measured on a 2-core machine, and a frozen connector lets a backlog pile up in the
binlog so that its clock starts with a warm process and the whole backlog waiting.

:class:`Sampler` measures what a set of processes cost over an interval: CPU seconds (user + system,
from each process's CPU-time clock, in nanoseconds: ``/proc/<pid>/stat`` counts 10 ms clock ticks, and a
worker's share of a small drain, 10-30 ms, would read as 0, 1 or 2 ticks) and the largest resident set
size seen (``/proc/<pid>/status`` ``VmRSS``, read at every :meth:`Sampler.sample` call, so a peak between
two samples can be missed; the lifetime peak ``VmHWM`` is reported alongside). Linux only, like the
embedded services it measures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.embedded import preexec_die_with_parent
from pipeline.embedded.process import terminate

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MIB = 1024 * 1024


class BenchProcessError(RuntimeError):
    """A freshkey child exited while the bench needed it; the message holds the tail of its log."""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (all its threads, not its children), to the
    nanosecond, or None when it is gone."""
    try:
        return time.clock_gettime(process_cpu_clock(pid))
    except OSError:  # EINVAL: no such process
        return None


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, all its threads together (what Linux's
    ``clock_getcpuclockid(pid)`` returns, which Python does not expose: ``~pid << 3 | CPUCLOCK_SCHED``).
    ``time.clock_gettime`` on it raises OSError (EINVAL) once the process is gone."""
    return (~pid << 3) | 2


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent busy since boot (``/proc/stat``: user, nice,
    system, irq, softirq, steal)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def memory_bytes(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in bytes, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found: dict[str, int] = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found.get("VmRSS", 0), found.get("VmHWM", 0)


@dataclass
class _Track:
    pid: int
    cpu_start: float
    cpu_end: float
    peak_rss: int = 0
    hwm: int = 0


@dataclass
class Sampler:
    """CPU seconds and peak RSS of named processes between :meth:`start` and :meth:`stop`, and the
    *background*: CPU the rest of the machine used meanwhile (other people's tests on a shared machine),
    in cores on average, so that a noisy figure can be told from a slow one."""

    pids: Mapping[str, int]
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _busy_start: float = 0.0
    _wall_start: float = 0.0
    background_cores: float = 0.0

    def start(self) -> None:
        self._tracks = {}
        self._busy_start = machine_busy_seconds()
        self._wall_start = time.monotonic()
        for name, pid in self.pids.items():
            cpu = cpu_seconds(pid)
            if cpu is not None:
                self._tracks[name] = _Track(pid, cpu, cpu)
        self.sample()

    def sample(self) -> None:
        """Read every process's RSS once (call it as often as the bench polls)."""
        for track in self._tracks.values():
            memory = memory_bytes(track.pid)
            if memory is not None:
                track.peak_rss = max(track.peak_rss, memory[0])
                track.hwm = max(track.hwm, memory[1])

    def stop(self) -> dict[str, dict[str, float]]:
        """``{name: {"cpu_s", "peak_rss_mib", "hwm_mib"}}`` over the interval."""
        self.sample()
        result: dict[str, dict[str, float]] = {}
        for name, track in self._tracks.items():
            cpu = cpu_seconds(track.pid)
            track.cpu_end = cpu if cpu is not None else track.cpu_end
            result[name] = {
                "cpu_s": round(track.cpu_end - track.cpu_start, 6),
                "peak_rss_mib": round(track.peak_rss / _MIB, 1),
                "hwm_mib": round(track.hwm / _MIB, 1),
            }
        wall = time.monotonic() - self._wall_start
        ours = sum(track.cpu_end - track.cpu_start for track in self._tracks.values())
        others = machine_busy_seconds() - self._busy_start - ours
        self.background_cores = round(max(0.0, others) / wall, 2) if wall > 0 else 0.0
        return result


class FreshkeyProcess:
    """One ``freshkey <command>`` child: start, freeze, thaw, stop; its log kept in ``log_path``.

    The child runs in its own session (so SIGSTOP/SIGCONT and the final SIGKILL reach it alone) and
    dies with the bench when the bench is killed (``PR_SET_PDEATHSIG``). :meth:`stop` thaws it first: a
    stopped process would not act on SIGTERM.
    """

    def __init__(self, name: str, command: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.command = command
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self.stopping = False

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline", self.command],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=preexec_die_with_parent(),
            )

    def check(self) -> None:
        """BenchProcessError when the child has exited without being asked to."""
        if self.proc is not None and not self.stopping and self.proc.poll() is not None:
            raise BenchProcessError(
                f"the {self.name} ({self.command}) exited with status {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def log_count(self, text: str) -> int:
        """How many times ``text`` occurs in the log so far (e.g. consumer group joins)."""
        try:
            return self.log_path.read_text(errors="replace").count(text)
        except OSError:
            return 0

    def freeze(self) -> None:
        if self.proc is not None and self.proc.poll() is None and not self.frozen:
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.frozen = False

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGCONT, SIGTERM, then SIGKILL to its process group after ``timeout_s``; always reaps."""
        proc = self.proc
        if proc is None:
            return
        self.stopping = True
        self.thaw()
        terminate(proc, timeout_s)


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    check: Callable[[], None] = lambda: None,
    interval_s: float = 0.05,
) -> float:
    """Poll ``predicate`` until it is true; seconds waited. TimeoutError naming ``what`` after
    ``timeout_s``; ``check`` runs on every round (it raises when a child died)."""
    start = time.monotonic()
    while not predicate():
        check()
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic() - start


def wait_idle(pid: int, timeout_s: float, check: Callable[[], None], busy: float = 0.05) -> None:
    """Until ``pid`` uses less than ``busy`` of a core over 0.3 s."""

    def idle() -> bool:
        start = cpu_seconds(pid)
        time.sleep(0.3)
        end = cpu_seconds(pid)
        return start is not None and end is not None and end - start < busy * 0.3

    wait_until(idle, timeout_s, f"process {pid} to go idle", check, 0)
