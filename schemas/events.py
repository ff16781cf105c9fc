"""Events on freshkey's topics: a Debezium-style change envelope, DDL records and dead letters.

All models are frozen and strict: an unknown op, a missing primary key or a value of the wrong type is a
validation error, never coerced. Encoding and decoding live in :mod:`schemas.codec`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Op = Literal["c", "u", "d", "r"]
"""c = create (insert), u = update, d = delete, r = read (snapshot)."""

KeyValue = int | str
Row = dict[str, Any]

MAX_U64 = 2**64 - 1
MAX_U32 = 2**32 - 1
MAX_TS_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last instant of the calendar every database and language can hold."""
MAX_TS_US = MAX_TS_MS * 1000 + 999
_MISSING: Any = object()


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class Source(FrozenModel):
    """Where in the source's binlog a change was read."""

    server_id: int = Field(ge=0, le=MAX_U32)
    file: str = Field(min_length=1, max_length=512)
    pos: int = Field(
        ge=0, le=MAX_U64, description="End position of the binlog event that carried the change."
    )
    row: int = Field(0, ge=0, le=MAX_U32, description="Index of the row inside that event.")
    gtid: str | None = Field(None, max_length=512)
    ts_ms: int = Field(ge=0, le=MAX_TS_MS, description="Binlog event timestamp (one-second resolution), ms.")
    db: str = Field(min_length=1, max_length=256)
    table: str = Field(min_length=1, max_length=256)


class ChangeEvent(FrozenModel):
    """One row change. ``key`` is the primary key; ``version`` orders the row's changes (schemas.versions).

    ``oversize``: the row's event would not fit in a Kafka message, so the connector sent it without its
    images. The worker turns it into an invalidation of the row's entries (the application reads the row
    through), never a write.
    """

    kind: Literal["change"] = "change"
    event_id: str = Field(min_length=1, description="Stable across replays: server, file, position, row.")
    op: Op
    key: dict[str, KeyValue] = Field(min_length=1)
    before: Row | None = None
    after: Row | None = None
    source: Source
    ts_ms: int = Field(
        ge=0, le=MAX_TS_MS, description="When the connector read the change, ms since the epoch."
    )
    version: int = Field(ge=0, le=MAX_U64)
    commit_ts_us: int = Field(
        ge=0, le=MAX_TS_US, description="Commit time, µs since the epoch (best source available)."
    )
    commit_ts_coarse: bool = Field(
        description="True when commit_ts_us comes from the binlog's one-second timestamp."
    )
    oversize: bool = Field(
        False,
        exclude_if=lambda v: not v,  # on the wire only when true
        description="The images were left out (too large for a message): invalidate, never write.",
    )

    @model_validator(mode="after")
    def _images_match_op(self) -> ChangeEvent:
        if self.oversize:
            if self.before is not None or self.after is not None:
                raise ValueError("an oversize change carries no images")
            return self
        needs_before = self.op in ("u", "d")
        needs_after = self.op in ("c", "u", "r")
        if needs_before != (self.before is not None):
            raise ValueError(f"op {self.op!r} {'needs' if needs_before else 'must not have'} a before image")
        if needs_after != (self.after is not None):
            raise ValueError(f"op {self.op!r} {'needs' if needs_after else 'must not have'} an after image")
        key = self.key
        for image_name, image in (("before", self.before), ("after", self.after)):
            if image is None:
                continue
            for column, value in key.items():
                held = image.get(column, _MISSING)
                if held is _MISSING:
                    raise ValueError(f"primary key column {column!r} missing from the {image_name} image")
                if held != value:
                    raise ValueError(
                        f"primary key column {column!r} is {held!r} in the {image_name} image "
                        f"but {value!r} in the key"
                    )
        return self

    @property
    def table(self) -> tuple[str, str]:
        return self.source.db, self.source.table


class DdlEvent(FrozenModel):
    """A schema change (CREATE/ALTER/DROP/RENAME...) seen in the binlog, recorded in order."""

    kind: Literal["ddl"] = "ddl"
    event_id: str = Field(min_length=1)
    source: Source
    query: str = Field(min_length=1)
    ts_ms: int = Field(ge=0, le=MAX_TS_MS)


FENCE_REASON_CHARS = 1000


class FenceEvent(FrozenModel):
    """The connector could not read a rows event of a bound table: its changes are lost, so nothing cached
    of the table can be vouched for. The worker fences the table's namespace (``pipeline.fence``).

    The connector sends one to every partition of the change topic, at the event's place in the binlog:
    each partition's fence comes after every change of that partition read before the lost event, so the
    last of them comes after all of them (a change applied after a fence carries the new epoch, and would
    be served)."""

    kind: Literal["fence"] = "fence"
    event_id: str = Field(min_length=1)
    source: Source
    reason: str = Field(min_length=1, max_length=FENCE_REASON_CHARS)
    ts_ms: int = Field(ge=0, le=MAX_TS_MS)


Envelope = Annotated[ChangeEvent | DdlEvent | FenceEvent, Field(discriminator="kind")]
"""What the change topic carries."""


class DeadLetter(FrozenModel):
    """A message that could not be processed, with the reason and (a bounded copy of) the original bytes.

    ``original_b64`` holds the whole original when it is at most the configured bound; above it, its
    first bytes, with ``truncated`` set: ``original_size`` and ``original_sha256`` always describe the
    whole original, so a dead letter never exceeds the producer's message limit.
    """

    kind: Literal["dead-letter"] = "dead-letter"
    reason: str
    stage: str = Field(description="Where it failed: decode, bind, connector...")
    topic: str | None = None
    partition: int | None = Field(None, ge=0, le=MAX_U32)
    offset: int | None = Field(None, ge=0, le=MAX_U64)
    key_b64: str | None = None
    original_b64: str
    original_size: int = Field(0, ge=0, description="Size of the whole original, bytes.")
    original_sha256: str = Field("", description="SHA-256 of the whole original, hex.")
    truncated: bool = Field(False, description="original_b64 holds only the first bytes of the original.")
    ts_ms: int = Field(ge=0, le=MAX_TS_MS)
