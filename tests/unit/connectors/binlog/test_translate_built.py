"""connectors.binlog.translate builds its change events without validating each one again: the events
it builds are the events validation would have made, and what validation refuses is still refused.

Each event ``translate_rows`` yields is compared with the same fields validated by pydantic (equality,
the fields set, the JSON on the wire); rows whose key or ranges validation would refuse still become dead
letters with validation's reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from connectors.binlog.translate import EventOrigin, RowsEvent, RowsKind, translate_rows
from schemas import ChangeEvent, DeadLetter, Source
from schemas.values import ColumnType

ORIGIN = EventOrigin(
    server_id=3, file="binlog.000012", end_pos=4_000, timestamp_s=1_700_000_000, gtid="0-3-9"
)
TYPES = {"note": ColumnType("text")}  # id and code untyped: any int or str
KEYS = st.integers(-(2**70), 2**70) | st.text(max_size=8)
NOTES = st.none() | st.text(max_size=20)


def validated(event: ChangeEvent) -> ChangeEvent:
    fields = {name: getattr(event, name) for name in event.__pydantic_fields_set__}
    fields["source"] = Source(
        **{name: getattr(event.source, name) for name in event.source.__pydantic_fields_set__}
    )
    return ChangeEvent(**fields)


def translate(
    kind: RowsKind, rows: list[dict[str, Any]], *, read_ms: int = 1_700_000_000_500, **kw: Any
) -> list[Any]:
    event = RowsEvent(
        kind=kind,
        schema="shop",
        table="assets",
        primary_key=kw.pop("primary_key", ("id", "code")),
        rows=rows,
        column_types=TYPES,
        origin=kw.pop("origin", ORIGIN),
    )
    return list(
        translate_rows(
            event, version_source=kw.pop("version_source", "binlog"), first_ordinal=5, read_ms=read_ms
        )
    )


@given(
    st.lists(st.tuples(KEYS, KEYS, NOTES, NOTES, KEYS), min_size=1, max_size=5),
    st.sampled_from(["binlog", "gtid"]),
)
@settings(max_examples=300)
def test_built_events_are_the_validated_events(rows: list[tuple[Any, ...]], version_source: str) -> None:
    updates = [
        {
            "before_values": {"id": key, "code": "a", "note": old},
            "after_values": {"id": key if i % 2 else other, "code": "a", "note": new},
        }
        for i, (key, _, old, new, other) in enumerate(rows)
    ]
    writes = [{"values": {"id": key, "code": code, "note": new}} for key, code, _, new, _ in rows]
    for kind, images in (("update", updates), ("write", writes), ("delete", writes)):
        for item in translate(kind, images, version_source=version_source):  # type: ignore[arg-type]
            assert isinstance(item, ChangeEvent), item
            again = validated(item)
            assert item == again
            assert item.__pydantic_fields_set__ == again.__pydantic_fields_set__
            assert item.source.__pydantic_fields_set__ == again.source.__pydantic_fields_set__
            assert item.model_dump_json() == again.model_dump_json()
            assert item.model_dump() == again.model_dump()


@pytest.mark.parametrize(
    ("rows", "kw", "reason"),
    [
        ([{"values": {"id": 1.5, "code": "a"}}], {}, "key.id"),
        ([{"values": {"id": True, "code": "a"}}], {}, "key.id"),
        ([{"values": {"id": 1, "code": 2.5}}], {"types": {"code": ColumnType("double")}}, "key.code"),
        ([{"values": {"id": 1, "code": "a"}}], {"read_ms": -1}, "ts_ms"),
        (
            [{"values": {"id": 1, "code": "a"}}],
            {"origin": EventOrigin(2**33, "binlog.000001", 4, 1)},
            "server_id",
        ),
        ([{"values": {"id": 1}}], {}, "primary key column 'code' is not in the row image"),
    ],
)
def test_what_validation_refuses_is_still_a_dead_letter(
    rows: list[dict[str, Any]], kw: dict[str, Any], reason: str
) -> None:
    types = kw.pop("types", None)
    if types is not None:
        event = RowsEvent("write", "shop", "assets", ("id", "code"), rows, types, ORIGIN)
        items = list(
            translate_rows(event, version_source="binlog", first_ordinal=0, read_ms=1_700_000_000_000)
        )
    else:
        items = translate("write", rows, **kw)
    assert len(items) == 1 and isinstance(items[0], DeadLetter), items
    assert "row of shop.assets is not a valid change" in items[0].reason
    assert reason in items[0].reason


TEXTS = st.text(min_size=0, max_size=600)
INTS = st.integers(-5, 2**65) | st.booleans()


@given(INTS, TEXTS, INTS, INTS, st.none() | TEXTS, st.integers(-5, 2**45) | st.booleans(), TEXTS, TEXTS)
@settings(max_examples=500)
def test_a_source_is_the_validated_source_or_validation_refuses_it(
    server_id: Any, file: Any, end_pos: Any, row: Any, gtid: Any, timestamp_s: Any, db: Any, table: Any
) -> None:
    """EventOrigin.source builds in-range sources directly: the same model validation makes (fields,
    fields set, JSON), and a value out of range or of another type still raises validation's error."""
    origin = EventOrigin(server_id, file, end_pos, timestamp_s, gtid)
    try:
        expected = Source(
            server_id=server_id,
            file=file,
            pos=end_pos,
            row=row,
            gtid=gtid,
            ts_ms=timestamp_s * 1000,
            db=db,
            table=table,
        )
    except ValidationError:
        with pytest.raises(ValidationError):
            origin.source(db, table, row)
        return
    built = origin.source(db, table, row)
    assert built == expected
    assert built.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert built.model_dump_json() == expected.model_dump_json()
