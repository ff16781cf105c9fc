"""Kafka SASL, server side, for the test broker's front: SaslHandshake and SaslAuthenticate with PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, as Kafka uses it: KIP-84).

Tansu 0.6.0 cannot authenticate clients here (measured with librdkafka against ``tansu broker
--storage-engine memory://tansu/``): without ``--authentication`` it answers every SaslHandshake with
UNSUPPORTED_SASL_MECHANISM (while listing SCRAM-SHA-512); with it, PLAIN gets NoSharedMechanism and
SCRAM-SHA-256/512 get "unknown-user", because users live in the storage engine and ``tansu user create``
is itself a client that must log in first (a user made before a restart with ``--authentication`` is
gone with the memory storage; postgres:// and s3:// storage are not available to the tests). So the front of
:class:`~pipeline.embedded.kafka.LocalKafka` does it: it answers the two SASL requests of each new
connection, lets ApiVersions through before, refuses anything else until the login succeeded, and from
then on forwards bytes untouched. What a client does is what it does against Apache Kafka with SASL:
the same requests (header versions, flexible SaslAuthenticate v2 included), the same error code (58,
SASL_AUTHENTICATION_FAILED) for a wrong password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
SCRAM_ITERATIONS = 4096
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class SaslFailure(Exception):
    """A login that failed; the message goes back to the client."""


@dataclass(frozen=True, slots=True)
class Request:
    """A Kafka request's header fields the front needs, and where its body starts."""

    api_key: int
    api_version: int
    correlation_id: int
    body: bytes
    flexible: bool


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _write_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _skip_tags(data: bytes, at: int) -> int:
    count, at = _uvarint(data, at)
    for _ in range(count):
        _, at = _uvarint(data, at)
        size, at = _uvarint(data, at)
        at += size
    return at


def parse_request(payload: bytes) -> Request:
    """The header of one request (``payload``: a frame without its length)."""
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", payload)
    at = 8
    (client_id_length,) = struct.unpack_from(">h", payload, at)  # nullable string, never compact
    at += 2 + max(client_id_length, 0)
    flexible = api_key == SASL_AUTHENTICATE and api_version >= 2
    if flexible:
        at = _skip_tags(payload, at)
    return Request(api_key, api_version, correlation_id, payload[at:], flexible)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def handshake_response(request: Request, enabled: tuple[str, ...]) -> tuple[bytes, str]:
    """The SaslHandshake answer, and the mechanism asked for."""
    (length,) = struct.unpack_from(">h", request.body)
    mechanism = request.body[2 : 2 + length].decode()
    error = 0 if mechanism in enabled else UNSUPPORTED_SASL_MECHANISM
    names = b"".join(struct.pack(">h", len(m)) + m.encode() for m in enabled)
    body = struct.pack(">ihi", request.correlation_id, error, len(enabled)) + names
    return frame(body), mechanism


def auth_bytes(request: Request) -> bytes:
    if request.flexible:
        length, at = _uvarint(request.body, 0)
        return request.body[at : at + length - 1]
    (length,) = struct.unpack_from(">i", request.body)
    return request.body[4 : 4 + length]


def authenticate_response(request: Request, data: bytes, error: int = 0, message: str | None = None) -> bytes:
    """The SaslAuthenticate answer (v0/v1, or flexible v2) carrying ``data`` or an error."""
    header = struct.pack(">i", request.correlation_id)
    body = struct.pack(">h", error)
    encoded = message.encode() if message is not None else None
    if request.flexible:
        header += b"\x00"  # response header v1: no tagged fields
        body += _write_uvarint(0 if encoded is None else len(encoded) + 1) + (encoded or b"")
        body += _write_uvarint(len(data) + 1) + data
        body += struct.pack(">q", 0) + b"\x00"
    else:
        body += struct.pack(">h", -1) if encoded is None else struct.pack(">h", len(encoded)) + encoded
        body += struct.pack(">i", len(data)) + data
        if request.api_version >= 1:
            body += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication asked
    return frame(header + body)


@dataclass
class SaslLogin:
    """One connection's login: fed each SaslAuthenticate's bytes, answers the next challenge; ``done``
    once the client proved it knows the password of ``user``."""

    mechanism: str
    users: Mapping[str, str]
    user: str | None = None
    done: bool = False
    _bare: str = ""
    """SCRAM: the client-first message without its GS2 header; empty before it came."""
    _server_first: str = ""
    _nonce: str = ""
    _salted: bytes = b""

    def step(self, data: bytes) -> bytes:
        """The server's answer to ``data``; SaslFailure when the login fails."""
        if self.mechanism == "PLAIN":
            return self._plain(data)
        if not self._bare:
            return self._scram_first(data)
        return self._scram_final(data)

    def _plain(self, data: bytes) -> bytes:
        try:
            _authzid, user, password = data.decode().split("\x00")
        except ValueError:
            raise SaslFailure("malformed PLAIN message") from None
        if user not in self.users or not hmac.compare_digest(self.users[user], password):
            raise SaslFailure("Authentication failed: Invalid username or password")
        self.user, self.done = user, True
        return b""

    def _scram_first(self, data: bytes) -> bytes:
        text = data.decode()
        if not text.startswith(("n,", "y,")):
            raise SaslFailure("SCRAM: channel binding is not supported")
        bare = text.split(",", 2)[2]
        attributes = dict(part.split("=", 1) for part in bare.split(","))
        user = attributes.get("n", "").replace("=2C", ",").replace("=3D", "=")
        if user not in self.users:
            raise SaslFailure("Authentication failed during authentication due to invalid credentials")
        salt = secrets.token_bytes(16)
        nonce = attributes["r"] + base64.b64encode(secrets.token_bytes(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
        name = _HASHES[self.mechanism]
        salted = hashlib.pbkdf2_hmac(name, self.users[user].encode(), salt, SCRAM_ITERATIONS)
        self.user = user
        self._bare, self._server_first, self._nonce, self._salted = bare, server_first, nonce, salted
        return server_first.encode()

    def _scram_final(self, data: bytes) -> bytes:
        text = data.decode()
        without_proof, _, proof_part = text.rpartition(",p=")
        attributes = dict(part.split("=", 1) for part in without_proof.split(","))
        if attributes.get("r") != self._nonce:
            raise SaslFailure("SCRAM: nonce mismatch")
        name = _HASHES[self.mechanism]
        salted = self._salted
        message = f"{self._bare},{self._server_first},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", name).digest()
        stored_key = hashlib.new(name, client_key).digest()
        signature = hmac.new(stored_key, message, name).digest()
        proof = base64.b64decode(proof_part)
        if len(proof) != len(signature):
            raise SaslFailure("Authentication failed during authentication due to invalid credentials")
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(name, recovered).digest(), stored_key):
            raise SaslFailure("Authentication failed during authentication due to invalid credentials")
        server_key = hmac.new(salted, b"Server Key", name).digest()
        self.done = True
        return b"v=" + base64.b64encode(hmac.new(server_key, message, name).digest())
