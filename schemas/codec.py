"""Wire codec: events to and from JSON bytes.

Encoding and strict decoding run in pydantic-core (Rust); cache values use orjson with sorted keys so the
same row always gives the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.errors import InvalidInput
from schemas.events import ChangeEvent, DdlEvent, DeadLetter, Envelope, FenceEvent, KeyValue

_ENVELOPE: TypeAdapter[ChangeEvent | DdlEvent | FenceEvent] = TypeAdapter(Envelope)


class DecodeError(InvalidInput):
    """A message on a freshkey topic is not a valid event; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(event: ChangeEvent | DdlEvent | FenceEvent | DeadLetter) -> bytes:
    return event.model_dump_json().encode()


def decode(data: bytes) -> ChangeEvent | DdlEvent | FenceEvent:
    """Decode and validate one change-topic message; raises :class:`DecodeError` with the reason."""
    try:
        return _ENVELOPE.validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]]
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise DecodeError("; ".join(parts) + more) from None


DEAD_LETTER_ORIGINAL_BYTES = 256 * 1024
"""Default bound of the original bytes a dead letter carries (base64 makes it 4/3 larger)."""
DEAD_LETTER_REASON_CHARS = 1000
DEAD_LETTER_STAGE_CHARS = 100
DEAD_LETTER_TOPIC_CHARS = 300
DEAD_LETTER_KEY_BYTES = 1024
DEAD_LETTER_OVERHEAD_BYTES = (
    6 * (DEAD_LETTER_REASON_CHARS + DEAD_LETTER_STAGE_CHARS + DEAD_LETTER_TOPIC_CHARS)
    + 4 * ((DEAD_LETTER_KEY_BYTES + 2) // 3)
    + 1024
)
"""Room a dead letter needs besides its original, at worst: JSON writes a control character of the reason,
stage or topic as 6 bytes (``\\u0001``), the key is base64, and the field names, offsets and digests fit in
1 KiB."""


def dead_letter_size_bound(max_original_bytes: int) -> int:
    """The largest encoded dead letter :func:`dead_letter` can make with this bound on the original."""
    return 4 * ((max_original_bytes + 2) // 3) + DEAD_LETTER_OVERHEAD_BYTES


def dead_letter(
    reason: str,
    original: bytes,
    *,
    stage: str,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    key: bytes | None = None,
    max_original_bytes: int = DEAD_LETTER_ORIGINAL_BYTES,
) -> DeadLetter:
    """A dead letter whose encoded size is bounded by :func:`dead_letter_size_bound` whatever the input:
    the original is cut to ``max_original_bytes`` (its size and SHA-256 kept), the reason and the key to
    a few KiB."""
    if len(reason) > DEAD_LETTER_REASON_CHARS:
        reason = (
            reason[: DEAD_LETTER_REASON_CHARS - 20]
            + f"... (+{len(reason) - DEAD_LETTER_REASON_CHARS + 20} chars)"
        )
    kept = original[:max_original_bytes]
    return DeadLetter(
        reason=reason,
        stage=stage[:DEAD_LETTER_STAGE_CHARS],
        topic=topic[:DEAD_LETTER_TOPIC_CHARS] if topic is not None else None,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key[:DEAD_LETTER_KEY_BYTES]).decode() if key is not None else None,
        original_b64=base64.b64encode(kept).decode(),
        original_size=len(original),
        original_sha256=hashlib.sha256(original).hexdigest(),
        truncated=len(kept) < len(original),
        ts_ms=int(time.time() * 1000),
    )


def encode_value(value: Mapping[str, Any]) -> bytes:
    """Canonical JSON of a cache value: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")
"""What ``quote(text, safe="")`` leaves as it is: ASCII letters, digits and ``_.~-`` (RFC 3986 unreserved)."""


def _quoted(value: KeyValue) -> str:
    # quote() costs about 1 µs a call, two calls per change on the worker's hot path; the text of an
    # integer (digits and "-") and a text of unreserved characters only come out of it unchanged.
    text = str(value)
    if type(value) is int or _UNQUOTED.fullmatch(text):
        return text
    return quote(text, safe="")


def row_key(values: Sequence[KeyValue]) -> str:
    """The row part of a cache key: key column values in order, percent-encoded, joined by ``/``."""
    return "/".join([_quoted(v) for v in values])


def message_key(db: str, table: str, key: Mapping[str, KeyValue]) -> bytes:
    """Kafka message key of a row's changes: ``db/table/<row key>``, each part percent-encoded."""
    return f"{quote(db, safe='')}/{quote(table, safe='')}/{row_key(list(key.values()))}".encode()
