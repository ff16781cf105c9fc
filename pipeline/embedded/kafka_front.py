"""A front for the test broker: TLS and SASL that Tansu 0.6.0 cannot do itself.

Tansu 0.6.0 cannot serve TLS from its command line (``broker --cert`` and ``--key`` sit in one clap
group, so giving both is refused: "the argument '--cert <CERT>' cannot be used with '--key <KEY>'", and
either alone leaves a plaintext listener), and its ``--authentication`` accepts no SASL mechanism (see
:mod:`pipeline.embedded.sasl`). :class:`KafkaFront` listens where the broker advertises itself and, per
connection: TLS with the given certificate (optional), then the SASL login (optional: PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512 against the given users), then forwards the bytes to the broker's plaintext
port on 127.0.0.1. What the clients do (handshake, certificate and hostname checks, login) is exactly
what they do against a broker that does it itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import threading
from collections.abc import Mapping
from typing import Any, Self

from pipeline.embedded.process import HOST, ServiceStartError, free_port
from pipeline.embedded.sasl import (
    API_VERSIONS,
    ILLEGAL_SASL_STATE,
    MECHANISMS,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    SaslFailure,
    SaslLogin,
    auth_bytes,
    authenticate_response,
    handshake_response,
    parse_request,
)
from pipeline.embedded.tls import TlsFiles

log = logging.getLogger(__name__)

_MAX_FRAME = 100 * 1024 * 1024


class KafkaFront:
    """A listener on 127.0.0.1 (TLS with ``tls``; SASL login with ``sasl_users``, name -> password) that
    forwards each connection to ``backend_port``.

    Runs its own event loop in a daemon thread of this process; :meth:`stop` closes the listener and
    every connection. Counts what it refused: :attr:`handshake_failures` (TLS), :attr:`login_failures`.
    """

    def __init__(
        self,
        backend_port: int,
        *,
        tls: TlsFiles | None = None,
        sasl_users: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.backend_port = backend_port
        self.tls = tls
        self.sasl_users = dict(sasl_users) if sasl_users else None
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.handshake_failures = 0
        self.login_failures = 0
        self.logins: list[tuple[str, str]] = []
        """(user, mechanism) of every successful login."""

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("front not started")
        return self._port

    def start(self, timeout: float = 10.0) -> Self:
        context: ssl.SSLContext | None = None
        if self.tls is not None:
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

        self._thread = threading.Thread(target=run, name="kafka-front", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:
            raise ServiceStartError(f"Kafka front did not start: {failure[0] if failure else 'timeout'}")
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
            log.debug("Kafka front: %s", context.get("message"), exc_info=exc)
            return
        loop.default_exception_handler(context)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.backend_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        try:
            if self.sasl_users is None or await self._login(reader, writer, up_reader, up_writer):
                await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, ValueError, struct.error):
            pass
        finally:
            for each in (writer, up_writer):
                with contextlib.suppress(Exception):
                    each.close()
            self._writers.discard(writer)
            self._writers.discard(up_writer)

    async def _login(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer SaslHandshake and SaslAuthenticate (ApiVersions goes to the broker) until the client
        logged in (True) or failed or asked for anything else first (False: the connection closes)."""
        assert self.sasl_users is not None
        login: SaslLogin | None = None
        while True:
            payload = await _read_frame(reader)
            request = parse_request(payload)
            if request.api_key == API_VERSIONS:
                up_writer.write(struct.pack(">i", len(payload)) + payload)
                await up_writer.drain()
                answer = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(answer)) + answer)
            elif request.api_key == SASL_HANDSHAKE:
                response, mechanism = handshake_response(request, MECHANISMS)
                writer.write(response)
                if mechanism in MECHANISMS:
                    login = SaslLogin(mechanism, self.sasl_users)
            elif request.api_key == SASL_AUTHENTICATE and login is not None:
                try:
                    challenge = login.step(auth_bytes(request))
                except SaslFailure as exc:
                    self.login_failures += 1
                    writer.write(authenticate_response(request, b"", SASL_AUTHENTICATION_FAILED, str(exc)))
                    await writer.drain()
                    return False
                writer.write(authenticate_response(request, challenge))
                if login.done:
                    await writer.drain()
                    self.logins.append((login.user or "", login.mechanism))
                    return True
            elif request.api_key == SASL_AUTHENTICATE:
                writer.write(authenticate_response(request, b"", ILLEGAL_SASL_STATE, "no SaslHandshake yet"))
                await writer.drain()
                return False
            else:
                return False  # Kafka closes a connection that asks for anything else before its login
            await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 <= size <= _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return await reader.readexactly(size)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()
