"""schemas.model_updates: strict model-update events, semantic-version precedence, the acceptance check."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.codec import DecodeError
from schemas.model_updates import (
    ModelUpdate,
    ModelUpdateRejected,
    SemVer,
    check_update,
    decode_model_update,
    signature_order,
)
from schemas.signature import schema_signature

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def update(**overrides: Any) -> ModelUpdate:
    fields: dict[str, Any] = {
        "model": "clip",
        "model_version": "1.2.0",
        "tokenizer_version": "tok-1",
        "input_schema": SCHEMA,
        "weights_ref": "/models/clip.fkw",
        "weights_sha256": "0" * 64,
        "namespaces": ("assets",),
        "ts_ms": 1_700_000_000_000,
    }
    fields.update(overrides)
    return ModelUpdate(**fields)


def test_defaults_round_trip_and_frozen() -> None:
    event = update()
    assert event.kind == "model-update"
    assert event.key_bits == 64
    assert decode_model_update(event.model_dump_json().encode()) == event
    with pytest.raises(ValidationError):
        event.model = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model_version": "1.2"}, "model_version"),
        ({"model_version": "01.2.3"}, "model_version"),
        ({"model_version": "1.2.3-"}, "model_version"),
        ({"model_version": "1.2.3-01"}, "model_version"),
        ({"model_version": "v1.2.3"}, "model_version"),
        ({"model_version": "1.2.٣"}, "model_version"),  # a non-ASCII digit
        ({"weights_sha256": "A" * 64}, "weights_sha256"),
        ({"weights_sha256": "0" * 63}, "weights_sha256"),
        ({"namespaces": ()}, "namespaces"),
        ({"namespaces": ("a", "a")}, "namespaces"),
        ({"namespaces": ("a b",)}, "namespaces"),
        ({"namespaces": ["assets"]}, "namespaces"),  # strict: a tuple in Python, an array in JSON
        ({"key_bits": 32}, "key_bits"),
        ({"ts_ms": "1"}, "ts_ms"),
        ({"input_schema": {"properties": []}}, "input_schema"),
        ({"input_schema": {"enum": [float("inf")]}}, "input_schema"),
        ({"model": ""}, "model"),
        ({"extra": 1}, "extra"),
    ],
)
def test_invalid_updates_are_rejected(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        update(**overrides)
    assert field in str(info.value)


def test_decode_reports_the_reason() -> None:
    with pytest.raises(DecodeError, match="model_version"):
        decode_model_update(update().model_dump_json().replace("1.2.0", "1.2").encode())
    with pytest.raises(DecodeError):
        decode_model_update(b"not json")


def test_json_arrays_become_tuples() -> None:
    event = decode_model_update(update(namespaces=("a", "b"), key_bits=128).model_dump_json().encode())
    assert event.namespaces == ("a", "b")
    assert event.key_bits == 128


def test_semver_precedence_follows_the_spec() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "1.10.0",
        "2.0.0",
    ]
    parsed = [SemVer.parse(v) for v in ordered]
    assert sorted(reversed(parsed)) == parsed
    assert all(a < b and b > a and a <= b and not a >= b for a, b in itertools.pairwise(parsed))
    assert SemVer.parse("1.0.0+build.1") == SemVer.parse("1.0.0+build.2")
    assert str(SemVer.parse("1.0.0-rc.1+b.7")) == "1.0.0-rc.1+b.7"


versions = st.builds(
    lambda major, minor, patch, pre: f"{major}.{minor}.{patch}" + (f"-{pre}" if pre else ""),
    st.integers(0, 20),
    st.integers(0, 20),
    st.integers(0, 20),
    st.sampled_from(["", "alpha", "alpha.1", "beta.2", "beta.11", "rc.1", "1", "x-y.0"]),
)


@settings(max_examples=200, deadline=None)
@given(a=versions, b=versions, c=versions)
def test_semver_order_is_a_total_order(a: str, b: str, c: str) -> None:
    x, y, z = SemVer.parse(a), SemVer.parse(b), SemVer.parse(c)
    assert (x < y) + (x == y) + (x > y) == 1
    if x <= y and y <= z:
        assert x <= z
    if x == y:
        assert hash(x) == hash(y)


identifiers = st.one_of(
    st.integers(0, 10**25).map(str),
    st.text(alphabet="0123456789abcXYZ-", min_size=1, max_size=6).filter(
        lambda s: not s.isdigit() or s == "0" or not s.startswith("0")
    ),
)
wide_versions = st.builds(
    lambda core, pre, build: ".".join(map(str, core)) + (f"-{'.'.join(pre)}" if pre else "") + build,
    st.tuples(st.integers(0, 10**30), st.integers(0, 12), st.integers(0, 12)),
    st.lists(identifiers, max_size=4),
    st.sampled_from(["", "+b.1", "+other"]),
)


@settings(max_examples=500, deadline=None)
@given(a=wide_versions, b=wide_versions)
def test_order_key_bytes_follow_precedence(a: str, b: str) -> None:
    x, y = SemVer.parse(a), SemVer.parse(b)
    kx, ky = x.order_key().encode("ascii"), y.order_key().encode("ascii")
    assert (kx < ky) == (x < y) and (kx == ky) == (x == y)
    # the sequence part never overrides the version part
    assert (signature_order(x, 10**19).encode() < signature_order(y, 0).encode()) == (x < y) or x == y


def test_order_key_on_the_spec_examples_and_sequences() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
               "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0", "2.0.0"]  # fmt: skip
    keys = [SemVer.parse(v).order_key() for v in ordered]
    assert sorted(keys) == keys and len(set(keys)) == len(keys)
    assert SemVer.parse("1.0.0").order_key() == "001100100010" + "1 "
    one = SemVer.parse("1.0.0")
    assert signature_order(one, 0) < signature_order(one, 1) < signature_order(SemVer.parse("1.0.1"))
    assert signature_order(one, 7).endswith("/00000000000000000007")
    with pytest.raises(ValueError, match="sequence"):
        signature_order(one, -1)


def test_check_update_accepts_a_newer_version_for_known_namespaces() -> None:
    check_update(update(model_version="1.2.1"), update(), {"assets", "other"})
    check_update(update(), None, {"assets"})
    check_update(update(model_version="1.2.0"), update(model_version="1.2.0-rc.9"), {"assets"})


@pytest.mark.parametrize("version", ["1.2.0", "1.1.9", "1.2.0-rc.1", "1.2.0+other-build", "0.9.0"])
def test_check_update_rejects_versions_not_newer(version: str) -> None:
    with pytest.raises(ModelUpdateRejected) as info:
        check_update(update(model_version=version), update(), {"assets"})
    assert info.value.code == "not-newer"
    assert version in info.value.reason and "1.2.0" in info.value.reason


def test_check_update_rejects_unknown_namespaces() -> None:
    with pytest.raises(ModelUpdateRejected) as info:
        check_update(update(namespaces=("assets", "ghost")), None, {"assets"})
    assert info.value.code == "unknown-namespace"
    assert "ghost" in info.value.reason


def test_signature_of_an_update() -> None:
    event = update()
    assert event.signature(("id",)) == schema_signature(
        SCHEMA, "1.2.0", "tok-1", "0" * 64, ("id",), model_name="clip"
    )
    assert event.signature() != update(model="siglip").signature()
    assert event.signature() != update(tokenizer_version="tok-2").signature()
    assert event.signature() == update(input_schema={**SCHEMA, "description": "new docs"}).signature()
