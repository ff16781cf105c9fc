"""Debezium MySQL change events (Kafka Connect JSON converter) as freshkey events. Pure: no I/O.

Users who already run Debezium's MySQL connector point freshkey's worker at its topics instead of running
freshkey's connector (``FRESHKEY_WORKER_INPUT=debezium``). :func:`decode_any` is the one call the worker
makes per message: a freshkey change topic message is decoded as always; a Debezium message becomes a
:class:`~schemas.events.ChangeEvent` (or a :class:`~schemas.events.DdlEvent` for a schema change or a
truncate), or a :class:`Skip` with the reason (tombstones, heartbeats, transaction markers), or raises
:class:`DebeziumError` (a :class:`~schemas.codec.DecodeError`: a dead letter with the reason).

What is read (the documented format of Debezium 2.x/3.x; docs/debezium.md has the details):

- the value, with or without the ``schema``/``payload`` wrapper: ``op`` (``c``/``u``/``d``/``r``;
  ``t`` truncate), ``before``, ``after``, ``source`` (``file``, ``pos``, ``row``, ``gtid``,
  ``server_id``, ``ts_ms``/``ts_us``, ``db``, ``table``, ``snapshot``), ``ts_ms``, ``transaction``;
  a null value is the tombstone Debezium writes after a delete;
- the key (the row's primary key, or ``message.key.columns``), with or without its wrapper;
- db and table from ``source.db``/``source.table``, else from the topic ``<prefix>.<db>.<table>``.

Column values are decoded with the field's Connect schema when the message has one (``io.debezium.time.*``,
``org.apache.kafka.connect.data.Decimal``, ``io.debezium.data.Bits``...), with the MySQL column type when
known (the worker's ``column_types`` lookup from information_schema, or Debezium's
``__debezium.source.column.type`` parameter), and otherwise with the Debezium settings the user declares
in :class:`DebeziumOptions`; then mapped by ``schemas.values`` into exactly the JSON form of freshkey's own
connector.

Versions (the mixed-replay rule): Debezium's ``source.pos`` is the position where the rows event *starts*
(``BinlogSourceInfo.setEventPosition(EventHeaderV4.getPosition())``, i.e. ``nextPosition -
eventLength``), while freshkey's binlog versions use the position where it *ends*. A Debezium change gets
``binlog_version(file, pos + 1, row)``: for two rows events X before Y in one file, ``start(X) + 1 <=
end(X) <= start(Y) < start(Y) + 1 < end(Y)``, so a later event has the higher version whichever source
delivered either. Snapshot rows (``snapshot`` set, ``op: r``) get ``binlog_version(file, pos, 0)``, at the
binlog position the snapshot was read at: below every change after it. What is not ordered across sources
is two rows of the *same* rows event that touch the same key (an ``UPDATE`` that moves primary keys onto
each other), when one source delivered only part of that event; see docs/debezium.md. GTID versions from
Debezium (``seq << 24 | transaction.total_order - 1``) are not comparable with freshkey's within a
transaction, so :class:`DebeziumOptions` refuses them unless the namespaces are fed by Debezium alone.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.codec import DecodeError, decode
from schemas.events import MAX_U32, ChangeEvent, DdlEvent, Source
from schemas.values import ColumnType, JsonValue, to_json_value
from schemas.versions import VersionError, binlog_version, gtid_version

ColumnTypes = Callable[[str, str], Mapping[str, ColumnType] | None]
"""``(database, table) -> column name -> type`` (e.g. ``connectors.database.column_types``, cached), or
None when the table's types are not known."""

HEARTBEAT_PREFIX = "__debezium-heartbeat"
"""Debezium's default heartbeat topic prefix (``heartbeat.topics.prefix``)."""


class DebeziumError(DecodeError):
    """A Debezium message that cannot become a freshkey event; ``reason`` says why and what to change."""


@dataclass(frozen=True, slots=True)
class Skip:
    """A message that carries no row change for the cache, with the reason (counted, never dead-lettered)."""

    reason: str


class DebeziumTopics(BaseModel):
    """Which topics hold Debezium change events: names, or one regular expression (``regex:<pattern>``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: tuple[str, ...] = ()
    pattern: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> DebeziumTopics:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(
                    f"the topic pattern {self.pattern!r} is not a regular expression: {exc}"
                ) from None
        return self

    @classmethod
    def parse(cls, text: str | list[str] | tuple[str, ...]) -> DebeziumTopics:
        """``FRESHKEY_KAFKA_DEBEZIUM_TOPICS``: ``regex:<pattern>``, a JSON list, or comma-separated names."""
        if isinstance(text, list | tuple):
            return cls(names=tuple(str(t).strip() for t in text if str(t).strip()))
        text = text.strip()
        if text.startswith("regex:"):
            return cls(pattern=text.removeprefix("regex:"))
        if text.startswith("["):
            try:
                names = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"the topic list {text!r} is not a JSON list: {exc}") from None
            return cls.parse(list(names))
        return cls(names=tuple(t.strip() for t in text.split(",") if t.strip()))

    def matches(self, topic: str) -> bool:
        if topic in self.names:
            return True
        return self.pattern is not None and re.fullmatch(self.pattern, topic) is not None


class DebeziumOptions(BaseModel):
    """How the worker reads its input (the settings behind ``FRESHKEY_WORKER_INPUT`` and
    ``FRESHKEY_DEBEZIUM_*``). The ``*_handling_mode`` fields repeat the Debezium connector's own settings
    of the same name: they are used only to decode messages that carry no schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Literal["freshkey", "debezium"] = "freshkey"
    topics: DebeziumTopics = DebeziumTopics()
    version_source: Literal["binlog", "gtid"] = Field(
        "binlog", description="binlog: file/pos/row (mixes safely with freshkey's own); gtid: see the module."
    )
    gtid_debezium_only: bool = Field(
        False,
        description="Acknowledge that namespaces with GTID versions are fed by Debezium alone (never by "
        "freshkey's connector with GTID versions, or fenced when switching).",
    )
    schemaless: Literal["types", "as-is"] = Field(
        "types",
        description="Messages without a schema: types = decode with the table's column types (the worker "
        "reads them from the database), else refuse; as-is = cache the values as Debezium wrote them.",
    )
    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    time_precision_mode: Literal["adaptive_time_microseconds", "adaptive", "connect", "isostring"] = (
        "adaptive_time_microseconds"
    )
    bigint_unsigned_handling_mode: Literal["long", "precise"] = "long"

    @model_validator(mode="after")
    def _gtid_is_acknowledged(self) -> DebeziumOptions:
        if self.input == "debezium" and self.version_source == "gtid" and not self.gtid_debezium_only:
            raise ValueError(
                "FRESHKEY_DEBEZIUM_VERSION_SOURCE=gtid: Debezium numbers the changes inside a transaction "
                "(transaction.total_order counts the change records of every captured table) differently "
                "from freshkey's connector (rows of bound tables), so a namespace that ever held GTID "
                "versions from freshkey's connector could keep an older change of a row changed twice in "
                "one transaction. Use FRESHKEY_DEBEZIUM_VERSION_SOURCE=binlog (safe to mix with freshkey's "
                "own events), or a version_column in the binding; or set "
                "FRESHKEY_DEBEZIUM_GTID_DEBEZIUM_ONLY=true if these namespaces are fed by Debezium alone "
                "(fence them when switching)"
            )
        if self.input == "debezium" and not self.topics.names and self.topics.pattern is None:
            raise ValueError(
                "FRESHKEY_WORKER_INPUT=debezium needs FRESHKEY_KAFKA_DEBEZIUM_TOPICS: the Debezium topics "
                "(comma-separated names, a JSON list, or regex:<pattern>, e.g. "
                "regex:dbserver1\\.inventory\\..*)"
            )
        return self


def decode_any(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    options: DebeziumOptions,
    *,
    column_types: ColumnTypes | None = None,
) -> ChangeEvent | DdlEvent | Skip:
    """Decode one message of the worker's input, whichever kind it is.

    ``input=freshkey``: a freshkey change-topic message (:func:`schemas.codec.decode`). ``input=debezium``:
    a Debezium message (:func:`decode_debezium`). Raises :class:`~schemas.codec.DecodeError` (for
    Debezium: :class:`DebeziumError`) with the reason for a message that is no valid event.
    """
    if options.input == "freshkey":
        return decode(value if value is not None else b"")
    return decode_debezium(topic, key, value, options, column_types=column_types)


def decode_debezium(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    options: DebeziumOptions,
    *,
    column_types: ColumnTypes | None = None,
) -> ChangeEvent | DdlEvent | Skip:
    """One Debezium MySQL message (see the module docstring) as a freshkey event or a :class:`Skip`."""
    if value is None or not value.strip():
        return Skip("tombstone (null value after a delete)")
    if topic.startswith(HEARTBEAT_PREFIX):
        return Skip("heartbeat")
    schema, payload = _unwrap(_parse(value, "value"))
    if payload is None:
        return Skip("tombstone (null payload after a delete)")
    if not isinstance(payload, dict):
        raise DebeziumError(f"the message value is a JSON {type(payload).__name__}, not a change event")
    if _is_heartbeat(schema, payload):
        return Skip("heartbeat")
    if "status" in payload and "op" not in payload:
        return Skip(f"transaction metadata ({payload.get('status')})")
    if "ddl" in payload or "databaseName" in payload:
        return _schema_change(topic, payload)
    try:
        return _change(topic, key, schema, payload, options, column_types)
    except (ValidationError, VersionError, TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, DebeziumError):
            raise
        raise DebeziumError(_reason(exc)) from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:3])
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return str(exc)


def _parse(data: bytes, what: str) -> Any:
    try:
        # Exact numbers: DECIMAL values written as numbers (JsonConverter decimal.format=NUMERIC) and
        # doubles both survive as Decimal and are converted per column type afterwards.
        return json.loads(data, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DebeziumError(f"the message {what} is not JSON: {exc}") from None


def _unwrap(document: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(schema, payload)`` of a JSON-converter document, with or without the wrapper."""
    if isinstance(document, dict) and "payload" in document and set(document) <= {"schema", "payload"}:
        schema = document.get("schema")
        return (schema if isinstance(schema, dict) else None), document["payload"]
    return None, document


def _is_heartbeat(schema: Mapping[str, Any] | None, payload: Mapping[str, Any]) -> bool:
    name = str((schema or {}).get("name") or "")
    return name.endswith(".Heartbeat") or set(payload) == {"ts_ms"}


# -- schema changes and truncates ----------------------------------------------------------------------------


def _source_of(topic: str, raw: Mapping[str, Any], *, pos_offset: int) -> Source:
    db = raw.get("db") or _topic_part(topic, 1)
    table = raw.get("table") or _topic_part(topic, 2) or "*"
    pos = int(raw.get("pos") or 0)
    file = raw.get("file")
    if not file:
        raise DebeziumError("source.file is missing: freshkey orders changes by binlog coordinates")
    return Source(
        server_id=int(raw.get("server_id") or 0) & MAX_U32,
        file=str(file),
        pos=pos + pos_offset,
        row=int(raw.get("row") or 0),
        gtid=str(raw["gtid"]) if raw.get("gtid") else None,
        ts_ms=int(raw.get("ts_ms") or 0),
        db=str(db),
        table=str(table).split(",")[0],
    )


def _topic_part(topic: str, index: int) -> str | None:
    """``<prefix>.<db>.<table>``: the db (1) or table (2) from the right end (prefixes may hold dots)."""
    parts = topic.rsplit(".", 2)
    return parts[index] if len(parts) == 3 else None


def _schema_change(topic: str, payload: Mapping[str, Any]) -> DdlEvent | Skip:
    ddl = str(payload.get("ddl") or "").strip()
    if not ddl:
        return Skip("schema change without a DDL statement")
    raw = dict(payload.get("source") or {})
    raw.setdefault("db", payload.get("databaseName"))
    if not raw.get("db"):
        raise DebeziumError("schema change without a database (source.db / databaseName)")
    source = _source_of(topic + "..", raw, pos_offset=1)
    return DdlEvent(
        event_id=f"dbz:{source.server_id}:{source.file}:{source.pos - 1}:ddl",
        source=source,
        query=ddl,
        ts_ms=int(payload.get("ts_ms") or time.time() * 1000),
    )


# -- row changes ---------------------------------------------------------------------------------------------

_SNAPSHOT_MARKS = {
    "true",
    "first",
    "first_in_data_collection",
    "last",
    "last_in_data_collection",
    "incremental",
}


def _change(
    topic: str,
    key: bytes | None,
    schema: Mapping[str, Any] | None,
    payload: Mapping[str, Any],
    options: DebeziumOptions,
    column_types: ColumnTypes | None,
) -> ChangeEvent | DdlEvent | Skip:
    op = payload.get("op")
    raw_source = payload.get("source")
    if not isinstance(raw_source, dict):
        raise DebeziumError("the change event has no source block")
    if op == "t":
        source = _source_of(topic, raw_source, pos_offset=1)
        return DdlEvent(
            event_id=f"dbz:{source.server_id}:{source.file}:{source.pos - 1}:truncate",
            source=source,
            query=f"TRUNCATE TABLE `{source.db}`.`{source.table}`",
            ts_ms=int(payload.get("ts_ms") or time.time() * 1000),
        )
    if op == "m":
        return Skip("logical decoding message")
    if op not in ("c", "u", "d", "r"):
        raise DebeziumError(f"unknown op {op!r} (expected c, u, d, r or t)")
    snapshot = str(raw_source.get("snapshot", "false")).lower() in _SNAPSHOT_MARKS or op == "r"
    # Streaming: pos + 1 lies inside the rows event (start < pos + 1 <= end), see the module docstring.
    source = _source_of(topic, raw_source, pos_offset=0 if snapshot else 1)
    if source.table == "*":
        raise DebeziumError(
            "the change event names no table (source.table, or a <prefix>.<db>.<table> topic)"
        )
    known = column_types(source.db, source.table) if column_types is not None else None
    if schema is None and known is None and options.schemaless == "types":
        raise DebeziumError(
            f"a message of {source.db}.{source.table} without a schema, and no column types for it: "
            "set value.converter.schemas.enable=true (and key.converter.schemas.enable=true) in Debezium, "
            "or let the worker read the table's column types (FRESHKEY_MYSQL_* pointing at the source), or "
            "set FRESHKEY_DEBEZIUM_SCHEMALESS=as-is to cache values as Debezium encodes them "
            "(docs/debezium.md)"
        )
    row_schema = _row_schema(schema)
    decoder = _Decoder(options, known)
    before = decoder.image(payload.get("before"), row_schema)
    after = decoder.image(payload.get("after"), row_schema)
    key_schema, key_payload = _unwrap(_parse(key, "key")) if key else (None, None)
    if not isinstance(key_payload, dict) or not key_payload:
        raise DebeziumError(
            f"no message key for {source.db}.{source.table}: freshkey addresses rows by their primary key "
            "(give the table one, or set message.key.columns in Debezium)"
        )
    row_key = decoder.image(key_payload, _fields(key_schema))
    assert row_key is not None
    bad_key = {k: v for k, v in row_key.items() if not isinstance(v, int | str) or isinstance(v, bool)}
    if bad_key:
        raise DebeziumError(f"key columns {sorted(bad_key)} are not integers or strings in their JSON form")
    key_values: dict[str, int | str] = {k: v for k, v in row_key.items() if isinstance(v, int | str)}
    version = _version(options, source, payload, snapshot)
    commit_us, coarse = _commit_time(raw_source, snapshot)
    image = after if after is not None else before
    if op == "d":
        after = None
    event_id = f"dbz:{source.server_id}:{source.file}:{int(raw_source.get('pos') or 0)}:{source.row}:{op}"
    if snapshot:
        event_id += ":" + json.dumps(list(row_key.values()), default=str, ensure_ascii=False)
    if image is None:
        raise DebeziumError(f"op {op!r} without a before or after image")
    return ChangeEvent(
        event_id=event_id,
        op=op,
        key=key_values,
        before=before if op in ("u", "d") else None,
        after=after if op in ("c", "u", "r") else None,
        source=source,
        ts_ms=int(payload.get("ts_ms") or time.time() * 1000),
        version=version,
        commit_ts_us=commit_us,
        commit_ts_coarse=coarse,
    )


def _version(options: DebeziumOptions, source: Source, payload: Mapping[str, Any], snapshot: bool) -> int:
    if options.version_source == "binlog":
        return binlog_version(source.file, source.pos, 0 if snapshot else source.row)
    if snapshot:
        # A snapshot row has no transaction of its own: version 0 fills an empty entry and never replaces
        # one (docs/debezium.md: GTID versions and snapshots).
        return 0
    transaction = payload.get("transaction")
    if not isinstance(transaction, dict) or transaction.get("total_order") in (None, ""):
        raise DebeziumError(
            "FRESHKEY_DEBEZIUM_VERSION_SOURCE=gtid needs the transaction block: set "
            "provide.transaction.metadata=true in Debezium (or use binlog versions)"
        )
    if source.gtid is None:
        raise DebeziumError("FRESHKEY_DEBEZIUM_VERSION_SOURCE=gtid but the event has no source.gtid")
    return gtid_version(source.gtid, int(transaction["total_order"]) - 1)


def _commit_time(raw: Mapping[str, Any], snapshot: bool) -> tuple[int, bool]:
    if raw.get("ts_us") is not None:
        micros = int(raw["ts_us"])
        return micros, snapshot or micros % 1_000_000 == 0
    millis = int(raw.get("ts_ms") or 0)
    return millis * 1000, snapshot or millis % 1000 == 0


def _fields(struct_schema: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]] | None:
    if not struct_schema:
        return None
    return {str(f.get("field")): f for f in struct_schema.get("fields") or () if isinstance(f, dict)}


def _row_schema(envelope: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]] | None:
    """Column name -> field schema, from the envelope's ``before`` or ``after`` struct."""
    fields = _fields(envelope)
    if not fields:
        return None
    for image in ("after", "before"):
        found = _fields(fields.get(image))
        if found:
            return found
    return None


# -- column values -------------------------------------------------------------------------------------------

_EXACT = decimal.Context(prec=200)  # DECIMAL has at most 65 digits: never round
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_SOURCE_TYPE = "__debezium.source.column.type"


class _Decoder:
    """Decodes the column values of one message: Debezium's encoding -> a Python value of the MySQL type
    -> ``schemas.values.to_json_value``."""

    def __init__(self, options: DebeziumOptions, known: Mapping[str, ColumnType] | None) -> None:
        self.options = options
        self.known = known or {}

    def image(
        self, values: Any, fields: Mapping[str, Mapping[str, Any]] | None
    ) -> dict[str, JsonValue] | None:
        if values is None:
            return None
        if not isinstance(values, dict):
            raise DebeziumError(f"a row image is a JSON {type(values).__name__}, not an object")
        return {
            str(name): self.value(str(name), value, (fields or {}).get(str(name)))
            for name, value in values.items()
        }

    def value(self, name: str, value: Any, field: Mapping[str, Any] | None) -> JsonValue:
        if value is None:
            return None
        column = self.known.get(name) or (_column_from_schema(field) if field else None)
        if field is None and column is None:  # schema-less and no types: as Debezium wrote it
            return _as_is(value)
        try:
            decoded = (
                _from_schema(value, field, column, self.options.binary_handling_mode)
                if field
                else self._by_type(value, column)
            )
            return to_json_value(decoded, column)
        except (ValueError, TypeError, binascii.Error, ArithmeticError) as exc:
            raise DebeziumError(f"column {name!r}: {exc}") from None

    def _by_type(self, value: Any, column: ColumnType | None) -> Any:
        """A schema-less value of a column whose MySQL type is known, decoded per the declared modes."""
        if column is None:
            return value
        options = self.options
        kind = column.kind
        if kind == "decimal":
            if options.decimal_handling_mode == "precise" and isinstance(value, str):
                return _decimal_bytes(base64.b64decode(value), column.scale or 0)
            return value
        if kind == "integer":
            if isinstance(value, str) and options.bigint_unsigned_handling_mode == "precise":
                return _decimal_bytes(base64.b64decode(value), 0)
            return _unwrap_unsigned(value, column)
        if kind == "bit":
            if isinstance(value, bool):
                return int(value)
            return int.from_bytes(base64.b64decode(value), "little") if isinstance(value, str) else value
        if kind in ("binary", "geometry"):
            if isinstance(value, dict):
                return _geometry(value)
            return _binary(value, options.binary_handling_mode)
        if kind == "date":
            return _EPOCH_DAY + dt.timedelta(days=int(value)) if isinstance(value, int) else _iso(value)
        if kind == "time":
            if isinstance(value, int):
                millis = options.time_precision_mode == "connect" or (
                    options.time_precision_mode == "adaptive" and (column.scale or 0) <= 3
                )
                return dt.timedelta(milliseconds=value) if millis else dt.timedelta(microseconds=value)
            return _iso(value)
        if kind == "datetime":
            if isinstance(value, int):
                millis = options.time_precision_mode == "connect" or (column.scale or 0) <= 3
                return _EPOCH + (
                    dt.timedelta(milliseconds=value) if millis else dt.timedelta(microseconds=value)
                )
            return _iso(value)
        if kind in ("float", "double") and isinstance(value, Decimal):
            return float(value)
        return value


def _as_is(value: Any) -> JsonValue:
    """A schema-less value without a column type (``schemaless=as-is``): as Debezium wrote it."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _as_is(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_is(v) for v in value]
    result: JsonValue = value
    return result


def _column_from_schema(field: Mapping[str, Any]) -> ColumnType | None:
    """The MySQL type a field's Connect schema implies (Debezium's ``__debezium.source.column.type``
    parameter when present, else the logical name and type)."""
    params = field.get("parameters") or {}
    source_type = params.get(_SOURCE_TYPE)
    if source_type:
        words = str(source_type).split()
        data_type = "double" if words[:2] == ["DOUBLE", "PRECISION"] else words[0].lower()
        length = params.get("__debezium.source.column.length")
        scale = params.get("__debezium.source.column.scale")
        allowed = tuple(a for a in str(params.get("allowed") or "").split(",") if a)
        return ColumnType(
            data_type,
            unsigned="UNSIGNED" in str(source_type).upper(),
            length=int(length) if length not in (None, "") and data_type in ("binary", "bit") else None,
            scale=int(scale) if scale not in (None, "") else None,
            members=allowed,
        )
    name = str(field.get("name") or "")
    connect_type = str(field.get("type") or "")
    by_name = {
        "org.apache.kafka.connect.data.Decimal": ColumnType("decimal", scale=_int(params.get("scale"))),
        "io.debezium.data.VariableScaleDecimal": ColumnType("decimal"),
        "io.debezium.data.Bits": ColumnType("bit", length=_int(params.get("length"))),
        "io.debezium.time.Date": ColumnType("date"),
        "org.apache.kafka.connect.data.Date": ColumnType("date"),
        "io.debezium.time.IsoDate": ColumnType("date"),
        "io.debezium.time.Time": ColumnType("time"),
        "io.debezium.time.MicroTime": ColumnType("time"),
        "io.debezium.time.NanoTime": ColumnType("time"),
        "org.apache.kafka.connect.data.Time": ColumnType("time"),
        "io.debezium.time.IsoTime": ColumnType("time"),
        "io.debezium.time.Timestamp": ColumnType("datetime"),
        "io.debezium.time.MicroTimestamp": ColumnType("datetime"),
        "io.debezium.time.NanoTimestamp": ColumnType("datetime"),
        "org.apache.kafka.connect.data.Timestamp": ColumnType("datetime"),
        "io.debezium.time.IsoTimestamp": ColumnType("datetime"),
        "io.debezium.time.ZonedTimestamp": ColumnType("timestamp"),
        "io.debezium.time.Year": ColumnType("year"),
        "io.debezium.data.Enum": ColumnType("enum"),
        "io.debezium.data.EnumSet": ColumnType("set"),
        "io.debezium.data.Json": ColumnType("json"),
        "io.debezium.data.geometry.Geometry": ColumnType("geometry"),
        "io.debezium.data.geometry.Point": ColumnType("geometry"),
        "io.debezium.data.Uuid": ColumnType("uuid"),
    }
    if name in by_name:
        return by_name[name]
    return {
        "int8": ColumnType("tinyint"),
        "int16": ColumnType("smallint"),
        "int32": ColumnType("int"),
        "int64": ColumnType("bigint"),
        "boolean": ColumnType("tinyint"),
        "float32": ColumnType("float"),
        "float64": ColumnType("double"),
        "string": ColumnType("varchar"),
        "bytes": ColumnType("varbinary"),
    }.get(connect_type)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _from_schema(value: Any, field: Mapping[str, Any], column: ColumnType | None, binary_mode: str) -> Any:
    """A value decoded by its field's Connect schema (logical name first, then the Connect type)."""
    name = str(field.get("name") or "")
    connect_type = str(field.get("type") or "")
    params = field.get("parameters") or {}
    if name == "org.apache.kafka.connect.data.Decimal":
        if isinstance(value, str):
            return _decimal_bytes(base64.b64decode(value), int(params.get("scale") or 0))
        return Decimal(value) if isinstance(value, int) else value  # decimal.format=NUMERIC
    if name == "io.debezium.data.VariableScaleDecimal":
        return _decimal_bytes(base64.b64decode(value["value"]), int(value["scale"]))
    if name == "io.debezium.data.Bits":
        return int.from_bytes(base64.b64decode(value), "little")  # little-endian, per Debezium's docs
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return _EPOCH_DAY + dt.timedelta(days=int(value))
    if name in ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time"):
        return dt.timedelta(milliseconds=int(value))
    if name == "io.debezium.time.MicroTime":
        return dt.timedelta(microseconds=int(value))
    if name == "io.debezium.time.NanoTime":
        return dt.timedelta(microseconds=int(value) // 1000)
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return _EPOCH + dt.timedelta(milliseconds=int(value))
    if name == "io.debezium.time.MicroTimestamp":
        return _EPOCH + dt.timedelta(microseconds=int(value))
    if name == "io.debezium.time.NanoTimestamp":
        return _EPOCH + dt.timedelta(microseconds=int(value) // 1000)
    if name in ("io.debezium.time.IsoDate", "io.debezium.time.IsoTime", "io.debezium.time.IsoTimestamp"):
        return _iso(value)
    if name in ("io.debezium.data.geometry.Geometry", "io.debezium.data.geometry.Point"):
        return _geometry(value)
    if connect_type == "bytes":
        return base64.b64decode(value)
    if connect_type == "string" and column is not None and column.kind in ("binary", "geometry"):
        return _binary(value, binary_mode)  # binary.handling.mode=base64 / base64-url-safe / hex
    if connect_type in ("float32", "float64"):
        return float(value)
    if connect_type == "boolean":
        return int(bool(value))
    if connect_type in ("int8", "int16", "int32", "int64") and column is not None:
        return _unwrap_unsigned(value, column)
    return value


def _unwrap_unsigned(value: Any, column: ColumnType) -> Any:
    # bigint.unsigned.handling.mode=long writes BIGINT UNSIGNED values above 2**63 - 1 as negative longs.
    if column.unsigned and isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return value + (1 << column.integer_bits)
    return value


def _decimal_bytes(data: bytes, scale: int) -> Decimal:
    """Kafka Connect's Decimal: the unscaled value as big-endian two's complement bytes."""
    return Decimal(int.from_bytes(data, "big", signed=True)).scaleb(-scale, _EXACT)


def _binary(value: Any, mode: str) -> bytes:
    text = str(value)
    if mode in ("bytes", "base64"):
        return base64.b64decode(text)
    if mode == "base64-url-safe":
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return bytes.fromhex(text)


def _geometry(value: Any) -> bytes:
    """Debezium's Geometry struct (``wkb``, ``srid``) as MySQL's internal form: SRID (4 bytes, little
    endian) then the WKB."""
    if not isinstance(value, dict) or "wkb" not in value:
        raise ValueError("a geometry value needs a wkb field")
    srid = int(value.get("srid") or 0)
    return srid.to_bytes(4, "little") + base64.b64decode(value["wkb"])


def _iso(value: Any) -> Any:
    """An ISO 8601 string of ``time.precision.mode=isostring``: a date (``YYYY-MM-DD[Z]``) or a time of
    day (``HH:MM:SS[.f][Z]``) loses its Z; a timestamp keeps it (UTC)."""
    text = str(value).strip()
    if text.endswith("Z") and "T" not in text:
        return text[:-1]
    return text
