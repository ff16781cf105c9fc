"""A private redis-server, for `freshkey demo` and the tests (see pipeline.embedded)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.embedded.process import HOST, LocalService, find_binary

if TYPE_CHECKING:
    pass


class LocalRedis(LocalService):
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
        self._binary = find_binary(["redis-server"], "apt-get update && apt-get install -y redis-server")

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
