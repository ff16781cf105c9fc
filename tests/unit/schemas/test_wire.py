"""The fast decoder (``schemas.wire``) against the reference (``schemas.codec.decode``): whatever msgspec
accepts, the reference accepts with the same values, and every message gets the reference's outcome (the
same event, or the same refusal with the same reason)."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import DecodeError, decode
from schemas.events import MAX_TS_MS, MAX_TS_US, MAX_U64, ChangeEvent, DdlEvent, FenceEvent
from schemas.wire import WireChange, decode_change, fast_decode


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types, recursively (``True == 1`` and ``1 == 1.0`` do not count)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _as_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, msgspec.Struct):
        out: dict[str, Any] = msgspec.to_builtins(event)
        return out
    dumped: dict[str, Any] = event.model_dump()
    dumped.setdefault("oversize", False)
    return dumped


def _outcome(fn: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", _as_dict(fn(data))
    except DecodeError as exc:
        return "refused", exc.reason


def _check(data: bytes) -> None:
    reference = _outcome(decode, data)
    fast = _outcome(decode_change, data)
    assert fast[0] == reference[0], (data, fast, reference)
    assert _same(fast[1], reference[1]), (data, fast, reference)
    accepted = fast_decode(data)
    if accepted is not None:
        assert reference[0] == "ok", (data, accepted, reference)


_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_ODD = st.sampled_from(
    [-1, 0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, MAX_U64, MAX_U64 + 1, 2**100, 1.5, True, False, None,
     "", "x", "y" * 600, [], {}, {"id": 1}]
).map(copy.deepcopy)  # fmt: skip
# A copy per draw: sampled_from hands out the same list and dicts every time, and a message that set one
# as an image and then its key column to the same dict made it contain itself (json.dumps: "Circular
# reference detected"), and changed the samples of every later example.


@st.composite
def _change(draw: st.DrawFn) -> dict[str, Any]:
    """A valid change message, then none to three changes off the rules: a field given an odd value,
    left out, or added; an image whose key column differs or is missing."""
    key_value = draw(st.integers(-(2**64), 2**64) | st.text(max_size=4))
    op = draw(st.sampled_from(["c", "u", "d", "r"]))

    def image() -> dict[str, Any]:
        return {"id": key_value, **draw(st.dictionaries(st.sampled_from(["a", "b"]), _VALUE, max_size=2))}

    message: dict[str, Any] = {
        "kind": "change",
        "event_id": "1:b.000001:4:0",
        "op": op,
        "key": {"id": key_value},
        "before": image() if op in ("u", "d") else None,
        "after": image() if op != "d" else None,
        "source": {
            "server_id": draw(st.integers(0, 2**32 - 1)),
            "file": "b.000001",
            "pos": draw(st.integers(0, MAX_U64)),
            "row": draw(st.integers(0, 2**32 - 1)),
            "gtid": draw(st.sampled_from([None, "3E11FA47:7"])),
            "ts_ms": draw(st.integers(0, MAX_TS_MS)),
            "db": "db",
            "table": "t",
        },
        "ts_ms": draw(st.integers(0, MAX_TS_MS)),
        "version": draw(st.integers(0, MAX_U64)),
        "commit_ts_us": draw(st.integers(0, MAX_TS_US)),
        "commit_ts_coarse": draw(st.booleans()),
    }
    if draw(st.booleans()):
        message["oversize"] = False
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        source = message.get("source")
        where = source if isinstance(source, dict) and source and draw(st.integers(0, 3)) == 0 else message
        field = draw(st.sampled_from(sorted(where)))
        how = draw(st.sampled_from(["odd", "odd", "odd", "drop", "extra", "image"]))
        if how == "odd":
            where[field] = draw(_ODD)
        elif how == "drop":
            del where[field]
        elif how == "extra":
            where["extra"] = draw(_ODD)
        elif isinstance(message.get("after"), dict) and message["after"]:
            message["after"]["id"] = draw(_ODD | _VALUE)
    return message


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_change())
def test_the_fast_decoder_gives_the_reference_outcome(message: dict[str, Any]) -> None:
    _check(json.dumps(message).encode())


def _valid() -> dict[str, Any]:
    return {
        "kind": "change",
        "event_id": "1:b.000001:4:0",
        "op": "u",
        "key": {"id": 1},
        "before": {"id": 1, "a": "x"},
        "after": {"id": 1, "a": "y"},
        "source": {"server_id": 1, "file": "b.000001", "pos": 4, "ts_ms": 1000, "db": "db", "table": "t"},
        "ts_ms": 1001,
        "version": 7,
        "commit_ts_us": 1_000_000,
        "commit_ts_coarse": False,
    }


def _nested(depth: int, objects: bool = False) -> bytes:
    """A valid change whose column ``a`` holds a value nested ``depth`` levels deep."""
    value = b'{"a":' * depth + b"1" + b"}" * depth if objects else b"[" * depth + b"]" * depth
    return json.dumps(_valid()).encode().replace(b'"y"', value)


@pytest.mark.parametrize(
    "data",
    [
        json.dumps(_valid()).encode(),
        json.dumps(_valid(), indent=2).encode() + b"\n",
        json.dumps(_valid()).encode().replace(b'"y"', b"NaN"),
        json.dumps(_valid()).encode().replace(b'"y"', b"1e400"),
        json.dumps(_valid()).encode().replace(b'"y"', b'"\\ud800"'),
        json.dumps(_valid()).encode().replace(b'"y"', b'"\xff"'),
        json.dumps(_valid()).encode().replace(b'"op": "u"', b'"op": "u", "op": "c"'),
        json.dumps(_valid()).encode().replace(b'"version": 7', b'"version": 18446744073709551616'),
        json.dumps(_valid()).encode().replace(b'"version": 7', b'"version": 7.0'),
        json.dumps(_valid()).encode().replace(b'"id": 1}', b'"id": true}', 1),
        json.dumps(_valid()).encode()[:-3],
        json.dumps(_valid()).encode() + b"x",
        json.dumps([_valid()]).encode(),
        _nested(127),
        _nested(190),
        _nested(199),
        _nested(200),
        _nested(256),
        _nested(1000),
        _nested(5000),
        _nested(100, objects=True),
        _nested(198, objects=True),
        _nested(256, objects=True),
        json.dumps(_valid()).encode().replace(b'"y"', b"[" + b",".join([b"[1]"] * 300) + b"]"),
        b"",
        b"null",
        b"{}",
    ],
    ids=lambda d: d[-40:].decode(errors="replace"),
)
def test_edge_messages_get_the_reference_outcome(data: bytes) -> None:
    _check(data)


def test_a_valid_change_is_decoded_by_msgspec_and_others_by_the_reference() -> None:
    assert isinstance(decode_change(json.dumps(_valid()).encode()), WireChange)
    nested = decode_change(_nested(100))  # a JSON column: msgspec too, below the openers guard
    assert isinstance(nested, WireChange) and nested.after is not None and len(str(nested.after["a"])) == 200
    assert fast_decode(_nested(200)) is None and fast_decode(_nested(100)) is not None
    ddl = {"kind": "ddl", "event_id": "e", "source": _valid()["source"], "query": "ALTER", "ts_ms": 1}
    assert isinstance(decode_change(json.dumps(ddl).encode()), DdlEvent)
    fence = {"kind": "fence", "event_id": "e", "source": _valid()["source"], "reason": "r", "ts_ms": 1}
    assert isinstance(decode_change(json.dumps(fence).encode()), FenceEvent)
    huge = _valid()
    huge["after"]["a"] = float("inf")  # json writes Infinity, which msgspec refuses and pydantic reads
    event = decode_change(json.dumps(huge).encode())
    assert isinstance(event, ChangeEvent) and event.after == {"id": 1, "a": float("inf")}


def test_the_check_finds_a_fast_decoder_looser_than_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown able to fail: without the images check, msgspec accepts a change whose key differs from its
    images, which the reference refuses."""

    class Loose(msgspec.Struct, frozen=True):
        kind: str
        event_id: str
        op: str
        key: dict[str, Any]
        source: dict[str, Any]
        ts_ms: int
        version: int
        commit_ts_us: int
        commit_ts_coarse: bool
        before: dict[str, Any] | None = None
        after: dict[str, Any] | None = None
        oversize: bool = False

    import schemas.wire

    monkeypatch.setattr(schemas.wire, "_FLAT", msgspec.json.Decoder(Loose))
    monkeypatch.setattr(schemas.wire, "_NESTED", msgspec.json.Decoder(Loose))
    wrong_key = _valid()
    wrong_key["key"] = {"id": 2}
    with pytest.raises(AssertionError):
        _check(json.dumps(wrong_key).encode())


def test_the_check_finds_a_fast_decoder_that_reads_deeper_than_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shown able to fail: without the openers guard msgspec accepts a value nested 300 levels deep, which
    the reference refuses (its parser's recursion limit), and that message fails later, at the worker's
    binding, instead of being refused at decoding."""
    import schemas.wire

    _check(_nested(300))
    monkeypatch.setattr(schemas.wire, "_SAFE_OPENERS", 10**9)
    with pytest.raises(AssertionError):
        _check(_nested(300))
