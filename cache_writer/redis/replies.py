"""Decoding Redis replies the same way whichever path they took (a reply that followed a cluster redirect
comes back unparsed: a flat list for HGETALL, bytes where a parsed reply may hold str)."""

from __future__ import annotations

from typing import Any


def hash_fields(reply: Any) -> dict[bytes, bytes]:
    """An HGETALL reply as a dict of bytes, from a dict or a flat ``[field, value, ...]`` list."""
    if isinstance(reply, dict):
        return {as_bytes(k): as_bytes(v) for k, v in reply.items()}
    items = list(reply or [])
    return {as_bytes(k): as_bytes(v) for k, v in zip(items[0::2], items[1::2], strict=True)}


def as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def as_text(value: Any) -> str:
    """A reply element as text (bytes decoded as UTF-8)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def raise_errors(replies: list[Any]) -> list[Any]:
    """``replies`` when none is an error reply; else the first error is raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
