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


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class Source(FrozenModel):
    """Where in the source's binlog a change was read."""

    server_id: int = Field(ge=0)
    file: str = Field(min_length=1)
    pos: int = Field(ge=0, description="End position of the binlog event that carried the change.")
    row: int = Field(0, ge=0, description="Index of the row inside that event.")
    gtid: str | None = None
    ts_ms: int = Field(ge=0, description="Binlog event timestamp (one-second resolution), ms.")
    db: str = Field(min_length=1)
    table: str = Field(min_length=1)


class ChangeEvent(FrozenModel):
    """One row change. ``key`` is the primary key; ``version`` orders the row's changes (schemas.versions)."""

    kind: Literal["change"] = "change"
    event_id: str = Field(min_length=1, description="Stable across replays: server, file, position, row.")
    op: Op
    key: dict[str, KeyValue] = Field(min_length=1)
    before: Row | None = None
    after: Row | None = None
    source: Source
    ts_ms: int = Field(ge=0, description="When the connector read the change, ms since the epoch.")
    version: int = Field(ge=0, le=2**64 - 1)
    commit_ts_us: int = Field(ge=0, description="Commit time, µs since the epoch (best source available).")
    commit_ts_coarse: bool = Field(
        description="True when commit_ts_us comes from the binlog's one-second timestamp."
    )

    @model_validator(mode="after")
    def _images_match_op(self) -> ChangeEvent:
        needs_before = self.op in ("u", "d")
        needs_after = self.op in ("c", "u", "r")
        if needs_before != (self.before is not None):
            raise ValueError(f"op {self.op!r} {'needs' if needs_before else 'must not have'} a before image")
        if needs_after != (self.after is not None):
            raise ValueError(f"op {self.op!r} {'needs' if needs_after else 'must not have'} an after image")
        for image_name in ("before", "after"):
            image = getattr(self, image_name)
            if image is None:
                continue
            for column, value in self.key.items():
                if column not in image:
                    raise ValueError(f"primary key column {column!r} missing from the {image_name} image")
                if image[column] != value:
                    raise ValueError(
                        f"primary key column {column!r} is {image[column]!r} in the {image_name} image "
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
    ts_ms: int = Field(ge=0)


Envelope = Annotated[ChangeEvent | DdlEvent, Field(discriminator="kind")]
"""What the change topic carries."""


class DeadLetter(FrozenModel):
    """A message that could not be processed, with the reason and the original bytes (base64)."""

    kind: Literal["dead-letter"] = "dead-letter"
    reason: str
    stage: str = Field(description="Where it failed: decode, bind, connector...")
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key_b64: str | None = None
    original_b64: str
    ts_ms: int = Field(ge=0)
