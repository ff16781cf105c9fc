# ruff: noqa: E501  (the expected messages, one bytes literal each)
"""The connector's Kafka messages, byte for byte, for a row of every column type.

A rows event with a column of each type the values mapping knows (and one it does not) goes through the
connector's path: :func:`~connectors.binlog.translate.translate_rows` (the per-table converters of
:mod:`schemas.values`, the events built without validation) then :meth:`connectors.sending.Sender.message`
(the key and the orjson value). ``EXPECTED`` holds the bytes that path gave at 125cb94, before the hot
path was reworked for issue 9: a change to any step that moves one byte fails here. Inserts, an update,
a key change (a delete then a create), a delete, an empty SET returned as None, NULLs, a negative TIME
with a fraction, a DATETIME without one, the zero TIMESTAMP and a string key to escape are covered.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from connectors.binlog.translate import EventOrigin, RowsEvent, RowsKind, translate_rows
from connectors.checkpoint import BinlogPosition, CheckpointTracker
from connectors.kafka.limit import MessageLimit
from connectors.kafka.settings import KafkaSettings
from connectors.metrics import CONNECTOR_METRICS, ConnectorStats
from connectors.sending import Sender
from schemas.values import ColumnType, binlog_row_converter
from schemas.values.binlog import EMPTY_SET

TYPES = {
    "id": ColumnType("int"),
    "code": ColumnType("varchar"),
    "tiny": ColumnType("tinyint"),
    "big": ColumnType("bigint", unsigned=True),
    "price": ColumnType("decimal", scale=2),
    "ratio": ColumnType("float"),
    "weight": ColumnType("double"),
    "flags": ColumnType("bit", length=5),
    "day": ColumnType("date"),
    "at": ColumnType("datetime", scale=6),
    "at0": ColumnType("datetime", scale=0),
    "seen": ColumnType("timestamp", scale=3),
    "span": ColumnType("time", scale=6),
    "year": ColumnType("year"),
    "body": ColumnType("longtext"),
    "bin": ColumnType("binary", length=4),
    "varbin": ColumnType("varbinary"),
    "blob": ColumnType("blob"),
    "str": ColumnType("string"),
    "size": ColumnType("enum", members=("s", "m", "l")),
    "tags": ColumnType("set", members=("a", "b", "c")),
    "doc": ColumnType("json"),
    "shape": ColumnType("geometry"),
    "uid": ColumnType("uuid"),
    "ip4": ColumnType("inet4"),
    "ip6": ColumnType("inet6"),
    "odd": ColumnType("no such type"),
}


def full_row(key: int, code: str) -> dict[str, Any]:
    return {
        "id": key,
        "code": code,
        "tiny": -5,
        "big": 2**64 - 1,
        "price": Decimal("12.30"),
        "ratio": 1.5,
        "weight": 0.1,
        "flags": 21,
        "day": dt.date(2024, 2, 29),
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6),
        "at0": dt.datetime(2024, 1, 2, 3, 4, 5),
        "seen": dt.datetime(1970, 1, 1),
        "span": -dt.timedelta(seconds=1, microseconds=5),
        "year": 2024,
        "body": 'h\u00e9llo "w\u00f6rld"\n\u2603',
        "bin": b"\x01",
        "varbin": b"\xff\x00",
        "blob": bytes(range(40)),
        "str": "s",
        "size": "m",
        "tags": frozenset({"a", "c"}),
        "doc": {"a": [1, 2.5, None, "x"], "b": {"c": True}},
        "shape": b"\x00\x01\x02",
        "uid": bytes(range(16)),
        "ip4": b"\x7f\x00\x00\x01",
        "ip6": bytes(15) + b"\x01",
        "odd": dt.datetime(999, 12, 31, 23, 59, 59, 999_999),
    }


def null_row(key: int, code: str) -> dict[str, Any]:
    return {name: None for name in TYPES} | {"id": key, "code": code, "at": dt.datetime(1, 1, 1)}


ORIGIN = EventOrigin(server_id=7, file="binlog.000042", end_pos=9_876, timestamp_s=1_764_000_000)


def messages() -> list[tuple[str, bytes, bytes]]:
    kafka = KafkaSettings()
    tracker = CheckpointTracker(BinlogPosition("binlog.000042", 4))
    sender = Sender(
        kafka,
        MessageLimit(kafka.max_message_bytes),
        tracker,
        producer=None,  # type: ignore[arg-type]  # message() produces nothing
        stats=ConnectorStats(),
        metrics=CONNECTOR_METRICS,
    )
    nulls = {name: "null" for name in TYPES} | {"tags": EMPTY_SET}
    events: list[tuple[RowsKind, list[dict[str, Any]]]] = [
        (
            "write",
            [
                {"values": full_row(1, "a"), "none_sources": {}},
                {"values": null_row(2, "b/c d%"), "none_sources": nulls},
            ],
        ),
        (
            "update",
            [
                {
                    "before_values": full_row(1, "a"),
                    "after_values": full_row(1, "a") | {"body": "new", "tags": None},
                    "before_none_sources": {},
                    "after_none_sources": {"tags": EMPTY_SET},
                },
                {  # the key changes: a delete then a create
                    "before_values": null_row(2, "b/c d%"),
                    "after_values": full_row(3, "\u00e9"),
                    "before_none_sources": nulls,
                    "after_none_sources": {},
                },
            ],
        ),
        ("delete", [{"values": full_row(3, "\u00e9"), "none_sources": {}}]),
    ]
    out = []
    for index, (kind, rows) in enumerate(events):
        event = RowsEvent(
            kind=kind,
            schema="shop",
            table="all types",
            primary_key=("id", "code"),
            rows=rows,
            column_types=TYPES,
            origin=ORIGIN,
            row_converter=binlog_row_converter(TYPES) if index % 2 else None,
        )
        for item in translate_rows(
            event, version_source="binlog", first_ordinal=0, read_ms=1_764_000_000_123
        ):
            out.append(sender.message(item))
    return out


def test_every_column_type_gives_the_same_bytes() -> None:
    assert messages() == EXPECTED


EXPECTED = [
    (
        "freshkey.changes",
        b"shop/all%20types/1/a",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:0","op":"c","key":{"id":1,"code":"a"},"before":null,"after":{"id":1,"code":"a","tiny":-5,"big":18446744073709551615,"price":"12.30","ratio":1.5,"weight":0.1,"flags":21,"day":"2024-02-29","at":"2024-01-02T03:04:05.000006","at0":"2024-01-02T03:04:05.000000","seen":null,"span":"-00:00:01.999995","year":2024,"body":"h\xc3\xa9llo \\"w\xc3\xb6rld\\"\\n\xe2\x98\x83","bin":"AQAAAA==","varbin":"/wA=","blob":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJw==","str":"s","size":"m","tags":["a","c"],"doc":{"a":[1,2.5,null,"x"],"b":{"c":true}},"shape":"AAEC","uid":"00010203-0405-0607-0809-0a0b0c0d0e0f","ip4":"127.0.0.1","ip6":"::1","odd":"0999-12-31T23:59:59.999999"},"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":0,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081088,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
    (
        "freshkey.changes",
        b"shop/all%20types/2/b%2Fc%20d%25",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:1","op":"c","key":{"id":2,"code":"b/c d%"},"before":null,"after":{"id":2,"code":"b/c d%","tiny":null,"big":null,"price":null,"ratio":null,"weight":null,"flags":null,"day":null,"at":"0001-01-01T00:00:00.000000","at0":null,"seen":null,"span":null,"year":null,"body":null,"bin":null,"varbin":null,"blob":null,"str":null,"size":null,"tags":[],"doc":null,"shape":null,"uid":null,"ip4":null,"ip6":null,"odd":null},"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":1,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081089,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
    (
        "freshkey.changes",
        b"shop/all%20types/1/a",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:0","op":"u","key":{"id":1,"code":"a"},"before":{"id":1,"code":"a","tiny":-5,"big":18446744073709551615,"price":"12.30","ratio":1.5,"weight":0.1,"flags":21,"day":"2024-02-29","at":"2024-01-02T03:04:05.000006","at0":"2024-01-02T03:04:05.000000","seen":null,"span":"-00:00:01.999995","year":2024,"body":"h\xc3\xa9llo \\"w\xc3\xb6rld\\"\\n\xe2\x98\x83","bin":"AQAAAA==","varbin":"/wA=","blob":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJw==","str":"s","size":"m","tags":["a","c"],"doc":{"a":[1,2.5,null,"x"],"b":{"c":true}},"shape":"AAEC","uid":"00010203-0405-0607-0809-0a0b0c0d0e0f","ip4":"127.0.0.1","ip6":"::1","odd":"0999-12-31T23:59:59.999999"},"after":{"id":1,"code":"a","tiny":-5,"big":18446744073709551615,"price":"12.30","ratio":1.5,"weight":0.1,"flags":21,"day":"2024-02-29","at":"2024-01-02T03:04:05.000006","at0":"2024-01-02T03:04:05.000000","seen":null,"span":"-00:00:01.999995","year":2024,"body":"new","bin":"AQAAAA==","varbin":"/wA=","blob":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJw==","str":"s","size":"m","tags":[],"doc":{"a":[1,2.5,null,"x"],"b":{"c":true}},"shape":"AAEC","uid":"00010203-0405-0607-0809-0a0b0c0d0e0f","ip4":"127.0.0.1","ip6":"::1","odd":"0999-12-31T23:59:59.999999"},"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":0,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081088,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
    (
        "freshkey.changes",
        b"shop/all%20types/2/b%2Fc%20d%25",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:1:d","op":"d","key":{"id":2,"code":"b/c d%"},"before":{"id":2,"code":"b/c d%","tiny":null,"big":null,"price":null,"ratio":null,"weight":null,"flags":null,"day":null,"at":"0001-01-01T00:00:00.000000","at0":null,"seen":null,"span":null,"year":null,"body":null,"bin":null,"varbin":null,"blob":null,"str":null,"size":null,"tags":[],"doc":null,"shape":null,"uid":null,"ip4":null,"ip6":null,"odd":null},"after":null,"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":1,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081089,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
    (
        "freshkey.changes",
        b"shop/all%20types/3/%C3%A9",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:1:c","op":"c","key":{"id":3,"code":"\xc3\xa9"},"before":null,"after":{"id":3,"code":"\xc3\xa9","tiny":-5,"big":18446744073709551615,"price":"12.30","ratio":1.5,"weight":0.1,"flags":21,"day":"2024-02-29","at":"2024-01-02T03:04:05.000006","at0":"2024-01-02T03:04:05.000000","seen":null,"span":"-00:00:01.999995","year":2024,"body":"h\xc3\xa9llo \\"w\xc3\xb6rld\\"\\n\xe2\x98\x83","bin":"AQAAAA==","varbin":"/wA=","blob":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJw==","str":"s","size":"m","tags":["a","c"],"doc":{"a":[1,2.5,null,"x"],"b":{"c":true}},"shape":"AAEC","uid":"00010203-0405-0607-0809-0a0b0c0d0e0f","ip4":"127.0.0.1","ip6":"::1","odd":"0999-12-31T23:59:59.999999"},"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":1,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081089,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
    (
        "freshkey.changes",
        b"shop/all%20types/3/%C3%A9",
        b'{"kind":"change","event_id":"7:binlog.000042:9876:0","op":"d","key":{"id":3,"code":"\xc3\xa9"},"before":{"id":3,"code":"\xc3\xa9","tiny":-5,"big":18446744073709551615,"price":"12.30","ratio":1.5,"weight":0.1,"flags":21,"day":"2024-02-29","at":"2024-01-02T03:04:05.000006","at0":"2024-01-02T03:04:05.000000","seen":null,"span":"-00:00:01.999995","year":2024,"body":"h\xc3\xa9llo \\"w\xc3\xb6rld\\"\\n\xe2\x98\x83","bin":"AQAAAA==","varbin":"/wA=","blob":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJw==","str":"s","size":"m","tags":["a","c"],"doc":{"a":[1,2.5,null,"x"],"b":{"c":true}},"shape":"AAEC","uid":"00010203-0405-0607-0809-0a0b0c0d0e0f","ip4":"127.0.0.1","ip6":"::1","odd":"0999-12-31T23:59:59.999999"},"after":null,"source":{"server_id":7,"file":"binlog.000042","pos":9876,"row":0,"gtid":null,"ts_ms":1764000000000,"db":"shop","table":"all types"},"ts_ms":1764000000123,"version":11821949669081088,"commit_ts_us":1764000000000000,"commit_ts_coarse":true}',
    ),
]
