"""schemas.debezium: Debezium MySQL change events (JSON converter) as freshkey events.

Fixtures are the example messages of Debezium's MySQL connector documentation (``mysql.adoc``: the
``customers`` table's key, create/update/delete values, truncate and schema-change messages, the
transaction block), with ``{debezium-version}`` filled in. ``tests.support.debezium.DebeziumEncoder``
writes messages the documented way (data type mappings of the same page) from freshkey's JSON forms;
the property tests check that decoding them gives back exactly those forms, with a schema, with only
Debezium's source-type parameters, and without a schema but with the table's column types.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import ChangeEvent, DdlEvent, WireChange, binlog_version, encode, gtid_version
from schemas.codec import DecodeError
from schemas.debezium import (
    DebeziumError,
    DebeziumOptions,
    DebeziumTopics,
    Skip,
    decode_any,
    decode_debezium,
)
from schemas.values import ColumnType, JsonValue, to_json_value
from tests.support.debezium import SOURCE_FIELDS, VERSION, DebeziumEncoder

TOPIC = "mysql-server-1.inventory.customers"
OPTIONS = DebeziumOptions(input="debezium", topics=DebeziumTopics(names=(TOPIC,)))

# -- Debezium's documented example messages (mysql.adoc, "Data change events") -------------------------------

DOC_KEY: dict[str, Any] = {
    "schema": {
        "type": "struct",
        "name": "mysql-server-1.inventory.customers.Key",
        "optional": False,
        "fields": [{"field": "id", "type": "int32", "optional": False}],
    },
    "payload": {"id": 1004},
}
_ROW_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": False, "field": "first_name"},
    {"type": "string", "optional": False, "field": "last_name"},
    {"type": "string", "optional": False, "field": "email"},
]
DOC_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "mysql-server-1.inventory.customers.Value",
            "field": "before",
        },
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "mysql-server-1.inventory.customers.Value",
            "field": "after",
        },
        {
            "type": "struct",
            "fields": SOURCE_FIELDS,
            "optional": False,
            "name": "io.debezium.connector.mysql.Source",
            "field": "source",
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "mysql-server-1.inventory.customers.Envelope",
}
DOC_CREATE: dict[str, Any] = {
    "op": "c",
    "ts_ms": 1465491411815,
    "before": None,
    "after": {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
    "source": {
        "version": VERSION,
        "connector": "mysql",
        "name": "mysql-server-1",
        "ts_ms": 0,
        "snapshot": False,
        "db": "inventory",
        "table": "customers",
        "server_id": 0,
        "gtid": None,
        "file": "mysql-bin.000003",
        "pos": 154,
        "row": 0,
        "thread": 7,
        "query": "INSERT INTO customers (first_name, last_name, email) VALUES ('Anne', 'Kretchmar', "
        "'annek@noanswer.org')",
    },
}
DOC_UPDATE: dict[str, Any] = {
    "before": {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
    "after": {
        "id": 1004,
        "first_name": "Anne Marie",
        "last_name": "Kretchmar",
        "email": "annek@noanswer.org",
    },
    "source": {
        "version": VERSION,
        "name": "mysql-server-1",
        "connector": "mysql",
        "ts_ms": 1465581029100,
        "snapshot": False,
        "db": "inventory",
        "table": "customers",
        "server_id": 223344,
        "gtid": None,
        "file": "mysql-bin.000003",
        "pos": 484,
        "row": 0,
        "thread": 7,
        "query": "UPDATE customers SET first_name='Anne Marie' WHERE id=1004",
    },
    "op": "u",
    "ts_ms": 1465581029523,
}
DOC_DELETE: dict[str, Any] = {
    "before": {
        "id": 1004,
        "first_name": "Anne Marie",
        "last_name": "Kretchmar",
        "email": "annek@noanswer.org",
    },
    "after": None,
    "source": {
        "version": VERSION,
        "connector": "mysql",
        "name": "mysql-server-1",
        "ts_ms": 1465581902300,
        "snapshot": False,
        "db": "inventory",
        "table": "customers",
        "server_id": 223344,
        "gtid": None,
        "file": "mysql-bin.000003",
        "pos": 805,
        "row": 0,
        "thread": 7,
        "query": "DELETE FROM customers WHERE id=1004",
    },
    "op": "d",
    "ts_ms": 1465581902461,
}
DOC_TRUNCATE: dict[str, Any] = {
    "source": {
        "version": VERSION,
        "name": "mysql-server-1",
        "connector": "mysql",
        "ts_ms": 1465581029100,
        "snapshot": False,
        "db": "inventory",
        "table": "customers",
        "server_id": 223344,
        "gtid": None,
        "file": "mysql-bin.000003",
        "pos": 484,
        "row": 0,
        "thread": 7,
        "query": "UPDATE customers SET first_name='Anne Marie' WHERE id=1004",
    },
    "op": "t",
    "ts_ms": 1465581029523,
}
DOC_SCHEMA_CHANGE: dict[str, Any] = {
    "schema": {},
    "payload": {
        "source": {
            "version": VERSION,
            "connector": "mysql",
            "name": "mysql",
            "ts_ms": 1651535750218,
            "snapshot": "false",
            "db": "inventory",
            "sequence": None,
            "table": "customers",
            "server_id": 223344,
            "gtid": None,
            "file": "mysql-bin.000003",
            "pos": 570,
            "row": 0,
            "thread": None,
            "query": None,
        },
        "databaseName": "inventory",
        "schemaName": None,
        "ddl": "ALTER TABLE customers ADD middle_name varchar(255) AFTER first_name",
        "tableChanges": [{"type": "ALTER", "id": '"inventory"."customers"', "table": {"columns": []}}],
    },
}
DOC_TRANSACTION: dict[str, Any] = {
    "id": "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10",
    "total_order": "1",
    "data_collection_order": "1",
}
CUSTOMERS = {
    "id": ColumnType("int"),
    "first_name": ColumnType("varchar"),
    "last_name": ColumnType("varchar"),
    "email": ColumnType("varchar"),
}


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


def _wrapped(payload: Mapping[str, Any]) -> bytes:
    return _json({"schema": DOC_SCHEMA, "payload": payload})


def test_documented_create_event() -> None:
    event = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(DOC_CREATE), OPTIONS)
    assert isinstance(event, ChangeEvent)
    assert event.op == "c" and event.key == {"id": 1004} and event.before is None
    assert event.after == DOC_CREATE["after"]
    assert (event.source.db, event.source.table, event.source.file) == (
        "inventory",
        "customers",
        "mysql-bin.000003",
    )
    # pos is where the rows event starts; pos + 1 lies inside it (freshkey's own positions are its end)
    assert event.source.pos == 155
    assert event.version == binlog_version("mysql-bin.000003", 155, 0)
    assert event.ts_ms == 1465491411815
    assert ChangeEvent.model_validate_json(encode(event)) == event, "re-encodes as a freshkey event"


def test_documented_update_and_delete_events_with_and_without_the_wrapper() -> None:
    wrapped_update = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(DOC_UPDATE), OPTIONS)
    bare_update = decode_debezium(
        TOPIC, _json({"id": 1004}), _json(DOC_UPDATE), OPTIONS, column_types=lambda db, t: CUSTOMERS
    )
    assert isinstance(wrapped_update, ChangeEvent) and wrapped_update == bare_update
    assert wrapped_update.op == "u" and wrapped_update.after is not None
    assert wrapped_update.after["first_name"] == "Anne Marie"
    assert wrapped_update.source.server_id == 223344
    assert wrapped_update.commit_ts_us == 1465581029100 * 1000 and not wrapped_update.commit_ts_coarse

    delete = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(DOC_DELETE), OPTIONS)
    assert isinstance(delete, ChangeEvent) and delete.op == "d" and delete.after is None
    assert delete.before == DOC_DELETE["before"]
    assert wrapped_update.version < delete.version


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (_json(DOC_KEY), None, "tombstone"),
        (_json(DOC_KEY), b"", "tombstone"),
        (_json(DOC_KEY), b'{"schema": null, "payload": null}', "tombstone"),
        (b'{"serverName": "mysql-server-1"}', b'{"ts_ms": 1465581029523}', "heartbeat"),
        (None, b'{"status": "BEGIN", "id": "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"}', "transaction"),
        (None, b'{"status": "END", "id": "x:10", "event_count": 2, "data_collections": []}', "transaction"),
    ],
)
def test_messages_without_a_row_change_are_skipped_with_the_reason(
    key: bytes | None, value: bytes | None, reason: str
) -> None:
    result = decode_debezium(TOPIC, key, value, OPTIONS)
    assert isinstance(result, Skip) and reason in result.reason


def test_heartbeat_topic_is_skipped() -> None:
    result = decode_debezium("__debezium-heartbeat.mysql-server-1", b"{}", b'{"ts_ms": 1}', OPTIONS)
    assert result == Skip("heartbeat")


def test_documented_schema_change_and_truncate_become_ddl() -> None:
    ddl = decode_debezium("mysql", _json({"databaseName": "inventory"}), _json(DOC_SCHEMA_CHANGE), OPTIONS)
    assert isinstance(ddl, DdlEvent)
    assert ddl.query.startswith("ALTER TABLE customers") and ddl.source.db == "inventory"
    assert ddl.source.pos == 571  # ordered like the changes around it (the worker's DDL sequence)

    truncate = decode_debezium(TOPIC, None, _wrapped(DOC_TRUNCATE), OPTIONS)
    assert isinstance(truncate, DdlEvent)
    assert truncate.query == "TRUNCATE TABLE `inventory`.`customers`"


def test_gtid_versions_need_the_documented_transaction_block_and_an_acknowledgement() -> None:
    with pytest.raises(ValidationError, match="FRESHKEY_DEBEZIUM_VERSION_SOURCE=binlog"):
        DebeziumOptions(input="debezium", topics=DebeziumTopics(names=(TOPIC,)), version_source="gtid")
    options = DebeziumOptions(
        input="debezium",
        topics=DebeziumTopics(names=(TOPIC,)),
        version_source="gtid",
        gtid_debezium_only=True,
    )
    gtid = "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"
    payload = {**DOC_CREATE, "source": {**DOC_CREATE["source"], "gtid": gtid}, "transaction": DOC_TRANSACTION}
    event = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(payload), options)
    assert isinstance(event, ChangeEvent) and event.version == gtid_version(gtid, 0)
    without = {**payload}
    del without["transaction"]
    with pytest.raises(DebeziumError, match=r"provide\.transaction\.metadata=true"):
        decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(without), options)


def test_options_say_what_to_set() -> None:
    with pytest.raises(ValidationError, match="FRESHKEY_KAFKA_DEBEZIUM_TOPICS"):
        DebeziumOptions(input="debezium")
    assert DebeziumTopics.parse("regex:dbserver1\\.inventory\\..*").matches("dbserver1.inventory.orders")
    assert not DebeziumTopics.parse("regex:dbserver1\\.inventory\\..*").matches("dbserver1.other.orders")
    assert DebeziumTopics.parse('["a.b.c", "a.b.d"]').names == ("a.b.c", "a.b.d")
    assert DebeziumTopics.parse(" a.b.c , a.b.d ").names == ("a.b.c", "a.b.d")
    with pytest.raises(ValidationError, match="not a regular expression"):
        DebeziumTopics.parse("regex:(")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (_json(DOC_KEY), b"{not json", "not JSON"),
        (_json(DOC_KEY), b"[1, 2]", "not a change event"),
        (None, _wrapped(DOC_CREATE), "message.key.columns"),
        (_json(DOC_KEY), _wrapped({**DOC_CREATE, "op": "x"}), "unknown op"),
        (
            _json(DOC_KEY),
            _wrapped({**DOC_CREATE, "source": {**DOC_CREATE["source"], "file": None}}),
            "source.file",
        ),
        (_json(DOC_KEY), _wrapped({**DOC_CREATE, "after": None}), "after"),
        (_json({"id": 1}), _wrapped(DOC_CREATE), "id"),  # key and image disagree
        (_json(DOC_KEY), _json(DOC_CREATE), "schemas.enable=true"),  # no schema, no column types
    ],
)
def test_bad_messages_raise_a_decode_error_with_the_reason(
    key: bytes | None, value: bytes, match: str
) -> None:
    with pytest.raises(DecodeError, match=match):
        decode_debezium(TOPIC, key, value, OPTIONS)


def test_schemaless_as_is_keeps_debeziums_values() -> None:
    options = OPTIONS.model_copy(update={"schemaless": "as-is"})
    event = decode_debezium(TOPIC, _json({"id": 1004}), _json(DOC_CREATE), options)
    assert isinstance(event, ChangeEvent) and event.after == DOC_CREATE["after"]


def test_db_and_table_from_the_topic_when_the_source_lacks_them() -> None:
    source = {k: v for k, v in DOC_CREATE["source"].items() if k not in ("db", "table")}
    event = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped({**DOC_CREATE, "source": source}), OPTIONS)
    assert isinstance(event, ChangeEvent) and event.table == ("inventory", "customers")


def test_decode_any_reads_freshkey_topics_as_always() -> None:
    event = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped(DOC_CREATE), OPTIONS)
    assert isinstance(event, ChangeEvent)
    fast = decode_any("freshkey.changes", None, encode(event), DebeziumOptions())
    assert isinstance(fast, WireChange) and fast.to_event() == event
    with pytest.raises(DecodeError):
        decode_any("freshkey.changes", None, None, DebeziumOptions())
    assert decode_any(TOPIC, _json(DOC_KEY), _wrapped(DOC_CREATE), OPTIONS) == event


# -- versions: a later change gets a higher version whichever source delivered it ----------------------------


def _freshkey_version(file: str, start: int, length: int, row: int) -> int:
    return binlog_version(file, start + length, row)  # freshkey: the END position of the rows event


def _debezium_version(file: str, start: int, row: int, *, normalize: bool = True) -> int:
    source = {**DOC_CREATE["source"], "file": file, "pos": start, "row": row}
    event = decode_debezium(TOPIC, _json(DOC_KEY), _wrapped({**DOC_CREATE, "source": source}), OPTIONS)
    assert isinstance(event, ChangeEvent)
    return event.version if normalize else binlog_version(file, start, row)


@st.composite
def _binlog(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Rows events of one file in order: (start, length, rows); events may be adjacent (a statement split
    into several rows events shares one table map)."""
    events = []
    position = draw(st.integers(4, 10_000))
    for _ in range(draw(st.integers(2, 6))):
        position += draw(st.sampled_from([0, 0, 31, 200]))  # a gap: table map, GTID, query events
        length = draw(st.integers(30, 9000))
        events.append((position, length, draw(st.integers(1, 5))))
        position += length
    return events


@given(_binlog(), st.data())
@settings(max_examples=200)
def test_mixed_sources_order_every_later_change_higher(
    events: list[tuple[int, int, int]], data: st.DataObject
) -> None:
    changes = [(e, r) for e in range(len(events)) for r in range(events[e][2])]
    first, second = sorted(data.draw(st.lists(st.sampled_from(changes), min_size=2, max_size=2, unique=True)))
    if first[0] == second[0]:
        return  # two rows of one rows event: see test_rows_of_one_event_are_ordered_within_a_source
    (s1, l1, _), (s2, l2, _) = events[first[0]], events[second[0]]
    file = "mysql-bin.000007"
    earlier = {_freshkey_version(file, s1, l1, first[1]), _debezium_version(file, s1, first[1])}
    later = {_freshkey_version(file, s2, l2, second[1]), _debezium_version(file, s2, second[1])}
    assert max(earlier) < min(later)


def test_without_the_start_to_inside_shift_a_later_event_can_get_a_lower_version() -> None:
    # Adjacent rows events of one statement: X = [1000, 1400) with 3 rows, Y starts at 1400.
    file = "mysql-bin.000007"
    earlier = _freshkey_version(file, 1000, 400, 2)
    assert _debezium_version(file, 1400, 0, normalize=False) < earlier, "raw pos: the later change loses"
    assert _debezium_version(file, 1400, 0) > earlier


def test_rows_of_one_event_are_ordered_within_a_source() -> None:
    file = "mysql-bin.000007"
    assert _debezium_version(file, 1000, 0) < _debezium_version(file, 1000, 1)
    assert _freshkey_version(file, 1000, 400, 0) < _freshkey_version(file, 1000, 400, 1)
    # ...but not across them: freshkey's row 0 of the event is above Debezium's row 1 (docs/debezium.md).
    assert _freshkey_version(file, 1000, 400, 0) > _debezium_version(file, 1000, 1)


def test_snapshot_rows_sit_below_every_change_after_the_snapshot_point() -> None:
    file = "mysql-bin.000007"
    source = {**DOC_CREATE["source"], "file": file, "pos": 5000, "row": 0, "snapshot": "true"}
    snapshot = decode_debezium(
        TOPIC, _json(DOC_KEY), _wrapped({**DOC_CREATE, "op": "r", "source": source}), OPTIONS
    )
    assert isinstance(snapshot, ChangeEvent) and snapshot.op == "r"
    assert snapshot.version == binlog_version(file, 5000, 0)
    first_after = min(_debezium_version(file, 5000, 0), _freshkey_version(file, 5000, 30, 0))
    assert snapshot.version < first_after
    assert _freshkey_version(file, 4000, 1000, 0) <= snapshot.version  # a change the snapshot includes


# -- column values: Debezium's encodings back to freshkey's JSON forms ---------------------------------------


def _float32(x: float) -> float:
    value = to_json_value(struct.unpack("<f", struct.pack("<f", x))[0], ColumnType("float"))
    assert isinstance(value, float)
    return value


# One strategy per column type, producing values in freshkey's JSON form (what a direct read maps to).
TYPED: dict[str, tuple[ColumnType, st.SearchStrategy[JsonValue]]] = {
    "ti": (ColumnType("tinyint"), st.integers(-128, 127)),
    "iu": (ColumnType("int", unsigned=True), st.integers(0, 2**32 - 1)),
    "bi": (ColumnType("bigint"), st.integers(-(2**63), 2**63 - 1)),
    "biu": (ColumnType("bigint", unsigned=True), st.integers(0, 2**64 - 1)),
    "de": (
        ColumnType("decimal", scale=4),
        st.integers(-(10**20), 10**20).map(lambda n: format(Decimal(n).scaleb(-4), "f")),
    ),
    "dw": (
        ColumnType("decimal", scale=30),
        st.integers(-(10**65) + 1, 10**65 - 1).map(
            lambda n: format(Decimal(n).scaleb(-30, decimal.Context(prec=100)), "f")
        ),
    ),
    "f": (ColumnType("float"), st.floats(width=32, allow_nan=False, allow_infinity=False).map(_float32)),
    "d": (ColumnType("double"), st.floats(allow_nan=False, allow_infinity=False)),
    "b1": (ColumnType("bit", length=1), st.integers(0, 1)),
    "b64": (ColumnType("bit", length=64), st.integers(0, 2**64 - 1)),
    "b10": (ColumnType("bit", length=10), st.integers(0, 1023)),
    "dt": (ColumnType("date"), st.dates(dt.date(1000, 1, 1)).map(dt.date.isoformat)),
    "dtm": (
        ColumnType("datetime", scale=6),
        st.datetimes(dt.datetime(1000, 1, 1)).map(lambda v: v.isoformat(timespec="microseconds")),
    ),
    "dtm0": (
        ColumnType("datetime", scale=0),
        st.datetimes(dt.datetime(1000, 1, 1)).map(
            lambda v: v.replace(microsecond=0).isoformat(timespec="microseconds")
        ),
    ),
    "ts": (
        ColumnType("timestamp", scale=6),
        st.datetimes(dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(2038, 1, 19)).map(
            lambda v: v.isoformat(timespec="microseconds")
        ),
    ),
    "tm": (
        ColumnType("time", scale=6),
        st.integers(-(839 * 3600 * 10**6 - 1), 839 * 3600 * 10**6 - 1).map(
            lambda us: to_json_value(dt.timedelta(microseconds=us), ColumnType("time"))
        ),
    ),
    "yr": (ColumnType("year"), st.sampled_from([0, 1901, 1999, 2155])),
    "vc": (ColumnType("varchar"), st.text(st.characters(blacklist_categories=["Cs"]))),
    "en": (ColumnType("enum", members=("a", "b", "é")), st.sampled_from(["a", "b", "é"])),
    "st": (
        ColumnType("set", members=("a", "b", "c")),
        st.sets(st.sampled_from(["a", "b", "c"])).map(lambda s: sorted(s)),
    ),
    "js": (
        ColumnType("json"),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=6,
        ),
    ),
    "bn": (
        ColumnType("binary", length=4),
        st.binary(min_size=4, max_size=4).map(lambda b: base64.b64encode(b).decode()),
    ),
    "vb": (ColumnType("varbinary"), st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode())),
    "g": (
        ColumnType("geometry"),
        st.tuples(st.integers(0, 2**32 - 1), st.binary(min_size=5, max_size=30)).map(
            lambda t: base64.b64encode(t[0].to_bytes(4, "little") + t[1]).decode()
        ),
    ),
    "u": (ColumnType("uuid"), st.uuids().map(str)),
}
COLUMNS = {"id": ColumnType("int")} | {name: column for name, (column, _) in TYPED.items()}


@st.composite
def _row(draw: st.DrawFn) -> dict[str, JsonValue]:
    row: dict[str, JsonValue] = {"id": draw(st.integers(1, 10**6))}
    for name, (_, values) in TYPED.items():
        row[name] = draw(st.none() | values)
    return row


def _decode_row(
    encoder: DebeziumEncoder, row: dict[str, JsonValue], options: DebeziumOptions, **kw: Any
) -> Any:
    key, value = encoder.message(
        "shop",
        "items",
        COLUMNS,
        ("id",),
        op="c",
        before=None,
        after=row,
        source={"file": "binlog.000002", "pos": 4096, "row": 0, "server_id": 1, "ts_ms": 1_700_000_000_000},
        with_schema=kw.pop("with_schema", True),
    )
    event = decode_debezium("dbserver1.shop.items", key, value, options, **kw)
    assert isinstance(event, ChangeEvent)
    return event.after


def _nulls(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """A row of COLUMNS: ``values``, the other columns NULL."""
    row: dict[str, JsonValue] = dict.fromkeys(COLUMNS)
    row.update(values)
    return row


ITEMS = DebeziumOptions(input="debezium", topics=DebeziumTopics(pattern=r"dbserver1\.shop\..*"))


@given(_row())
@settings(max_examples=150)
def test_every_type_round_trips_with_schema_and_column_types(row: dict[str, JsonValue]) -> None:
    assert _decode_row(DebeziumEncoder(), row, ITEMS, column_types=lambda db, t: COLUMNS) == row


@given(_row())
@settings(max_examples=100)
def test_every_type_round_trips_with_debeziums_source_type_parameters(row: dict[str, JsonValue]) -> None:
    assert _decode_row(DebeziumEncoder(source_types=True), row, ITEMS) == row


@given(_row())
@settings(max_examples=100)
def test_every_type_round_trips_without_a_schema_given_the_column_types(row: dict[str, JsonValue]) -> None:
    assert (
        _decode_row(DebeziumEncoder(), row, ITEMS, with_schema=False, column_types=lambda db, t: COLUMNS)
        == row
    )


@pytest.mark.parametrize("mode", ["base64", "base64-url-safe", "hex"])
def test_binary_handling_modes(mode: str) -> None:
    options = ITEMS.model_copy(update={"binary_handling_mode": mode})
    row = _nulls({"id": 1, "vb": "+/8A", "bn": "AAAAAA=="})
    encoder = DebeziumEncoder(binary_mode=mode)
    assert _decode_row(encoder, row, options, column_types=lambda db, t: COLUMNS) == row
    assert _decode_row(encoder, row, options, with_schema=False, column_types=lambda db, t: COLUMNS) == row


@pytest.mark.parametrize("mode", ["string", "double"])
def test_decimal_handling_modes(mode: str) -> None:
    options = ITEMS.model_copy(update={"decimal_handling_mode": mode})
    row = _nulls({"id": 1, "de": "-12.5000"})
    encoder = DebeziumEncoder(decimal_mode=mode)
    assert _decode_row(encoder, row, options, column_types=lambda db, t: COLUMNS) == row


def test_where_the_schema_alone_is_ambiguous() -> None:
    """Without column types or source-type parameters, a Connect schema cannot tell some MySQL types
    apart (docs/debezium.md): these are the forms freshkey then caches."""
    row = _nulls(
        {
            "id": 1,
            "biu": 2**64 - 1,  # long mode writes -1
            "bn": "AQ==",  # BINARY(4) of 0x01: padding needs the length
            "f": 0.1,  # float32 in the schema: exact
        }
    )
    after = _decode_row(DebeziumEncoder(), row, ITEMS)
    assert after["biu"] == -1 and after["bn"] == "AQ==" and after["f"] == 0.1
    typed = _decode_row(DebeziumEncoder(), row, ITEMS, column_types=lambda db, t: COLUMNS)
    assert typed["biu"] == 2**64 - 1 and typed["bn"] == "AQAAAA=="


def test_connect_time_precision_mode_is_milliseconds() -> None:
    options = ITEMS.model_copy(update={"time_precision_mode": "connect", "schemaless": "types"})
    value = _json(
        {
            "op": "c",
            "after": {"id": 1, "dtm": 1_700_000_000_123, "tm": 3_723_456, "dt": 19_000},
            "source": {"file": "binlog.000002", "pos": 4, "row": 0, "server_id": 1, "ts_ms": 0},
        }
    )
    types = {
        "id": ColumnType("int"),
        "dtm": ColumnType("datetime", scale=6),
        "tm": ColumnType("time", scale=6),
    }
    types["dt"] = ColumnType("date")
    event = decode_debezium(
        "dbserver1.shop.items", b'{"id": 1}', value, options, column_types=lambda db, t: types
    )
    assert isinstance(event, ChangeEvent) and event.after is not None
    assert event.after["dtm"] == "2023-11-14T22:13:20.123000"
    assert event.after["tm"] == "01:02:03.456000"
    assert event.after["dt"] == "2022-01-08"


def test_zoned_timestamps_of_any_offset_become_utc() -> None:
    row = _nulls(
        {
            "id": 1,
            "ts": "2018-06-20T13:37:03.000000",
        }
    )
    key, value = DebeziumEncoder().message(
        "shop", "items", COLUMNS, ("id",), op="c", before=None, after=row,
        source={"file": "binlog.000002", "pos": 4, "row": 0, "server_id": 1, "ts_ms": 0},
    )  # fmt: skip
    document = json.loads(value)
    document["payload"]["after"]["ts"] = "2018-06-20T06:37:03-07:00"
    event = decode_debezium("dbserver1.shop.items", key, _json(document), ITEMS)
    assert isinstance(event, ChangeEvent) and event.after is not None
    assert event.after["ts"] == "2018-06-20T13:37:03.000000"
