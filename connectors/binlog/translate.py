"""From binlog events to what freshkey produces: pure functions, no I/O, no driver objects.

:func:`translate_rows` turns the fields of one rows event (:class:`RowsEvent`: table, primary key, the
row images as the binlog reader returns them, the column types, where and when it was written) into
:class:`ChangeEvent`\\ s, one per row, or a :class:`DeadLetter` for a row that cannot be one. What it
guarantees:

- every value is mapped by its column's type (:mod:`schemas.values`), exactly like a direct read;
- a change of the primary key is a delete of the old row then a create of the new one (the old key's
  entries must go, the new key's be written);
- versions only go forward (:mod:`schemas.versions`): from the binlog coordinates (file, end position,
  row index) or from the GTID and the row's ordinal inside its transaction;
- a row that cannot be a valid change (no primary key, a value that is no form of its type, a version
  out of range) is a dead letter with the reason, never an exception: no row stops the connector.

Schema changes (query events) are :mod:`connectors.binlog.ddl`'s.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from connectors.exceptions import ConfigurationError
from schemas import ChangeEvent, DeadLetter, Source, VersionError, binlog_version, gtid_version
from schemas.codec import dead_letter
from schemas.events import MAX_TS_MS, MAX_U32, MAX_U64, Op, Row
from schemas.values import ColumnType, RowConverter, binlog_row_converter

_Model = TypeVar("_Model", bound=BaseModel)

VersionSource = Literal["binlog", "gtid"]
"""How change versions are computed (``FRESHKEY_CONNECTOR_VERSION_SOURCE``, see schemas.versions)."""

RowsKind = Literal["write", "update", "delete"]
"""The three rows events: WRITE_ROWS (inserts), UPDATE_ROWS, DELETE_ROWS."""


@dataclass(frozen=True, slots=True)
class EventOrigin:
    """Where and when a binlog event was written: the header fields every event carries."""

    server_id: int
    file: str
    end_pos: int
    """End position of the event in ``file`` (the event header's ``log_pos``)."""
    timestamp_s: int
    """The event header's timestamp: the commit time, to the second."""
    gtid: str | None = None
    """The GTID of the transaction the event belongs to, where the server has GTIDs."""

    def source(self, db: str, table: str, row: int = 0) -> Source:
        """The :class:`Source` of a change (row ``row`` of the event) or DDL event of ``db.table``.

        Fields that validation would accept as they are (checked here: exact types, ranges, lengths)
        make the model directly (:func:`_built`); any other value goes through validation, which
        raises its own error."""
        ts_ms = self.timestamp_s * 1000 if type(self.timestamp_s) is int else -1
        gtid = self.gtid
        if (
            type(self.server_id) is int
            and 0 <= self.server_id <= MAX_U32
            and type(self.file) is str
            and 1 <= len(self.file) <= 512
            and type(self.end_pos) is int
            and 0 <= self.end_pos <= MAX_U64
            and type(row) is int
            and 0 <= row <= MAX_U32
            and (gtid is None or (type(gtid) is str and len(gtid) <= 512))
            and 0 <= ts_ms <= MAX_TS_MS
            and type(db) is str
            and 1 <= len(db) <= 256
            and type(table) is str
            and 1 <= len(table) <= 256
        ):
            fields = {
                "server_id": self.server_id,
                "file": self.file,
                "pos": self.end_pos,
                "row": row,
                "gtid": gtid,
                "ts_ms": ts_ms,
                "db": db,
                "table": table,
            }
            return _built(Source, fields, _SOURCE_FIELDS)
        return Source(
            server_id=self.server_id,
            file=self.file,
            pos=self.end_pos,
            row=row,
            gtid=self.gtid,
            ts_ms=self.timestamp_s * 1000,
            db=db,
            table=table,
        )


@dataclass(frozen=True, slots=True)
class RowsEvent:
    """The fields of one rows event that a change needs.

    ``rows`` come in the shape the binlog reader (pymysqlreplication) gives them: ``{"values": ...,
    "none_sources": ...}`` for writes and deletes, ``{"before_values": ..., "after_values": ...,
    "before_none_sources": ..., "after_none_sources": ...}`` for updates, each image a column -> value
    mapping, each ``none_sources`` the reader's reason for a None (``schemas.values.binlog_value``).
    ``column_types``: the table map's types (refined from information_schema); ``primary_key``: its
    columns in order, empty when the table has none.
    """

    kind: RowsKind
    schema: str
    table: str
    primary_key: tuple[str, ...]
    rows: Sequence[Mapping[str, Any]]
    column_types: Mapping[str, ColumnType]
    origin: EventOrigin
    row_converter: RowConverter | None = None
    """``binlog_row_converter(column_types)``, made once per table map by the source; made per event
    when None."""


def translate_rows(
    event: RowsEvent, *, version_source: VersionSource, first_ordinal: int, read_ms: int
) -> Iterator[ChangeEvent | DeadLetter]:
    """The changes of every row of ``event``, in order; a dead letter for each row that is none.

    ``first_ordinal``: the ordinal of the event's first row inside its transaction (rows of earlier
    rows events of the same transaction come before it); row ``i`` has ordinal ``first_ordinal + i``.
    ``read_ms``: when the connector read the event (the changes' ``ts_ms``).
    Raises :class:`ConfigurationError` for ``version_source="gtid"`` on a binlog without GTIDs.
    """
    shared = _Shared(event, version_source, read_ms)
    for index, row in enumerate(event.rows):
        try:
            yield from _row_changes(event, shared, index, row, ordinal=first_ordinal + index)
        except (ValidationError, VersionError, TypeError) as exc:
            yield dead_letter(
                f"row of {event.schema}.{event.table} is not a valid change: {exc}",
                json.dumps(row, default=str).encode(),
                stage="connector",
            )


class _Shared:
    """What every row of one rows event shares, worked out once: its images' converter, its source
    (validated once; each row's is a copy with its own index), the first part of its binlog version,
    and whether its changes can be built without validating each one again (:func:`_built`)."""

    def __init__(self, event: RowsEvent, version_source: VersionSource, read_ms: int) -> None:
        self.convert = event.row_converter or binlog_row_converter(event.column_types)
        self.version_source = version_source
        self.read_ms = read_ms
        self.source: Source | None = None
        # Errors here are raised again for each row (each row a dead letter, as before).
        with contextlib.suppress(ValidationError):
            self.source = event.origin.source(event.schema, event.table)
        self.version: int | None = None
        if version_source == "binlog":
            with contextlib.suppress(VersionError):
                self.version = binlog_version(event.origin.file, event.origin.end_pos, 0)
        self.trusted = self.source is not None and 0 <= read_ms <= MAX_TS_MS

    def row_source(self, event: RowsEvent, index: int) -> Source:
        if self.source is None or not 0 <= index <= MAX_U32:
            return event.origin.source(event.schema, event.table, index)
        if index == 0:
            return self.source  # frozen: the first row's source is the validated one itself
        return _built(Source, {**self.source.__dict__, "row": index}, self.source.__pydantic_fields_set__)

    def row_version(self, event: RowsEvent, index: int, ordinal: int) -> int:
        origin = event.origin
        if self.version_source == "gtid":
            if origin.gtid is None:
                raise ConfigurationError("FRESHKEY_CONNECTOR_VERSION_SOURCE=gtid but the binlog has no GTIDs")
            return gtid_version(origin.gtid, ordinal)
        if self.version is not None and 0 <= index < ROWS_PER_EVENT:
            return self.version | index
        return binlog_version(origin.file, origin.end_pos, index)


ROWS_PER_EVENT = 2**16
"""Rows of one rows event a binlog version can tell apart (schemas.versions)."""

_SOURCE_FIELDS = frozenset({"server_id", "file", "pos", "row", "gtid", "ts_ms", "db", "table"})
_CHANGE_FIELDS = frozenset(
    {
        "event_id",
        "op",
        "key",
        "before",
        "after",
        "source",
        "ts_ms",
        "version",
        "commit_ts_us",
        "commit_ts_coarse",
    }
)
_new = object.__new__
_set = object.__setattr__


def _built(cls: type[_Model], fields: dict[str, Any], fields_set: set[str] | frozenset[str]) -> _Model:
    """An instance of a frozen schema model from fields the translator built and checked: what
    ``model_construct`` makes (pydantic v2's instance layout), without its walk over every field.

    Only for fields that validation would accept as they are (the callers check what can vary: key
    types, ranges); tests/unit/connectors/binlog/test_translate_built.py holds it equal to the validated
    model."""
    instance = _new(cls)
    _set(instance, "__dict__", fields)
    _set(instance, "__pydantic_fields_set__", set(fields_set))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


_STR = frozenset({str})


def _str_names(image: Row | None) -> bool:
    """True when every column name of ``image`` is a ``str`` (validation's ``dict[str, Any]``): the set
    of the names' exact types is {str} or empty (half the cost of an ``all()`` over a generator)."""
    return image is None or set(map(type, image)) <= _STR


def _images(event: RowsEvent, convert: RowConverter, row: Mapping[str, Any]) -> tuple[Row | None, Row | None]:
    """The row's before and after images in JSON form (``schemas.values``, per column type)."""
    if event.kind == "update":
        before = convert(row["before_values"], row.get("before_none_sources"))
        after = convert(row["after_values"], row.get("after_none_sources"))
        return before, after
    image = convert(row["values"], row.get("none_sources"))
    return (None, image) if event.kind == "write" else (image, None)


def _row_changes(
    event: RowsEvent, shared: _Shared, index: int, row: Mapping[str, Any], *, ordinal: int
) -> Iterator[ChangeEvent | DeadLetter]:
    """The change(s) of one row. A generator on purpose: when the create half of a key change fails
    validation, the delete half (which drops the old key's entries) has gone out already."""
    origin = event.origin
    source = shared.row_source(event, index)
    before, after = _images(event, shared.convert, row)
    pk_columns = event.primary_key
    if not pk_columns:
        yield dead_letter(
            f"table {event.schema}.{event.table} has no primary key; freshkey needs one to address rows",
            json.dumps({"before": before, "after": after}, default=str).encode(),
            stage="connector",
        )
        return
    version = shared.row_version(event, index, ordinal)
    base_id = f"{origin.server_id}:{origin.file}:{origin.end_pos}:{index}"
    read_ms = shared.read_ms

    def change(suffix: str, op: Op, image_before: Row | None, image_after: Row | None) -> ChangeEvent:
        image = image_after if image_after is not None else image_before
        assert image is not None
        key: dict[str, Any] = {}
        trusted = shared.trusted and 0 <= version <= MAX_U64
        for column in pk_columns:
            if column not in image:
                raise TypeError(f"primary key column {column!r} is not in the row image")
            value = key[column] = image[column]
            if type(value) is not int and type(value) is not str:
                trusted = False  # validation says why (a key value of another type is a dead letter)
        fields: dict[str, Any] = {
            "kind": "change",
            "event_id": base_id + suffix,
            "op": op,
            "key": key,
            "before": image_before,
            "after": image_after,
            "source": source,
            "ts_ms": read_ms,
            "version": version,
            "commit_ts_us": source.ts_ms * 1000,
            "commit_ts_coarse": True,
        }
        if trusted and _str_names(image_before) and _str_names(image_after):
            # Everything validation checks holds by construction or was checked above.
            fields["oversize"] = False
            return _built(ChangeEvent, fields, _CHANGE_FIELDS)
        del fields["kind"]
        return ChangeEvent(**fields)

    if before is not None and after is not None:
        if any(before[c] != after[c] for c in pk_columns):
            # The primary key changed: the old row is gone, a new row exists.
            yield change(":d", "d", before, None)
            yield change(":c", "c", None, after)
        else:
            yield change("", "u", before, after)
    elif after is not None:
        yield change("", "c", None, after)
    else:
        yield change("", "d", before, None)
