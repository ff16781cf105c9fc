"""A private redis-server, for `freshkey demo` and the tests (see pipeline.embedded)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.embedded.process import HOST, LocalService, find_binary
from pipeline.embedded.tls import TlsFiles

if TYPE_CHECKING:
    pass


class LocalRedis(LocalService):
    """A private redis-server without persistence, run in the foreground so this process owns its PID.

    ``tls``: TLS only (``--port 0 --tls-port``, client certificates optional, checked against
    ``tls.ca`` when sent). ``users``: ACL users (name -> password) with every permission, and the
    ``default`` user off, so that every connection must log in as one of them.
    """

    _kind = "redis"

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        start_timeout: float = 15.0,
        *,
        tls: TlsFiles | None = None,
        users: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._binary = ""
        self.tls = tls
        self.users = dict(users or {})

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``rediss://`` with TLS), without a user."""
        return f"{'rediss' if self.tls else 'redis'}://{HOST}:{self.port}/0"

    def url_for(self, user: str) -> str:
        """:attr:`url` with ``user`` (the documented ``redis://user@host`` form; the password goes
        apart, in ``FRESHKEY_REDIS_PASSWORD``)."""
        return self.url.replace("://", f"://{user}@", 1)

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.tls is not None:
            args += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "optional",
            ]  # fmt: skip
        else:
            args += ["--port", str(self.port)]
        if self.users:
            args += ["--user", "default", "off"]
            for name, password in self.users.items():
                args += ["--user", name, "on", f">{password}", "~*", "&*", "+@all"]
        return args

    def _resolve_binaries(self) -> None:
        self._binary = find_binary(["redis-server"], "apt-get update && apt-get install -y redis-server")

    def _log_paths(self) -> list[Path]:
        return [self.workdir / "redis.log", self.workdir / "redis.out"]

    def _launch(self) -> None:
        self._spawn(
            [
                self._binary,
                *self._security_args(),
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
        with self._probe_socket() as sock:
            if self.users:
                name, password = next(iter(self.users.items()))
                sock.sendall(_command(b"AUTH", name.encode(), password.encode()))
                if not sock.recv(4096).startswith(b"+OK"):
                    return False
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

    def _probe_socket(self) -> socket.socket:
        sock = socket.create_connection((HOST, self.port), timeout=1.0)
        if self.tls is None:
            return sock
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.check_hostname = False  # readiness only: the certificate's names are the test's business
        return context.wrap_socket(sock)


def _command(*parts: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


# --- Kafka (Tansu) -------------------------------------------------------------------------------------

# Environment variables Tansu reads; the flags below set the first four, the others must not leak in
# from the caller's environment (an OTLP endpoint meant for freshkey itself, for instance).
