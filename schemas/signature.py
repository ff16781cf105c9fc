"""Schema signatures: one hash that changes exactly when cached entries stop being valid.

A namespace's cache entries were built from an input schema, a model, a tokenizer, the key-hash weights
(the semantic keys) and a value projection. Their signature is::

    schema_signature(input_schema, model_version, tokenizer_version, weights_sha256, value_columns,
                     model_name=...)
        = lowercase hex SHA-256 of the UTF-8 bytes of canonical_json(document)

where ``document`` is this JSON object (version 1 of the form)::

    {
      "format": "freshkey.signature/1",
      "input_schema": normalize_schema(input_schema),
      "model": model_name, or null when not given,
      "model_version": model_version (the string as given, build metadata included),
      "tokenizer_version": tokenizer_version (as given),
      "value_columns": the distinct value column names, sorted (see "Order" below),
      "weights_sha256": weights_sha256 (64 lowercase hex digits)
    }

Canonical JSON (:func:`canonical_json`)
    RFC 8785 (JCS) with one difference for very large numbers. No whitespace anywhere. Object members
    sorted by key (see "Order"); keys must be unique strings. Strings: UTF-8, with only ``"`` and ``\\``
    escaped as ``\\"`` and ``\\\\``, U+0008/0009/000A/000C/000D as ``\\b \\t \\n \\f \\r``, other
    characters below U+0020 as ``\\u00xx`` (lowercase hex), everything else (``/``, non-ASCII, U+007F)
    written as itself; unpaired surrogates are an error. ``null``, ``true``, ``false`` as such.
    Numbers: NaN and infinities are an error; a number whose value is an integer (``1``, ``1.0``,
    ``-0.0``, ``1e300``) is written as that integer in plain decimal, exactly, at any magnitude, with a
    leading ``-`` when negative and no ``+``, fraction, exponent or leading zeros (``1.0`` -> ``1``,
    ``-0.0`` -> ``0``); any other number is an IEEE-754 double written as ECMAScript's
    ``Number.prototype.toString`` writes it (RFC 8785 section 3.2.2.3: shortest round-trip digits,
    ``0.1``, ``1e-7``, ``1.5e-10``, ``123.456``). Below 1e21 this is exactly JCS; JCS would write
    integers from 1e21 on with an exponent and cannot hold integers above 2**53 exactly, which a schema
    (``"maximum": 18446744073709551615``) may need.

Order
    Object keys, and the elements of every array treated as a set, are sorted by the UTF-16 code units
    of the key (for set elements: of the element's canonical JSON text), as RFC 8785 sorts keys. This
    equals code point order except that characters above U+FFFF sort before U+E000..U+FFFF.

Schema normalization (:func:`normalize_schema`)
    The input schema is a JSON Schema (any draft) or an OpenAPI Schema Object. Normalization applies
    only where a value is known to be a schema, so a property *named* ``title`` or ``description`` is a
    field name and stays. A schema is ``true``, ``false`` or an object; in a schema object:

    - annotation keywords are dropped, since they do not change which inputs are valid or what they
      mean: ``title``, ``description``, ``$comment``, ``examples``, ``example`` (OpenAPI);
    - ``type``: an array is a set (distinct, sorted); a one-element array becomes its string;
    - ``required``: an array of strings, a set (distinct, sorted);
    - ``enum``: a set of values (distinct by canonical JSON, so ``1`` and ``1.0`` are one value, sorted);
    - ``dependentRequired``, and the array form of draft-4..7 ``dependencies``: each array a set of
      strings; the schema form of ``dependencies`` is a schema;
    - schemas, recursively: the values of ``properties``, ``patternProperties``, ``$defs``,
      ``definitions``, ``dependentSchemas``; the values of ``additionalProperties``,
      ``additionalItems``, ``items`` (a schema, or an array of schemas kept in order), ``contains``,
      ``not``, ``if``, ``then``, ``else``, ``propertyNames``, ``unevaluatedItems``,
      ``unevaluatedProperties``, ``contentSchema``; each element of ``allOf``, ``anyOf``, ``oneOf``,
      ``prefixItems`` (arrays kept in order);
    - every other keyword (``const``, ``default``, ``format``, ``minimum``, ``$ref``, ``nullable``,
      ``x-...``, unknown ones) is kept with its value as plain data: only its numbers are normalized by
      the canonical JSON.

    Everything not listed is significant: field names, types, nesting, required fields, enum values,
    array order where not listed as a set. The rules err towards "different": two schemas with the same
    meaning may still get different signatures (e.g. ``allOf`` in another order, ``enum: [x]`` against
    ``const: x``), which costs a needless cutover, never a stale entry served.

A malformed value where a listed keyword expects a schema, a set of strings or an array raises
:class:`SignatureError`, which names the JSON path.

Golden vector (tests/unit/schemas/test_signature.py checks it)::

    schema_signature({"type": "object", "title": "t", "required": ["b", "a"],
                      "properties": {"a": {"type": "integer"}, "b": {"enum": [2.0, 1]}}},
                     "1.2.0", "tok-3", "ab" * 32, ("vec", "id"), model_name="clip")

hashes this canonical text (one line, split here at the commas between members)::

    {"format":"freshkey.signature/1","input_schema":{"properties":{"a":{"type":"integer"},
    "b":{"enum":[1,2]}},"required":["a","b"],"type":"object"},"model":"clip","model_version":"1.2.0",
    "tokenizer_version":"tok-3","value_columns":["id","vec"],"weights_sha256":"abab...ab" (64 digits)}

and gives ``6c5cff03e962b6d24f25f7aa59ce6b63a3afd1ff2ae90a7372c5651ec24175d5``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from schemas.errors import InvalidInput

SIGNATURE_FORMAT = "freshkey.signature/1"

ANNOTATION_KEYWORDS = frozenset({"title", "description", "$comment", "examples", "example"})
_SCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_SCHEMA_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_SCHEMA_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


class SignatureError(InvalidInput):
    """The input cannot be put in canonical form; the message names the JSON path."""


def schema_signature(
    input_schema: Mapping[str, Any] | bool,
    model_version: str,
    tokenizer_version: str,
    weights_sha256: str,
    value_columns: Iterable[str] = (),
    *,
    model_name: str | None = None,
) -> str:
    """The signature of entries built under these inputs (the module docstring defines it exactly).

    Guaranteed: equal for schemas equal under the documented normalization, whatever the key order,
    whitespace or annotations; different (up to SHA-256 collisions) when anything significant differs.
    """
    if not _SHA256_HEX.match(weights_sha256):
        raise SignatureError(f"weights_sha256 must be 64 hex digits, got {weights_sha256!r}")
    columns = list(value_columns)
    if not all(isinstance(c, str) for c in columns):
        raise SignatureError("value_columns must be strings")
    document = {
        "format": SIGNATURE_FORMAT,
        "input_schema": normalize_schema(input_schema),
        "model": model_name,
        "model_version": model_version,
        "tokenizer_version": tokenizer_version,
        "value_columns": _string_set(columns, "$value_columns"),
        "weights_sha256": weights_sha256.lower(),
    }
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


TABLE_SIGNATURE_FORMAT = "freshkey.table-signature/1"


def table_signature(value_columns: Iterable[str]) -> str:
    """The signature of entries of a namespace without a model: SHA-256 (hex) of the canonical JSON of
    ``{"format": "freshkey.table-signature/1", "value_columns": <distinct names, sorted>}``. A schema
    change or a fence moves it further (``schemas.model_updates.moved_signature``)."""
    columns = list(value_columns)
    if not all(isinstance(c, str) for c in columns):
        raise SignatureError("value_columns must be strings")
    document = {"format": TABLE_SIGNATURE_FORMAT, "value_columns": _string_set(columns, "$value_columns")}
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def normalize_schema(schema: object, path: str = "$") -> Any:
    """The schema with the documented normalization applied (a new JSON value; the input is untouched)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, Mapping):
        raise SignatureError(f"{path}: a schema must be an object or a boolean, got {_kind(schema)}")
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if not isinstance(keyword, str):
            raise SignatureError(f"{path}: object keys must be strings, got {keyword!r}")
        where = f"{path}.{keyword}"
        if keyword in ANNOTATION_KEYWORDS:
            continue
        if keyword == "type":
            out[keyword] = _normalize_type(value, where)
        elif keyword == "required":
            out[keyword] = _string_set(value, where)
        elif keyword == "enum":
            out[keyword] = _value_set(value, where)
        elif keyword == "dependentRequired":
            out[keyword] = {k: _string_set(v, f"{where}.{k}") for k, v in _mapping(value, where).items()}
        elif keyword == "dependencies":
            out[keyword] = {
                k: _string_set(v, f"{where}.{k}")
                if isinstance(v, list | tuple)
                else normalize_schema(v, f"{where}.{k}")
                for k, v in _mapping(value, where).items()
            }
        elif keyword in _SCHEMA_MAP_KEYWORDS:
            out[keyword] = {k: normalize_schema(v, f"{where}.{k}") for k, v in _mapping(value, where).items()}
        elif keyword in _SCHEMA_LIST_KEYWORDS:
            out[keyword] = [normalize_schema(v, f"{where}[{i}]") for i, v in enumerate(_array(value, where))]
        elif keyword == "items" and isinstance(value, list | tuple):
            out[keyword] = [normalize_schema(v, f"{where}[{i}]") for i, v in enumerate(value)]
        elif keyword in _SCHEMA_KEYWORDS or keyword == "items":
            out[keyword] = normalize_schema(value, where)
        else:
            out[keyword] = value
    return out


def canonical_json(value: object) -> str:
    """Canonical JSON text of a JSON value (module docstring, "Canonical JSON")."""
    return _canonical(value, "$")


def _canonical(value: object, path: str) -> str:
    parts: list[str] = []
    _write(value, parts, path)
    return "".join(parts)


def _write(value: object, out: list[str], path: str) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_number(value, path))
    elif isinstance(value, str):
        out.append(_string(value, path))
    elif isinstance(value, Mapping):
        items: list[tuple[bytes, str, object]] = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise SignatureError(f"{path}: object keys must be strings, got {key!r}")
            items.append((_utf16(key, path), key, item))
        items.sort(key=lambda entry: entry[0])
        out.append("{")
        for i, (_, key, item) in enumerate(items):
            if i:
                out.append(",")
            out.append(_string(key, path))
            out.append(":")
            _write(item, out, f"{path}.{key}")
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, f"{path}[{i}]")
        out.append("]")
    else:
        raise SignatureError(f"{path}: {_kind(value)} is not a JSON value")


def _number(value: float, path: str) -> str:
    if not math.isfinite(value):
        raise SignatureError(f"{path}: {value} is not a JSON number")
    if value.is_integer():
        return str(int(value))
    return _ecmascript_number(value)


def _ecmascript_number(value: float) -> str:
    """ECMAScript Number::toString for a finite, non-integral double (RFC 8785 3.2.2.3)."""
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, nearest to the value: the digits ECMAScript picks.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    exp10 = (int(exponent) if exponent else 0) - len(fraction)
    stripped = digits.rstrip("0")
    exp10 += len(digits) - len(stripped)
    digits = stripped
    k = len(digits)
    n = k + exp10  # value = 0.<digits> * 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exp_text = f"e{'+' if e >= 0 else '-'}{abs(e)}"
        text = digits + exp_text if k == 1 else f"{digits[0]}.{digits[1:]}{exp_text}"
    return sign + text


def _string(value: str, path: str) -> str:
    _utf16(value, path)  # rejects unpaired surrogates
    return json.dumps(value, ensure_ascii=False)


def _utf16(value: str, path: str) -> bytes:
    try:
        return value.encode("utf-16-be")
    except UnicodeEncodeError:
        raise SignatureError(f"{path}: string {value!r} holds an unpaired surrogate") from None


def _normalize_type(value: object, path: str) -> str | list[str]:
    if isinstance(value, str):
        return value
    names = _string_set(value, path)
    return names[0] if len(names) == 1 else names


def _string_set(value: object, path: str) -> list[str]:
    items = _array(value, path)
    if not all(isinstance(item, str) for item in items):
        raise SignatureError(f"{path}: must be an array of strings")
    return sorted(set(items), key=lambda s: _utf16(s, path))  # type: ignore[arg-type]


def _value_set(value: object, path: str) -> list[Any]:
    unique: dict[str, object] = {}
    for i, item in enumerate(_array(value, path)):
        unique.setdefault(_canonical(item, f"{path}[{i}]"), item)
    return [unique[text] for text in sorted(unique, key=lambda t: _utf16(t, path))]


def _array(value: object, path: str) -> list[object] | tuple[object, ...]:
    if not isinstance(value, list | tuple):
        raise SignatureError(f"{path}: must be an array, got {_kind(value)}")
    return value


def _mapping(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise SignatureError(f"{path}: must be an object, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return type(value).__name__
