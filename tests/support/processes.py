"""Processes of the tests: ``freshkey`` commands started as children, and whether anything a test
started is still running.

:func:`start_freshkey` starts a command the way the harness does (its own session, its output in a log
file, killed by the kernel when the test process dies). The demo, the bench and the embedded services
promise to stop everything they started; :func:`processes_mentioning`, :func:`left_running` and
:func:`gone` check that from outside, on Linux's ``/proc``, polling with a deadline (a stopped process
may take a moment to be reaped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import preexec_die_with_parent


def processes_mentioning(text: str) -> list[int]:
    """Live processes (this one aside) whose command line or environment mentions ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


def left_running(workdir: Path, timeout_s: float = 10) -> list[int]:
    """The processes still mentioning ``workdir`` after waiting up to ``timeout_s`` for them to go
    (empty when everything started there is gone)."""
    deadline = time.monotonic() + timeout_s
    while processes_mentioning(str(workdir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_mentioning(str(workdir))


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether the process ``pid`` no longer exists (reaped, not a zombie of ours) within ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def interruptible() -> Callable[[], None]:
    """A ``preexec_fn`` for a child a test sends Ctrl-C (SIGINT): its SIGINT back to the default, and the
    child killed by the kernel when this process dies (as :func:`preexec_die_with_parent`).

    A shell that starts the test run in the background (``(make test &)``) leaves SIGINT ignored in every
    process under it, and Python started with SIGINT ignored keeps it so: no KeyboardInterrupt, and a
    Ctrl-C test then fails for its harness, not for the code (seen in a clean-clone run started that
    way: ``freshkey snapshot`` ran to the end instead of cancelling)."""
    die = preexec_die_with_parent()

    def run() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if die is not None:
            die()

    return run


def start_freshkey(args: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m pipeline <args>`` with ``env``: in its own session (process group), stdout and stderr
    to ``log_path`` (replaced), killed by the kernel when this process dies (Linux, main thread)."""
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(),
        )


def wait_for_stats(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout_s: float = 60) -> None:
    """Until the worker ``proc`` answers ``/freshkey/stats`` on ``port``; an AssertionError with the tail of
    its log when it exits first or ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s
    while fetch_stats(f"http://127.0.0.1:{port}/freshkey/stats") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            state = (
                f"exited with {proc.returncode}" if proc.poll() is not None else f"silent for {timeout_s:g} s"
            )
            raise AssertionError(
                f"the worker did not start ({state}):\n" + log_path.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.1)
