"""The worker's fast decoder of change-topic messages: msgspec first, pydantic for everything else.

:func:`schemas.codec.decode` (pydantic) is the reference: it says what a valid message is and why an
invalid one is refused. It costs about 5 µs per change message, the largest single item of the worker's
CPU per change. :func:`decode_change` decodes a change message with msgspec into a :class:`WireChange`
(about 1.3 µs, plus 0.6 µs for the images check) and hands anything msgspec refuses (a DDL or fence
message, a bad message, a number msgspec does not read such as ``NaN``, a message that might be nested
deeper than the reference allows) to the reference decoder, so
that every refusal and its reason are the reference's. msgspec's checks are therefore only required to
be *at least* as strict as the reference's: whatever it accepts, the reference accepts with the same
values (``tests/unit/schemas/test_wire.py`` checks this on generated and mutated messages).

A :class:`WireChange` has the attributes of a :class:`~schemas.events.ChangeEvent`; the worker's planning
takes either (:data:`Change`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.codec import decode
from schemas.events import (
    _MISSING,
    MAX_TS_MS,
    MAX_TS_US,
    MAX_U32,
    MAX_U64,
    ChangeEvent,
    DdlEvent,
    FenceEvent,
    KeyValue,
    Op,
)

Scalar = str | int | float | bool | None
"""A column value without nesting."""


class WireSource(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """:class:`~schemas.events.Source`, as msgspec checks it."""

    server_id: Annotated[int, Meta(ge=0, le=MAX_U32)]
    file: Annotated[str, Meta(min_length=1, max_length=512)]
    pos: Annotated[int, Meta(ge=0)]  # <= MAX_U64: msgspec takes no bound above int64, see __post_init__
    ts_ms: Annotated[int, Meta(ge=0, le=MAX_TS_MS)]
    db: Annotated[str, Meta(min_length=1, max_length=256)]
    table: Annotated[str, Meta(min_length=1, max_length=256)]
    row: Annotated[int, Meta(ge=0, le=MAX_U32)] = 0
    gtid: Annotated[str, Meta(max_length=512)] | None = None

    def __post_init__(self) -> None:
        if self.pos > MAX_U64:
            raise ValueError("pos above 2**64 - 1")


class WireChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """:class:`~schemas.events.ChangeEvent`, as msgspec checks it (the images check included)."""

    kind: Literal["change"]
    event_id: Annotated[str, Meta(min_length=1)]
    op: Op
    key: Annotated[dict[str, KeyValue], Meta(min_length=1)]
    source: WireSource
    ts_ms: Annotated[int, Meta(ge=0, le=MAX_TS_MS)]
    version: Annotated[int, Meta(ge=0)]  # <= MAX_U64, see __post_init__
    commit_ts_us: Annotated[int, Meta(ge=0, le=MAX_TS_US)]
    commit_ts_coarse: bool
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    oversize: bool = False

    def __post_init__(self) -> None:
        # Any refusal here goes back to the reference decoder, which words the reason: only the checks.
        if self.version > MAX_U64:
            raise ValueError("version")
        before, after = self.before, self.after
        if self.oversize:
            if before is not None or after is not None:
                raise ValueError("images")
            return
        op = self.op
        if (op in ("u", "d")) != (before is not None) or (op != "d") != (after is not None):
            raise ValueError("images")
        for image in (before, after):
            if image is not None:
                for column, value in self.key.items():
                    held = image.get(column, _MISSING)
                    if held is _MISSING or held != value:
                        raise ValueError("key")

    @property
    def table(self) -> tuple[str, str]:
        return self.source.db, self.source.table

    def to_event(self) -> ChangeEvent:
        """The same change as the reference's :class:`~schemas.events.ChangeEvent` (validated again)."""
        return ChangeEvent.model_validate(msgspec.to_builtins(self))


class _FlatChange(WireChange, frozen=True, forbid_unknown_fields=True):
    """A :class:`WireChange` whose images hold only scalars, which bounds its depth: most rows, decoded
    without counting openers (and a little faster than ``Any`` values)."""

    before: dict[str, Scalar] | None = None
    after: dict[str, Scalar] | None = None


Change = ChangeEvent | WireChange
"""A row change as the worker plans it: decoded by msgspec, or by pydantic (Debezium input, the fallback)."""

_FLAT = msgspec.json.Decoder(_FlatChange)
_NESTED = msgspec.json.Decoder(WireChange)

_SAFE_OPENERS = 128
"""The most ``{`` and ``[`` bytes a message with nested values (a JSON or SET column) may hold to be
decoded by msgspec. The reference refuses a
message nested deeper than its parser's recursion limit (about 200 levels) while msgspec reads deeper
ones (and raises :class:`RecursionError` only past Python's limit); a message's depth is at most its
number of openers, so one with at most 128 is within both. Any other goes to the reference, which
accepts or refuses it with its own reason (slower: about 5 µs for a small change, more for large JSON)."""


def fast_decode(data: bytes) -> WireChange | None:
    """The change in ``data`` as msgspec decodes it, or ``None`` where the reference must decide: a DDL or
    fence message, a message msgspec refuses, one with nested values and more than
    :data:`_SAFE_OPENERS` openers."""
    try:
        return _FLAT.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    if data.count(b"{") + data.count(b"[") > _SAFE_OPENERS:
        return None
    try:
        return _NESTED.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode_change(data: bytes) -> Change | DdlEvent | FenceEvent:
    """:func:`schemas.codec.decode`, faster for change messages; raises the same
    :class:`~schemas.codec.DecodeError`, with the same reason, for a message that is no valid event."""
    fast = fast_decode(data)
    return fast if fast is not None else decode(data)


__all__ = ["Change", "WireChange", "WireSource", "decode_change", "fast_decode"]
