"""schemas.signature: equal meaning gives an equal signature, any significant change gives another one."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.signature import SignatureError, canonical_json, normalize_schema, schema_signature

DIGEST = "ab" * 32
TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
ANNOTATIONS = ["title", "description", "$comment", "examples", "example"]

Schema = dict[str, Any]


def sig(schema: object, **overrides: Any) -> str:
    args: dict[str, Any] = {
        "model_version": "1.0.0",
        "tokenizer_version": "tok-1",
        "weights_sha256": DIGEST,
        "value_columns": ("id", "vec"),
        "model_name": "clip",
    }
    args.update(overrides)
    return schema_signature(schema, **args)  # type: ignore[arg-type]


# --- strategies --------------------------------------------------------------------------------------------

field_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6
) | st.sampled_from(["title", "description", "type", "required", "enum", "$comment", "a", "b"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)


def _unique_values(values: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for value in values:
        seen.setdefault(canonical_json(value), value)
    return list(seen.values())


leaf_schemas = st.sampled_from(TYPES[:5]).map(lambda t: {"type": t}) | st.lists(
    scalars, min_size=1, max_size=5
).map(lambda values: {"enum": _unique_values(values)})


def _object_schema(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    def build(props: dict[str, Schema]) -> st.SearchStrategy[Schema]:
        return st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required}
        )

    return st.dictionaries(field_names, children, min_size=1, max_size=4).flatmap(build)


def _extend(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    return _object_schema(children) | children.map(lambda item: {"type": "array", "items": item})


schemas = _object_schema(st.recursive(leaf_schemas, _extend, max_leaves=8))


def schema_nodes(schema: Schema) -> list[Schema]:
    """Every schema object inside ``schema`` (itself included), the way the generator nests them."""
    nodes = [schema]
    for child in schema.get("properties", {}).values():
        nodes.extend(schema_nodes(child))
    if isinstance(schema.get("items"), dict):
        nodes.extend(schema_nodes(schema["items"]))
    return nodes


# --- semantically equal rewrites ---------------------------------------------------------------------------


def _equal_number(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) < 2**53 and rng.random() < 0.5:
        return float(value)
    if isinstance(value, float) and value.is_integer() and rng.random() < 0.5:
        return int(value)
    return value


def _shuffled_dict(mapping: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    items = list(mapping.items())
    rng.shuffle(items)
    return dict(items)


def rewrite(schema: Schema, rng: random.Random) -> Schema:
    """The same schema, meaning-wise: other key order, set order, duplicates, annotations, number forms."""
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword == "properties":
            out[keyword] = _shuffled_dict({k: rewrite(v, rng) for k, v in value.items()}, rng)
        elif keyword == "items":
            out[keyword] = rewrite(value, rng)
        elif keyword == "required":
            required = list(value) + (rng.sample(value, 1) if value and rng.random() < 0.3 else [])
            rng.shuffle(required)
            out[keyword] = required
        elif keyword == "enum":
            values = [_equal_number(v, rng) for v in value]
            if rng.random() < 0.3:
                values.append(_equal_number(rng.choice(value), rng))
            rng.shuffle(values)
            out[keyword] = values
        elif keyword == "type" and rng.random() < 0.3:
            out[keyword] = [value, value] if rng.random() < 0.5 else [value]
        else:
            out[keyword] = value
    for annotation in ANNOTATIONS:
        if rng.random() < 0.25:
            out[annotation] = rng.choice(
                ["x", 1.5, {"type": "string", "title": "t"}, ["e", {"enum": [1]}], None]
            )
    return _shuffled_dict(out, rng)


def reserialize(schema: Schema, rng: random.Random) -> Schema:
    """Through JSON text with random whitespace and back."""
    indent = rng.choice([None, 0, 1, 2, 4, "\t"])
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,", " : ")])
    loaded: Schema = json.loads(
        json.dumps(schema, indent=indent, separators=separators, ensure_ascii=rng.random() < 0.5)
    )
    return loaded


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**32 - 1))
def test_semantically_equal_schemas_have_equal_signatures(schema: Schema, seed: int) -> None:
    rng = random.Random(seed)
    variant = reserialize(rewrite(schema, rng), rng)
    assert canonical_json(normalize_schema(variant)) == canonical_json(normalize_schema(schema))
    assert sig(variant) == sig(schema)


# --- significant changes -----------------------------------------------------------------------------------


def _rename_field(schema: Schema, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from([n for n in schema_nodes(schema) if "properties" in n]))
    old = data.draw(st.sampled_from(sorted(node["properties"])))
    new = data.draw(field_names.filter(lambda name: name not in node["properties"]))
    node["properties"] = {new if k == old else k: v for k, v in node["properties"].items()}


def _change_type(schema: Schema, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from([n for n in schema_nodes(schema) if "type" in n]))
    node["type"] = data.draw(st.sampled_from([t for t in TYPES if t != node["type"]]))


def _nest(schema: Schema, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from([n for n in schema_nodes(schema) if "properties" in n]))
    name = data.draw(st.sampled_from(sorted(node["properties"])))
    node["properties"][name] = {"type": "object", "properties": {name: node["properties"][name]}}


def _change_required(schema: Schema, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from([n for n in schema_nodes(schema) if "required" in n]))
    if node["required"] and data.draw(st.booleans()):
        node["required"].remove(data.draw(st.sampled_from(node["required"])))
    else:
        node["required"].append(data.draw(field_names.filter(lambda name: name not in node["required"])))


def _change_enum(schema: Schema, data: st.DataObject) -> None:
    nodes = [n for n in schema_nodes(schema) if "enum" in n]
    if not nodes:  # make one: an enum where there was a plain type is a change too
        node = data.draw(st.sampled_from([n for n in schema_nodes(schema) if n.get("type") == "object"]))
        node["enum"] = [{}]
        return
    node = data.draw(st.sampled_from(nodes))
    present = {canonical_json(v) for v in node["enum"]}
    if len(node["enum"]) > 1 and data.draw(st.booleans()):
        node["enum"].pop(data.draw(st.integers(0, len(node["enum"]) - 1)))
    else:
        node["enum"].append(data.draw(scalars.filter(lambda v: canonical_json(v) not in present)))


MUTATIONS: dict[str, Callable[[Schema, st.DataObject], None]] = {
    "rename a field": _rename_field,
    "change a type": _change_type,
    "nest a field": _nest,
    "change the required set": _change_required,
    "change enum values": _change_enum,
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, mutation=st.sampled_from(sorted(MUTATIONS)), data=st.data())
def test_any_significant_schema_change_changes_the_signature(
    schema: Schema, mutation: str, data: st.DataObject
) -> None:
    changed = copy.deepcopy(schema)
    MUTATIONS[mutation](changed, data)
    assert sig(changed) != sig(schema), mutation


@settings(max_examples=60, deadline=None)
@given(
    schema=schemas,
    argument=st.sampled_from(
        ["model_version", "tokenizer_version", "weights_sha256", "value_columns", "model_name"]
    ),
    data=st.data(),
)
def test_any_change_of_the_other_inputs_changes_the_signature(
    schema: Schema, argument: str, data: st.DataObject
) -> None:
    if argument == "weights_sha256":
        other: Any = data.draw(
            st.text("0123456789abcdef", min_size=64, max_size=64).filter(lambda d: d != DIGEST)
        )
    elif argument == "value_columns":
        other = tuple(
            data.draw(st.lists(field_names, min_size=1, max_size=3).filter(lambda c: set(c) != {"id", "vec"}))
        )
    else:
        current = {"model_version": "1.0.0", "tokenizer_version": "tok-1", "model_name": "clip"}[argument]
        other = data.draw(st.text(min_size=1, max_size=8).filter(lambda v: v != current))
    assert sig(schema, **{argument: other}) != sig(schema)


# --- examples ----------------------------------------------------------------------------------------------


def test_golden_vector() -> None:
    schema = {
        "type": "object",
        "title": "t",
        "required": ["b", "a"],
        "properties": {"a": {"type": "integer"}, "b": {"enum": [2.0, 1]}},
    }
    assert (
        schema_signature(schema, "1.2.0", "tok-3", "ab" * 32, ("vec", "id"), model_name="clip")
        == "6c5cff03e962b6d24f25f7aa59ce6b63a3afd1ff2ae90a7372c5651ec24175d5"
    )


def test_fields_named_like_annotations_are_fields() -> None:
    with_title = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    without = {"type": "object", "properties": {}, "required": ["title"]}
    assert sig(with_title) != sig(without)
    assert normalize_schema(with_title)["properties"] == {"title": {"type": "string"}}


def test_annotations_are_dropped_only_in_schema_positions() -> None:
    assert sig({"type": "string", "description": "a"}) == sig({"type": "string", "description": "b"})
    # const, default and vendor extensions are data: everything inside them counts
    assert sig({"const": {"description": "a"}}) != sig({"const": {"description": "b"}})
    assert sig({"x-ui": {"title": "a"}}) != sig({"x-ui": {"title": "b"}})
    assert sig({"default": 1}) != sig({})


def test_enum_set_semantics_and_number_forms() -> None:
    assert sig({"enum": [1, "a", None]}) == sig({"enum": [None, "a", 1.0, 1]})
    assert sig({"enum": [1]}) != sig({"enum": ["1"]})
    assert sig({"enum": [True]}) != sig({"enum": [1]})
    assert sig({"maximum": 10}) == sig({"maximum": 10.0})
    assert sig({"maximum": 2**64 - 1}) != sig({"maximum": float(2**64 - 1)})  # exact integers, no rounding


def test_schema_keywords_recurse_and_list_keywords_keep_order() -> None:
    a = {"anyOf": [{"type": "string", "title": "s"}, {"type": "integer"}]}
    b = {"anyOf": [{"type": "string"}, {"type": "integer", "description": "i"}]}
    assert sig(a) == sig(b)
    assert sig(a) != sig({"anyOf": [{"type": "integer"}, {"type": "string"}]})
    assert sig({"type": ["null", "string"]}) == sig({"type": ["string", "null", "string"]})
    assert sig({"type": ["string"]}) == sig({"type": "string"})
    assert sig({"dependentRequired": {"a": ["c", "b"]}}) == sig({"dependentRequired": {"a": ["b", "c"]}})


def test_value_columns_are_a_set() -> None:
    assert sig({}, value_columns=["vec", "id"]) == sig({}, value_columns=["id", "vec", "id"])


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (4.5, "4.5"),
        (0.002, "0.002"),
        (1e-27, "1e-27"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (333333333.33333329, "333333333.3333333"),
        (-1.5e-10, "-1.5e-10"),
        (5e-324, "5e-324"),
        (1.0, "1"),
        (-0.0, "0"),
        (1e21, "1000000000000000000000"),
        (2**64 - 1, "18446744073709551615"),
        ('\u0001\n"\\/é\U0001f600', '"\\u0001\\n\\"\\\\/é\U0001f600"'),
    ],
)
def test_canonical_json_scalars(value: object, text: str) -> None:
    assert canonical_json(value) == text


def test_canonical_json_sorts_keys_by_utf16_code_units() -> None:
    assert canonical_json({"\ue000": 1, "\U0001f600": 2, "b": 3, "a": [True, None]}) == (
        '{"a":[true,null],"b":3,"\U0001f600":2,"\ue000":1}'
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"properties": []}, r"\$\.properties: must be an object"),
        ({"properties": {"a": 3}}, r"\$\.properties\.a: a schema must be an object"),
        ({"required": ["a", 1]}, r"\$\.required: must be an array of strings"),
        ({"enum": [float("nan")]}, r"\$\.enum\[0\]: nan is not a JSON number"),
        ({"allOf": {"type": "string"}}, r"\$\.allOf: must be an array"),
        ({"const": {1, 2}}, "is not a JSON value"),
        ({"x": "\ud800"}, "unpaired surrogate"),
    ],
)
def test_malformed_schemas_are_rejected_with_a_path(schema: Schema, message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        sig(schema)


def test_weights_digest_is_checked_and_case_insensitive() -> None:
    with pytest.raises(SignatureError, match="64 hex digits"):
        sig({}, weights_sha256="xyz")
    assert sig({}, weights_sha256="AB" * 32) == sig({})
