"""connectors.binlog.translate: rows and query events -> change, DDL and dead-letter events, no servers.

Rows are given in the binlog reader's shape (``values``/``before_values``/``after_values`` with their
``none_sources``), exactly what pymysqlreplication hands the source.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from connectors.binlog.ddl import mentioned_databases, statement_kind, statement_tables, translate_ddl
from connectors.binlog.translate import (
    EventOrigin,
    RowsEvent,
    RowsKind,
    VersionSource,
    translate_rows,
)
from connectors.exceptions import ConfigurationError
from schemas import (
    ChangeEvent,
    DdlEvent,
    DeadLetter,
    binlog_version,
    gtid_version,
)
from schemas.values import EMPTY_SET, ColumnType

FILE = "binlog.000007"
END_POS = 900
COMMIT_S = 1_700_000_000
READ_MS = 1_700_000_000_250
ORIGIN = EventOrigin(server_id=1, file=FILE, end_pos=END_POS, timestamp_s=COMMIT_S, gtid="0-1-42")
TYPES = {
    "id": ColumnType("int"),
    "name": ColumnType("varchar"),
    "flags": ColumnType("bit", length=3),
    "tags": ColumnType("set", members=("a", "b", "c")),
    "at": ColumnType("datetime", scale=6),
}


def rows_event(
    kind: RowsKind,
    rows: Sequence[Mapping[str, Any]],
    *,
    primary_key: tuple[str, ...] = ("id",),
    types: Mapping[str, ColumnType] = TYPES,
    origin: EventOrigin = ORIGIN,
) -> RowsEvent:
    return RowsEvent(
        kind=kind,
        schema="shop",
        table="assets",
        primary_key=primary_key,
        rows=rows,
        column_types=types,
        origin=origin,
    )


def translate(
    event: RowsEvent, *, version_source: VersionSource = "binlog", first_ordinal: int = 0
) -> list[ChangeEvent | DeadLetter]:
    return list(
        translate_rows(event, version_source=version_source, first_ordinal=first_ordinal, read_ms=READ_MS)
    )


def changes(items: Sequence[ChangeEvent | DeadLetter]) -> list[ChangeEvent]:
    assert all(isinstance(item, ChangeEvent) for item in items), items
    return [item for item in items if isinstance(item, ChangeEvent)]


def image(row_id: int, name: str = "lamp") -> dict[str, Any]:
    return {"id": row_id, "name": name}


# --- inserts, updates, deletes ----------------------------------------------------------------------------


def test_an_insert_is_a_create_with_its_coordinates_and_times() -> None:
    (event,) = changes(translate(rows_event("write", [{"values": image(42)}])))
    assert (event.op, event.key, event.before, event.after) == ("c", {"id": 42}, None, image(42))
    assert event.event_id == f"1:{FILE}:{END_POS}:0"
    assert event.version == binlog_version(FILE, END_POS, 0)
    source = event.source
    assert (source.server_id, source.file, source.pos, source.row, source.gtid) == (
        1,
        FILE,
        END_POS,
        0,
        "0-1-42",
    )
    assert (source.db, source.table, source.ts_ms) == ("shop", "assets", COMMIT_S * 1000)
    assert event.commit_ts_us == COMMIT_S * 1_000_000 and event.commit_ts_coarse is True
    assert event.ts_ms == READ_MS
    assert not event.oversize


def test_an_update_keeping_its_key_is_one_update_with_both_images() -> None:
    row = {"before_values": image(42, "lamp"), "after_values": image(42, "desk lamp")}
    (event,) = changes(translate(rows_event("update", [row])))
    assert (event.op, event.key) == ("u", {"id": 42})
    assert event.before == image(42, "lamp") and event.after == image(42, "desk lamp")
    assert event.event_id == f"1:{FILE}:{END_POS}:0", "no suffix: the row's one change"


def test_a_delete_carries_the_before_image_only() -> None:
    (event,) = changes(translate(rows_event("delete", [{"values": image(42)}])))
    assert (event.op, event.key, event.before, event.after) == ("d", {"id": 42}, image(42), None)


def test_a_multi_row_event_gives_one_change_per_row_in_order() -> None:
    rows = [{"values": image(row_id)} for row_id in (5, 3, 9)]
    events = changes(translate(rows_event("write", rows)))
    assert [e.key["id"] for e in events] == [5, 3, 9]
    assert [e.source.row for e in events] == [0, 1, 2]
    assert [e.event_id for e in events] == [f"1:{FILE}:{END_POS}:{i}" for i in range(3)]
    versions = [e.version for e in events]
    assert versions == [binlog_version(FILE, END_POS, i) for i in range(3)]
    assert versions == sorted(set(versions)), "strictly increasing inside the event"


# --- primary key changes ------------------------------------------------------------------------------


def test_a_primary_key_change_is_a_delete_of_the_old_row_then_a_create_of_the_new() -> None:
    row = {"before_values": image(42, "lamp"), "after_values": image(43, "lamp")}
    delete, create = changes(translate(rows_event("update", [row])))
    assert (delete.op, delete.key, delete.before, delete.after) == ("d", {"id": 42}, image(42), None)
    assert (create.op, create.key, create.before, create.after) == ("c", {"id": 43}, None, image(43))
    assert (delete.event_id, create.event_id) == (f"1:{FILE}:{END_POS}:0:d", f"1:{FILE}:{END_POS}:0:c")
    assert delete.version == create.version == binlog_version(FILE, END_POS, 0)


def test_a_change_of_one_column_of_a_composite_key_splits_too() -> None:
    types = {"tenant": ColumnType("int"), "id": ColumnType("int"), "name": ColumnType("varchar")}
    before = {"tenant": 1, "id": 7, "name": "x"}
    after = {"tenant": 2, "id": 7, "name": "x"}
    event = rows_event(
        "update",
        [{"before_values": before, "after_values": after}],
        primary_key=("tenant", "id"),
        types=types,
    )
    assert [(e.op, e.key) for e in changes(translate(event))] == [
        ("d", {"tenant": 1, "id": 7}),
        ("c", {"tenant": 2, "id": 7}),
    ]


def test_a_change_of_another_column_than_the_key_does_not_split() -> None:
    types = {"tenant": ColumnType("int"), "id": ColumnType("int"), "name": ColumnType("varchar")}
    row = {
        "before_values": {"tenant": 1, "id": 7, "name": "x"},
        "after_values": {"tenant": 1, "id": 7, "name": "y"},
    }
    event = rows_event("update", [row], primary_key=("tenant", "id"), types=types)
    assert [e.op for e in changes(translate(event))] == ["u"]


# --- versions -----------------------------------------------------------------------------------------


def test_binlog_versions_grow_with_the_position() -> None:
    earlier = EventOrigin(server_id=1, file=FILE, end_pos=500, timestamp_s=COMMIT_S)
    later_file = EventOrigin(server_id=1, file="binlog.000008", end_pos=4, timestamp_s=COMMIT_S)
    versions = [
        changes(translate(rows_event("write", [{"values": image(1)}], origin=origin)))[0].version
        for origin in (earlier, ORIGIN, later_file)
    ]
    assert versions == sorted(set(versions))


@pytest.mark.parametrize("gtid", ["0-1-42", "3E11FA47-71CA-11E1-9E33-C80AA9429562:42"])
def test_gtid_versions_count_rows_across_the_events_of_a_transaction(gtid: str) -> None:
    origin = EventOrigin(server_id=1, file=FILE, end_pos=END_POS, timestamp_s=COMMIT_S, gtid=gtid)
    rows = [{"values": image(row_id)} for row_id in (1, 2)]
    events = changes(
        translate(rows_event("write", rows, origin=origin), version_source="gtid", first_ordinal=5)
    )
    assert [e.version for e in events] == [gtid_version(gtid, 5), gtid_version(gtid, 6)]
    assert events[0].version >> 24 == 42, "the transaction's sequence number on top"


def test_gtid_versions_without_gtids_in_the_binlog_stop_with_what_to_change() -> None:
    origin = EventOrigin(server_id=1, file=FILE, end_pos=END_POS, timestamp_s=COMMIT_S, gtid=None)
    with pytest.raises(ConfigurationError, match="FRESHKEY_CONNECTOR_VERSION_SOURCE=gtid"):
        translate(rows_event("write", [{"values": image(1)}], origin=origin), version_source="gtid")


# --- the value mapping ------------------------------------------------------------------------------------


def test_values_are_mapped_by_their_column_type() -> None:
    """BIT as the reader's bit string, an empty SET the reader returns as None, DATETIME with 6 digits."""
    import datetime as dt

    values = {"id": 1, "name": "lamp", "flags": "101", "tags": None, "at": dt.datetime(2024, 2, 29, 12, 0, 1)}
    (event,) = changes(
        translate(rows_event("write", [{"values": values, "none_sources": {"tags": EMPTY_SET}}]))
    )
    assert event.after == {
        "id": 1,
        "name": "lamp",
        "flags": 5,
        "tags": [],
        "at": "2024-02-29T12:00:01.000000",
    }


def test_both_images_of_an_update_are_mapped() -> None:
    row = {
        "before_values": {"id": 1, "flags": "101", "tags": None},
        "after_values": {"id": 1, "flags": "011", "tags": "a,c"},
        "before_none_sources": {"tags": EMPTY_SET},
    }
    (event,) = changes(translate(rows_event("update", [row])))
    assert event.before == {"id": 1, "flags": 5, "tags": []}
    assert event.after == {"id": 1, "flags": 3, "tags": ["a", "c"]}


def test_a_null_without_a_reason_from_the_reader_is_null() -> None:
    values = {"id": 1, "name": None, "flags": None, "tags": None, "at": None}
    (event,) = changes(translate(rows_event("write", [{"values": values}])))
    assert event.after == {"id": 1, "name": None, "flags": None, "tags": None, "at": None}


# --- rows that are no valid change -------------------------------------------------------------------


def test_a_value_that_is_no_form_of_its_type_is_a_dead_letter_and_the_other_rows_go_on() -> None:
    bad = {"values": {"id": 2, "name": "x", "flags": "not bits"}}
    items = translate(rows_event("write", [{"values": image(1)}, bad, {"values": image(3)}]))
    assert [type(i).__name__ for i in items] == ["ChangeEvent", "DeadLetter", "ChangeEvent"]
    letter = items[1]
    assert isinstance(letter, DeadLetter)
    assert letter.stage == "connector"
    assert "row of shop.assets is not a valid change" in letter.reason and "BIT" in letter.reason
    assert json.loads(base64.b64decode(letter.original_b64)) == bad, "the reader's row, as it came"


def test_a_key_value_that_is_no_key_is_a_dead_letter() -> None:
    items = translate(rows_event("write", [{"values": {"id": 1.5}}], types={}))
    assert len(items) == 1 and isinstance(items[0], DeadLetter)
    assert "key.id" in items[0].reason


def test_a_version_out_of_range_is_a_dead_letter() -> None:
    origin = EventOrigin(server_id=1, file=FILE, end_pos=2**32, timestamp_s=COMMIT_S)
    items = translate(rows_event("write", [{"values": image(1)}], origin=origin))
    assert len(items) == 1 and isinstance(items[0], DeadLetter)
    assert "out of range" in items[0].reason


def test_a_table_without_a_primary_key_is_a_dead_letter_per_row() -> None:
    items = translate(rows_event("write", [{"values": image(1)}, {"values": image(2)}], primary_key=()))
    assert len(items) == 2 and all(isinstance(i, DeadLetter) for i in items)
    assert isinstance(items[0], DeadLetter) and "has no primary key" in items[0].reason
    assert json.loads(base64.b64decode(items[0].original_b64)) == {"before": None, "after": image(1)}


def test_the_delete_half_of_a_key_change_goes_out_even_when_the_create_half_is_invalid() -> None:
    """The old key's entries must be dropped whatever becomes of the new row."""
    row = {"before_values": {"id": 1}, "after_values": {"id": 1.5}}
    items = translate(rows_event("update", [row], types={}))
    assert isinstance(items[0], ChangeEvent) and (items[0].op, items[0].key) == ("d", {"id": 1})
    assert isinstance(items[1], DeadLetter)
    assert len(items) == 2


# --- schema changes --------------------------------------------------------------------------------------

BOUND = [("shop", "assets"), ("shop", "Orders"), ("media", "clips")]


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("COMMIT", "commit"),
        ("commit", "commit"),
        ("BEGIN", "control"),
        ("ROLLBACK", "control"),
        ("XA START 'x'", "control"),
        ("SAVEPOINT s1", "control"),
        ("ALTER TABLE assets ADD x INT", "ddl"),
        ("CREATE TABLE t (id INT PRIMARY KEY)", "ddl"),
        ("CREATE TABLE t2 SELECT * FROM t", "ddl"),
        ("INSERTS_LOG_ROTATE", "ddl"),  # a word that only starts like one
        ("INSERT INTO assets VALUES (1)", "dml"),
        ("update assets set a = 1", "dml"),
        ("  DELETE FROM assets", "dml"),
        ("REPLACE INTO assets VALUES (1)", "dml"),
        ("LOAD DATA INFILE 'x' INTO TABLE assets", "dml"),
        ("/* app=api */ UPDATE assets SET a = 1", "dml"),
        ("-- note\nDELETE FROM assets", "dml"),
        ("# note\nINSERT INTO assets VALUES (1)", "dml"),
        ("WITH t AS (SELECT 1) UPDATE assets SET a = 1", "dml"),
        ("/* app */ ALTER TABLE assets ADD y INT", "ddl"),
    ],
)
def test_statement_kind(query: str, kind: str) -> None:
    assert statement_kind(query) == kind


@pytest.mark.parametrize(
    ("query", "schema", "tables"),
    [
        ("UPDATE assets SET a = 1", "shop", [("shop", "Orders"), ("shop", "assets")]),
        ("UPDATE sessions SET a = 1", "shop", [("shop", "Orders"), ("shop", "assets")]),  # a trigger may
        ("UPDATE media.clips SET a = 1", "other", [("media", "clips")]),
        (
            "UPDATE `shop`.`assets` a JOIN media.clips c SET a.x = 1",
            "other",
            [("media", "clips"), ("shop", "assets")],
        ),
        ("UPDATE t SET a = 1", "other", []),
    ],
)
def test_statement_tables(query: str, schema: str, tables: list[tuple[str, str]]) -> None:
    assert statement_tables(query, schema, BOUND) == tables


def test_a_ddl_in_a_bound_database_is_one_event_for_it() -> None:
    (event,) = translate_ddl("ALTER TABLE assets ADD x INT", "shop", ORIGIN, BOUND, read_ms=READ_MS)
    assert isinstance(event, DdlEvent)
    assert (event.source.db, event.source.table, event.query) == ("shop", "*", "ALTER TABLE assets ADD x INT")
    assert event.event_id == f"1:{FILE}:{END_POS}:ddl"
    assert event.ts_ms == READ_MS and event.source.ts_ms == COMMIT_S * 1000


def test_a_ddl_from_another_database_naming_a_bound_table_is_an_event_for_that_table() -> None:
    (event,) = translate_ddl("ALTER TABLE shop.assets ADD x INT", "other", ORIGIN, BOUND, read_ms=READ_MS)
    assert (event.source.db, event.source.table) == ("shop", "assets")
    assert event.event_id == f"1:{FILE}:{END_POS}:ddl:shop"


def test_a_ddl_naming_several_bound_databases_is_an_event_for_each() -> None:
    events = translate_ddl(
        "RENAME TABLE shop.assets TO media.clips, shop.orders TO shop.o2",
        "shop",
        ORIGIN,
        BOUND,
        read_ms=READ_MS,
    )
    assert [(e.source.db, e.source.table, e.event_id.rsplit(":", 1)[-1]) for e in events] == [
        ("shop", "*", "ddl"),
        ("media", "clips", "media"),
    ], "shop once (run there), media for the table it names"


def test_two_tables_of_one_database_named_from_elsewhere_are_the_whole_database() -> None:
    (event,) = translate_ddl(
        "ALTER TABLE shop.assets ADD a INT, shop.orders ADD b INT", "other", ORIGIN, BOUND, read_ms=READ_MS
    )
    assert (event.source.db, event.source.table) == ("shop", "*")


def test_a_ddl_touching_no_bound_table_is_nothing() -> None:
    assert translate_ddl("ALTER TABLE other.assets ADD x INT", "other", ORIGIN, BOUND, read_ms=READ_MS) == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ALTER TABLE shop.assets ADD COLUMN x INT", {"shop": {"assets"}}),
        ("ALTER TABLE `shop`.`assets` ADD COLUMN x INT", {"shop": {"assets"}}),
        ("alter table SHOP.ASSETS drop column x", {"shop": {"assets"}}),
        ("ALTER TABLE `Shop` . `Assets` ADD x INT", {"shop": {"assets"}}),
        ("ALTER TABLE shop.`assets` ADD x INT", {"shop": {"assets"}}),
        ('ALTER TABLE "shop"."assets" ADD x INT', {"shop": {"assets"}}),
        ("ALTER TABLE `shop.assets` ADD x INT", {"shop": {"assets"}}),
        ("DROP TABLE IF EXISTS shop.orders", {"shop": {"Orders"}}),
        ("RENAME TABLE other.tmp TO shop.assets", {"shop": {"assets"}}),
        ("RENAME TABLE shop.assets TO media.clips", {"shop": {"assets"}, "media": {"clips"}}),
        ("CREATE TABLE other.copy LIKE shop.assets", {"shop": {"assets"}}),
        ("ALTER TABLE shop.assets ADD a INT, shop.orders ADD b INT", {"shop": {"assets", "Orders"}}),
        ("DROP DATABASE shop", {"shop": set()}),
        ("DROP SCHEMA IF EXISTS `media`", {"media": set()}),
        ("ALTER DATABASE shop CHARACTER SET utf8mb4", {"shop": set()}),
        ("TRUNCATE TABLE shop.assets", {"shop": {"assets"}}),
    ],
)
def test_bound_tables_named_anywhere_in_the_statement(query: str, expected: dict[str, set[str]]) -> None:
    assert mentioned_databases(query, BOUND) == expected


@pytest.mark.parametrize(
    "query",
    [
        "ALTER TABLE other.assets ADD x INT",  # same table name, another database
        "ALTER TABLE shop.assets_archive ADD x INT",  # a longer name
        "ALTER TABLE myshop.assets ADD x INT",
        "ALTER TABLE assets ADD x INT",  # unqualified: bound only when run from shop (checked by schema)
        "CREATE DATABASE shopping",
        "ALTER TABLE media.videos ADD x INT",
        "DROP TABLE other.shop",
    ],
)
def test_other_tables_are_not_mentions(query: str) -> None:
    assert mentioned_databases(query, BOUND) == {}


def test_a_bare_database_word_needs_the_database_keyword() -> None:
    assert mentioned_databases("ALTER TABLE t COMMENT 'shop'", BOUND) == {}
    assert mentioned_databases("ALTER TABLE shop ADD x INT", BOUND) == {}
