"""Certificate files of the private servers' TLS (made by the tests: tests/support/certs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A server's certificate chain and key (PEM), and the CA (PEM) that signed it (and that verifies
    client certificates, where a server asks for them)."""

    cert: Path
    key: Path
    ca: Path
