"""connectors.encoding: the connector's fast message key and value of a change are schemas.codec's.

The reference is :func:`schemas.codec.encode` and :func:`schemas.codec.message_key`: every key must be
the same bytes, every value must decode to the same event and the same JSON document (orjson and
pydantic may spell a float differently, never its value), and for the images the values mapping makes
the bytes are the same too.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.encoding import MessageKeys, encode_change
from schemas import ChangeEvent, Source, decode, encode, message_key

NAMES = st.text(min_size=1, max_size=8)
KEY_VALUES = st.integers(-(2**70), 2**70) | st.text(max_size=8)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
# What only pydantic writes (or writes otherwise than orjson): the encoder must fall back for these.
ODD_VALUES = (
    st.integers(2**64, 2**80)
    | st.integers(-(2**80), -(2**63) - 1)
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
    | st.datetimes()
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.dates()
    | st.frozensets(st.integers(0, 3))
    | st.just(float("nan"))
    | st.just(float("inf"))
)


def event(
    key: dict[str, Any], images: dict[str, Any], op: str, db: str, table: str, gtid: str | None
) -> ChangeEvent:
    before = {**images, **key} if op in ("u", "d") else None
    after = {**images, **key} if op in ("c", "u", "r") else None
    return ChangeEvent(
        event_id="1:binlog.000003:77:0",
        op=op,  # type: ignore[arg-type]
        key=key,
        before=before,
        after=after,
        source=Source(
            server_id=1,
            file="binlog.000003",
            pos=77,
            row=0,
            gtid=gtid,
            ts_ms=1_700_000_000_000,
            db=db,
            table=table,
        ),
        ts_ms=1_700_000_000_123,
        version=2**64 - 1,
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
    )


def same_meaning(fast: bytes, reference: bytes) -> None:
    assert decode(fast) == decode(reference)
    assert json.loads(fast) == json.loads(reference)


@given(
    st.dictionaries(NAMES, KEY_VALUES, min_size=1, max_size=3),
    st.dictionaries(NAMES, JSON_VALUES, max_size=5),
    st.sampled_from(["c", "u", "d", "r"]),
    NAMES,
    NAMES,
    st.none() | st.text(max_size=10),
)
@settings(max_examples=400)
def test_a_change_encodes_to_what_the_codec_writes(
    key: dict[str, Any], images: dict[str, Any], op: str, db: str, table: str, gtid: str | None
) -> None:
    change = event(key, images, op, db, table, gtid)
    fast, reference = encode_change(change), encode(change)
    same_meaning(fast, reference)
    assert fast == reference
    assert MessageKeys().key(db, table, change.key) == message_key(db, table, change.key)


@given(st.dictionaries(NAMES, ODD_VALUES, min_size=1, max_size=3), st.sampled_from(["c", "u", "d"]))
@settings(max_examples=200)
def test_values_only_pydantic_writes_fall_back_to_the_codec(images: dict[str, Any], op: str) -> None:
    change = event({"id": 1}, images, op, "shop", "assets", None)
    assert encode_change(change) == encode(change)


def test_the_images_of_the_values_mapping_are_the_same_bytes() -> None:
    images = {
        "name": 'lamp \u00e9\u4e2d\U0001f600 "quoted" \\ \n\t\x00',
        "price": "5.00",
        "ratio": 0.1,
        "big": 2**64 - 1,
        "small": -(2**63),
        "at": "2024-01-02T03:04:05.000000",
        "tags": ["a", "b"],
        "doc": {"k": [1, None, True, 1.5e300]},
        "none": None,
    }
    for op in ("c", "u", "d"):
        change = event({"id": 7, "code": "a/b c"}, images, op, "my db", "t%1", "0-1-2")
        assert encode_change(change) == encode(change)


def test_oversize_is_on_the_wire_only_when_true() -> None:
    change = event({"id": 1}, {}, "u", "shop", "assets", None)
    stand_in = change.model_copy(update={"before": None, "after": None, "oversize": True})
    assert b"oversize" not in encode_change(change)
    assert encode_change(stand_in) == encode(stand_in)
    assert b'"oversize":true' in encode_change(stand_in)


def test_the_keys_of_several_tables_keep_their_own_prefix() -> None:
    keys = MessageKeys()
    for db, table, key in [
        ("a", "t", {"id": 1}),
        ("a/b", "t", {"id": "x/y"}),
        ("a", "t", {"id": -5, "s": "%"}),
    ]:
        assert keys.key(db, table, key) == message_key(db, table, key)
    assert keys.key("a", "t", {"id": True}) == message_key("a", "t", {"id": True})


def test_an_aware_datetime_is_not_written_in_orjson_s_own_form() -> None:
    """Negative control of the fallback: orjson alone writes it otherwise than pydantic."""
    moment = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    change = event({"id": 1}, {"at": moment}, "c", "shop", "assets", None)
    reference = encode(change)
    assert b'"2024-01-02T03:04:05Z"' in reference
    assert orjson.dumps({"at": moment}) == b'{"at":"2024-01-02T03:04:05+00:00"}'
    assert encode_change(change) == reference
