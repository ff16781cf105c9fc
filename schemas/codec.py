"""Wire codec: events to and from JSON bytes.

Encoding and strict decoding run in pydantic-core (Rust); cache values use orjson with sorted keys so the
same row always gives the same bytes.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.events import ChangeEvent, DdlEvent, DeadLetter, Envelope, KeyValue

_ENVELOPE: TypeAdapter[ChangeEvent | DdlEvent] = TypeAdapter(Envelope)


class DecodeError(ValueError):
    """A message on a freshkey topic is not a valid event; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(event: ChangeEvent | DdlEvent | DeadLetter) -> bytes:
    return event.model_dump_json().encode()


def decode(data: bytes) -> ChangeEvent | DdlEvent:
    """Decode and validate one change-topic message; raises :class:`DecodeError` with the reason."""
    try:
        return _ENVELOPE.validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]]
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise DecodeError("; ".join(parts) + more) from None


def dead_letter(
    reason: str,
    original: bytes,
    *,
    stage: str,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    key: bytes | None = None,
) -> DeadLetter:
    return DeadLetter(
        reason=reason,
        stage=stage,
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        original_b64=base64.b64encode(original).decode(),
        ts_ms=int(time.time() * 1000),
    )


def encode_value(value: Mapping[str, Any]) -> bytes:
    """Canonical JSON of a cache value: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def row_key(values: Sequence[KeyValue]) -> str:
    """The row part of a cache key: key column values in order, percent-encoded, joined by ``/``."""
    return "/".join(quote(str(v), safe="") for v in values)


def message_key(db: str, table: str, key: Mapping[str, KeyValue]) -> bytes:
    """Kafka message key of a row's changes: ``db/table/<row key>``, each part percent-encoded."""
    return f"{quote(db, safe='')}/{quote(table, safe='')}/{row_key(list(key.values()))}".encode()
