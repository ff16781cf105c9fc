"""TLS for the private servers of the tests: certificate files, and a TLS front for a server without TLS.

Tansu 0.6.0 cannot serve TLS from its command line (``broker --cert`` and ``--key`` sit in one clap
group, so giving both is refused: "the argument '--cert <CERT>' cannot be used with '--key <KEY>'", and
either alone leaves a plaintext listener). :class:`TlsFront` terminates TLS in front of it: clients speak
real TLS to the front's port (the broker's advertised listener), the front forwards the bytes to the
broker's plaintext port on 127.0.0.1. What the clients do (handshake, certificate and hostname checks)
is exactly what they do against a TLS broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pipeline.embedded.process import HOST, ServiceStartError, free_port

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A server's certificate chain and key (PEM), and the CA (PEM) that signed it (and that verifies
    client certificates, where a server asks for them)."""

    cert: Path
    key: Path
    ca: Path


class TlsFront:
    """A TLS listener on 127.0.0.1 that forwards each connection's plaintext to ``backend_port``.

    Runs its own event loop in a daemon thread of this process; :meth:`stop` closes the listener and
    every connection. Handshake failures (a client that does not trust the certificate) close that
    connection only and are counted in :attr:`handshake_failures`.
    """

    def __init__(self, backend_port: int, tls: TlsFiles, *, port: int | None = None) -> None:
        self.backend_port = backend_port
        self.tls = tls
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.handshake_failures = 0
        self.connections = 0

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("TLS front not started")
        return self._port

    def start(self, timeout: float = 10.0) -> Self:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = self._loop = asyncio.new_event_loop()
        loop.set_exception_handler(self._on_loop_error)

        async def serve() -> None:
            port = self._port if self._port is not None else free_port()
            self._server = await asyncio.start_server(self._handle, HOST, port, ssl=context)
            self._port = port

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(serve())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="tls-front", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:
            raise ServiceStartError(f"TLS front did not start: {failure[0] if failure else 'timeout'}")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            if self._server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._server.wait_closed(), 2.0)

        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), loop).result(5.0)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        self._loop = self._thread = self._server = None

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, ssl.SSLError | ConnectionError | OSError):
            self.handshake_failures += 1
            log.debug("TLS front: %s", context.get("message"), exc_info=exc)
            return
        loop.default_exception_handler(context)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.backend_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_writer)
