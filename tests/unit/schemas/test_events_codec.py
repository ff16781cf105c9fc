"""schemas.events and schemas.codec: round trips, strict validation, message keys, canonical values."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import DecodeError, dead_letter, decode, encode, encode_value, message_key, row_key
from schemas.events import ChangeEvent, DdlEvent, DeadLetter

SOURCE: dict[str, Any] = {
    "server_id": 1,
    "file": "binlog.000003",
    "pos": 4711,
    "row": 2,
    "gtid": "0-1-42",
    "ts_ms": 1_700_000_000_000,
    "db": "shop",
    "table": "assets",
}


def change_dict(op: str = "c", **overrides: Any) -> dict[str, Any]:
    """A valid change event as a JSON-able dict (the wire form), with the images ``op`` needs."""
    row = {"id": 7, "name": "cat.png", "modality": "image"}
    images = {
        "c": (None, row),
        "r": (None, row),
        "u": ({**row, "name": "old.png"}, row),
        "d": (row, None),
    }[op]
    data: dict[str, Any] = {
        "kind": "change",
        "event_id": "1:binlog.000003:4711:2",
        "op": op,
        "key": {"id": 7},
        "before": images[0],
        "after": images[1],
        "source": dict(SOURCE),
        "ts_ms": 1_700_000_000_123,
        "version": 12345,
        "commit_ts_us": 1_700_000_000_000_000,
        "commit_ts_coarse": True,
    }
    data.update(overrides)
    return data


def raw(data: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(data)
    except TypeError:  # integers beyond 64 bits: the standard library writes them
        import json

        return json.dumps(data).encode()


def decode_error(data: dict[str, Any] | bytes) -> str:
    with pytest.raises(DecodeError) as info:
        decode(data if isinstance(data, bytes) else raw(data))
    assert str(info.value) == info.value.reason
    return info.value.reason


# --- round trips -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["c", "u", "d", "r"])
def test_change_event_round_trip(op: str) -> None:
    event = ChangeEvent.model_validate(change_dict(op))
    wire = encode(event)
    back = decode(wire)
    assert isinstance(back, ChangeEvent)
    assert back == event
    assert back.op == op
    assert back.table == ("shop", "assets")
    assert encode(back) == wire
    # The wire form is the dict we started from (nothing renamed, nothing dropped).
    assert orjson.loads(wire) == change_dict(op)


def test_change_event_round_trip_composite_string_key_and_unicode() -> None:
    data = change_dict(
        "u",
        key={"tenant": "acme/eu", "id": 3},
        before={"tenant": "acme/eu", "id": 3, "caption": "alt"},
        after={
            "tenant": "acme/eu",
            "id": 3,
            "caption": "neu \u00fc \U0001f600",
            "tags": [1, None, {"x": 1.5}],
        },
        commit_ts_coarse=False,
    )
    event = decode(raw(data))
    assert isinstance(event, ChangeEvent)
    assert decode(encode(event)) == event
    assert list(event.key) == ["tenant", "id"]


def test_ddl_event_round_trip() -> None:
    ddl = DdlEvent(
        event_id="1:binlog.000003:99:0", source=SOURCE, query="ALTER TABLE assets ADD c INT", ts_ms=5
    )
    back = decode(encode(ddl))
    assert isinstance(back, DdlEvent)
    assert back == ddl
    assert orjson.loads(encode(ddl))["kind"] == "ddl"


def test_max_version_round_trips() -> None:
    event = ChangeEvent.model_validate(change_dict(version=2**64 - 1))
    assert decode(encode(event)) == event


def test_events_are_frozen() -> None:
    event = ChangeEvent.model_validate(change_dict())
    with pytest.raises(ValueError, match="frozen"):
        event.version = 1  # type: ignore[misc]


# --- strict validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"op": "x"}, "op"),
        ({"op": "C"}, "op"),
        ({"key": {}}, "key"),
        ({"version": "5"}, "version"),
        ({"version": 5.0}, "version"),
        ({"version": -1}, "version"),
        ({"version": True}, "version"),
        ({"key": {"id": 7.0}, "after": {"id": 7.0}}, "key"),
        ({"key": {"id": None}, "after": {"id": None}}, "key"),
        ({"commit_ts_us": -1}, "commit_ts_us"),
        ({"commit_ts_us": "1700000000000000"}, "commit_ts_us"),
        ({"commit_ts_coarse": "true"}, "commit_ts_coarse"),
        ({"commit_ts_coarse": 1}, "commit_ts_coarse"),
        ({"ts_ms": -5}, "ts_ms"),
        ({"event_id": ""}, "event_id"),
        ({"surprise": 1}, "surprise"),
        ({"source": {**SOURCE, "pos": "4711"}}, "source.pos"),
        ({"source": {**SOURCE, "pos": -1}}, "source.pos"),
        ({"source": {**SOURCE, "db": ""}}, "source.db"),
        ({"source": {**SOURCE, "extra": 1}}, "source.extra"),
    ],
)
def test_invalid_fields_are_rejected_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    data = change_dict()
    data.update(overrides)
    reason = decode_error(data)
    assert f"change.{field}" in reason


def test_version_beyond_64_bits_is_rejected() -> None:
    data = raw(change_dict(version=0)).replace(b'"version":0', b'"version":18446744073709551616')
    assert "change.version" in decode_error(data)


def test_missing_required_field_is_named() -> None:
    data = change_dict()
    del data["version"]
    reason = decode_error(data)
    assert "change.version" in reason
    assert "required" in reason.lower()


def test_many_errors_are_summarised() -> None:
    reason = decode_error({"kind": "change"})
    assert "more)" in reason
    assert reason.count(";") == 4


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"after": {"name": "x"}}, ["'id'", "missing", "after"]),
        ({"after": {"id": 8, "name": "x"}}, ["'id'", "8", "7", "after"]),
        ({"after": {"id": "7", "name": "x"}}, ["'id'", "after"]),
    ],
)
def test_key_column_must_be_in_after_image_with_same_value(
    overrides: dict[str, Any], words: list[str]
) -> None:
    reason = decode_error(change_dict("c", **overrides))
    for word in words:
        assert word in reason


@pytest.mark.parametrize(
    ("before", "words"),
    [
        ({"name": "x"}, ["'id'", "missing", "before"]),
        ({"id": 6, "name": "x"}, ["'id'", "6", "before"]),
    ],
)
def test_key_column_must_be_in_before_image_with_same_value(before: dict[str, Any], words: list[str]) -> None:
    for op in ("u", "d"):
        reason = decode_error(change_dict(op, before=before))
        for word in words:
            assert word in reason


@pytest.mark.parametrize(
    ("op", "overrides", "words"),
    [
        ("c", {"after": None}, ["'c'", "needs", "after"]),
        ("r", {"after": None}, ["'r'", "needs", "after"]),
        ("c", {"before": {"id": 7}}, ["'c'", "must not have", "before"]),
        ("d", {"after": {"id": 7}}, ["'d'", "must not have", "after"]),
        ("d", {"before": None}, ["'d'", "needs", "before"]),
        ("u", {"before": None}, ["'u'", "needs", "before"]),
        ("u", {"after": None}, ["'u'", "needs", "after"]),
    ],
)
def test_op_and_images_must_agree(op: str, overrides: dict[str, Any], words: list[str]) -> None:
    reason = decode_error(change_dict(op, **overrides))
    for word in words:
        assert word in reason


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"{", b"\xff\xfe\x00", b"[]", b"null", b"42", b'"change"'],
)
def test_invalid_json_bytes_raise_decode_error(data: bytes) -> None:
    assert decode_error(data).startswith("<root>:")


@pytest.mark.parametrize("kind", ["other", "dead-letter", None])
def test_unknown_or_missing_kind_is_rejected(kind: str | None) -> None:
    data = change_dict()
    if kind is None:
        del data["kind"]
    else:
        data["kind"] = kind
    assert "kind" in decode_error(data)


def test_dead_letter_is_not_a_change_topic_message() -> None:
    letter = dead_letter("boom", b"x", stage="decode")
    with pytest.raises(DecodeError):
        decode(encode(letter))


# --- message keys and row keys -----------------------------------------------------------------------------


def test_message_key_layout() -> None:
    assert message_key("shop", "assets", {"id": 42}) == b"shop/assets/42"
    assert message_key("a.b", "c", {"id": 1}) != message_key("a", "b.c", {"id": 1})
    assert message_key("shop", "assets", {"t": "a/b", "id": 1}) == b"shop/assets/a%2Fb/1"
    assert message_key("my db", "t%1", {"id": 1}) == b"my%20db/t%251/1"


@pytest.mark.parametrize("op", ["c", "u", "d", "r"])
def test_message_key_is_the_same_for_every_change_of_a_row(op: str) -> None:
    reference = ChangeEvent.model_validate(change_dict("c"))
    other = ChangeEvent.model_validate(
        change_dict(
            op,
            event_id="1:binlog.000009:1:0",
            version=99,
            ts_ms=1,
            commit_ts_us=2,
            commit_ts_coarse=False,
            source={**SOURCE, "file": "binlog.000009", "pos": 1, "row": 0, "gtid": None},
        )
    )
    assert message_key(other.source.db, other.source.table, other.key) == message_key(
        reference.source.db, reference.source.table, reference.key
    )


def test_message_key_differs_for_different_rows_and_tables() -> None:
    keys = {
        message_key("shop", "assets", {"id": 1}),
        message_key("shop", "assets", {"id": 2}),
        message_key("shop", "texts", {"id": 1}),
        message_key("shop2", "assets", {"id": 1}),
        message_key("shop", "assets", {"a": 1, "b": 2}),
        message_key("shop", "assets", {"a": 12, "b": ""}),
        message_key("shop", "assets", {"a": "1/2"}),
    }
    assert len(keys) == 7


def test_row_key_percent_encodes_separator_and_percent() -> None:
    assert row_key(["a/b"]) == "a%2Fb"
    assert row_key(["100%"]) == "100%25"
    assert row_key(["%2F"]) == "%252F"
    assert row_key([1, "x y", "\u00e9"]) == "1/x%20y/%C3%A9"
    assert row_key(["a", "b"]) != row_key(["a/b"])


_KEY_VALUES = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.text(max_size=12),
    st.text(alphabet="AZaz09_.~-/% \n\u0660\uff10\u00e9\u0130", max_size=8),
)


@given(st.lists(_KEY_VALUES, min_size=1, max_size=3))
@settings(max_examples=500)
def test_row_key_is_quote_of_every_value(values: list[int | str]) -> None:
    """The fast path (integers and unreserved ASCII text left as they are) writes exactly what
    ``urllib.parse.quote(str(v), safe="")`` writes: other languages rebuild these keys."""
    assert row_key(values) == "/".join(quote(str(v), safe="") for v in values)


def test_row_key_quotes_non_ascii_digits_and_letters() -> None:
    # Arabic-Indic and full-width digits, a dotted capital I: letters and digits to str.isalnum and to
    # a Unicode \w, but not unreserved characters.
    assert row_key(["\u0661\u0662"]) == "%D9%A1%D9%A2"
    assert row_key(["\uff11"]) == "%EF%BC%91"
    assert row_key(["\u0130", "a\n"]) == "%C4%B0/a%0A"
    assert row_key([-12, "-1.5_~"]) == "-12/-1.5_~"
    assert row_key(["a%2Fb"]) != row_key(["a/b"])


_key_parts = st.lists(
    st.text(st.characters(codec="utf-8"), max_size=8) | st.integers(), min_size=1, max_size=4
)


@settings(max_examples=200, deadline=None)
@given(_key_parts, _key_parts)
def test_row_key_is_injective(a: list[int | str], b: list[int | str]) -> None:
    # int and str of the same digits are the same key by design; compare as strings.
    if [str(v) for v in a] != [str(v) for v in b]:
        assert row_key(a) != row_key(b)
    else:
        assert row_key(a) == row_key(b)


# --- cache values and dead letters -------------------------------------------------------------------------


def test_encode_value_is_canonical() -> None:
    one = {"b": 1, "a": {"z": [1, 2], "y": None}, "c": "x"}
    two = {"c": "x", "a": {"y": None, "z": [1, 2]}, "b": 1}
    assert encode_value(one) == encode_value(two) == b'{"a":{"y":null,"z":[1,2]},"b":1,"c":"x"}'


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=5),
        st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5) | st.none() | st.booleans(),
        max_size=8,
    )
)
def test_encode_value_ignores_insertion_order(value: dict[str, Any]) -> None:
    reversed_value = dict(reversed(list(value.items())))
    assert encode_value(value) == encode_value(reversed_value)
    assert orjson.loads(encode_value(value)) == value


def test_dead_letter_keeps_original_bytes() -> None:
    original = bytes(range(256)) + b"\x00not json"
    letter = dead_letter(
        "<root>: Invalid JSON",
        original,
        stage="decode",
        topic="changes",
        partition=3,
        offset=17,
        key=b"k\xff",
    )
    assert base64.b64decode(letter.original_b64, validate=True) == original
    assert base64.b64decode(letter.key_b64 or "", validate=True) == b"k\xff"
    assert (letter.reason, letter.stage, letter.topic, letter.partition, letter.offset) == (
        "<root>: Invalid JSON",
        "decode",
        "changes",
        3,
        17,
    )
    assert letter.ts_ms > 0
    back = DeadLetter.model_validate_json(encode(letter))
    assert back == letter
    assert base64.b64decode(back.original_b64) == original


def test_dead_letter_without_key() -> None:
    letter = dead_letter("bad", b"", stage="bind")
    assert letter.key_b64 is None
    assert letter.original_b64 == ""
    assert letter.kind == "dead-letter"


def test_dead_letter_of_a_huge_message_is_bounded_and_describes_the_whole() -> None:
    import hashlib

    from schemas.codec import dead_letter_size_bound

    original = b"\xff" * (5 * 1024 * 1024)
    letter = dead_letter("x" * 100_000, original, stage="decode", key=b"k" * 10_000, max_original_bytes=1000)
    wire = encode(letter)
    assert len(wire) <= dead_letter_size_bound(1000)
    assert letter.truncated
    assert letter.original_size == len(original)
    assert letter.original_sha256 == hashlib.sha256(original).hexdigest()
    assert base64.b64decode(letter.original_b64) == original[:1000]
    assert len(letter.reason) <= 2000


def test_small_dead_letter_is_whole() -> None:
    letter = dead_letter("bad", b"abc", stage="bind")
    assert not letter.truncated
    assert letter.original_size == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ts_ms", 10**400),
        ("ts_ms", 253_402_300_800_000),
        ("version", 2**64),
        ("commit_ts_us", 10**30),
        ("ts_ms", -1),
    ],
)
def test_out_of_range_numbers_are_decode_errors_that_name_the_field(field: str, value: int) -> None:
    reason = decode_error(change_dict(**{field: value}))
    assert field in reason


def test_out_of_range_source_numbers_are_decode_errors() -> None:
    reason = decode_error(change_dict(source={**SOURCE, "pos": 2**64}))
    assert "source.pos" in reason


def test_oversize_change_has_no_images_and_is_on_the_wire_only_when_set() -> None:
    plain = decode(raw(change_dict("u")))
    assert b"oversize" not in encode(plain)
    event = decode(raw(change_dict("u", before=None, after=None, oversize=True)))
    assert isinstance(event, ChangeEvent)
    assert event.oversize
    assert event.before is None and event.after is None
    assert b'"oversize":true' in encode(event)
    assert "no images" in decode_error(change_dict("u", oversize=True))
