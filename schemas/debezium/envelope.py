"""A Debezium MySQL message (Kafka Connect JSON converter) as a freshkey event, with its version.

What is read (the documented format of Debezium 2.x/3.x; docs/debezium.md has the details):

- the value, with or without the ``schema``/``payload`` wrapper: ``op`` (``c``/``u``/``d``/``r``;
  ``t`` truncate), ``before``, ``after``, ``source`` (``file``, ``pos``, ``row``, ``gtid``,
  ``server_id``, ``ts_ms``/``ts_us``, ``db``, ``table``, ``snapshot``), ``ts_ms``, ``transaction``;
  a null value is the tombstone Debezium writes after a delete;
- the key (the row's primary key, or ``message.key.columns``), with or without its wrapper;
- db and table from ``source.db``/``source.table``, else from the topic ``<prefix>.<db>.<table>``.

Column values are decoded by :mod:`schemas.debezium.columns`.

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

import json
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from schemas.debezium.columns import RowDecoder
from schemas.debezium.options import HEARTBEAT_PREFIX, ColumnTypes, DebeziumError, DebeziumOptions, Skip
from schemas.events import MAX_U32, ChangeEvent, DdlEvent, FenceEvent, Source
from schemas.versions import VersionError, binlog_version, gtid_version
from schemas.wire import Change, decode_change


def decode_any(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    options: DebeziumOptions,
    *,
    column_types: ColumnTypes | None = None,
) -> Change | DdlEvent | FenceEvent | Skip:
    """Decode one message of the worker's input, whichever kind it is.

    ``input=freshkey``: a freshkey change-topic message (:func:`schemas.wire.decode_change`).
    ``input=debezium``: a Debezium message (:func:`decode_debezium`). Raises
    :class:`~schemas.codec.DecodeError` (for Debezium: :class:`DebeziumError`) with the reason for a message
    that is no valid event.
    """
    if options.input == "freshkey":
        return decode_change(value if value is not None else b"")
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
    decoder = RowDecoder(options, known)
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
