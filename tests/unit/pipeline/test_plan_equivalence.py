"""pipeline.plan.plan gives exactly what its previous (slower) form gave: the same actions, or the same
error with the same message, for every combination of binding, op, key type and image below.

``reference_plan`` is the form before the worker's hot path was flattened (per-column ``_column`` calls,
``entry_key`` per image, ``isinstance`` checks per key value), kept here as the yardstick.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from cache_writer import CacheAction, entry_key
from pipeline.plan import BindError, KeyOf, SignatureOf, commit_time_us, event_version, plan
from schemas import Binding, ChangeEvent, encode_value, row_key

PREFIX = "fk"


def _column(image: Mapping[str, Any], column: str, what: str, event: ChangeEvent) -> Any:
    try:
        return image[column]
    except KeyError:
        raise BindError(
            f"{what} column {column!r} of the binding is not in {event.source.db}.{event.source.table}"
        ) from None


def _key_values(binding: Binding, event: ChangeEvent, image: Mapping[str, Any]) -> list[int | str]:
    columns = binding.key_columns or tuple(event.key)
    values: list[int | str] = []
    for column in columns:
        value = _column(image, column, "key", event)
        if value is None or not isinstance(value, int | str) or isinstance(value, bool):
            raise BindError(f"key column {column!r} holds {value!r}; a key must be an integer or a string")
        values.append(value)
    return values


def _value(binding: Binding, event: ChangeEvent, image: Mapping[str, Any]) -> bytes:
    projected = (
        image
        if binding.value_columns is None
        else {c: _column(image, c, "value", event) for c in binding.value_columns}
    )
    try:
        return encode_value(projected)
    except TypeError as exc:
        raise BindError(f"value of {event.source.db}.{event.source.table} cannot be cached: {exc}") from None


def reference_plan(
    binding: Binding,
    event: ChangeEvent,
    *,
    prefix: str,
    key_of: KeyOf | None = None,
    signature_of: SignatureOf | None = None,
) -> list[CacheAction]:
    version = event_version(binding, event)
    commit_us, _ = commit_time_us(binding, event)

    def key(image: Mapping[str, Any]) -> str | None:
        if key_of is not None:
            return key_of(image)
        return entry_key(prefix, binding.namespace, _key_values(binding, event, image))

    actions: list[CacheAction] = []
    new_key = key(event.after) if event.after is not None else None
    if event.before is not None:
        old_key = key(event.before)
        if old_key is not None and old_key != new_key:
            actions.append(CacheAction("invalidate", old_key, version, commit_us))
    if event.after is not None and new_key is not None:
        if binding.on_change == "invalidate":
            actions.append(CacheAction("invalidate", new_key, version, commit_us))
        else:
            actions.append(
                CacheAction(
                    "write",
                    new_key,
                    version,
                    commit_us,
                    _value(binding, event, event.after),
                    signature=signature_of(event.after) if signature_of is not None else None,
                    row=row_key(_key_values(binding, event, event.after)) if binding.semantic else None,
                )
            )
    return actions


class Text(str):
    pass


class Number(int):
    pass


BINDINGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "key id": {"key_columns": ["id"]},
    "key slug": {"key_columns": ["slug"]},
    "key slug,id": {"key_columns": ["slug", "id"]},
    "key missing": {"key_columns": ["nope"]},
    "values": {"value_columns": ["name", "id"]},
    "values missing": {"value_columns": ["name", "nope", "also"]},
    "version+time": {"version_column": "at", "commit_time_column": "at"},
    "version int": {"version_column": "v"},
    "invalidate": {"on_change": "invalidate", "key_columns": ["slug"], "version_column": "v"},
}

SLUGS: list[Any] = [
    "a", "cat/01%", "ümlaut", "", "a b", Text("sub"), 7, -3, Number(5), True, None, 1.5, [1], 2**70,
]  # fmt: skip
NAMES: list[Any] = ["n", 2**70, {"deep": [1, 2.5, None]}]
ATS: list[Any] = ["2024-01-01 00:00:00.000001", "2024-01-01T00:00:00+02:00", "nonsense", "12345", 5, None]


def _event(op: str, row_id: Any, before: dict[str, Any] | None, after: dict[str, Any] | None) -> ChangeEvent:
    return ChangeEvent.model_validate(
        {
            "event_id": "1:binlog.000003:4711:1",
            "op": op,
            "key": {"id": row_id},
            "before": before,
            "after": after,
            "source": {
                "server_id": 1,
                "file": "binlog.000003",
                "pos": 4711,
                "row": 1,
                "ts_ms": 1_700_000_000_000,
                "db": "shop",
                "table": "assets",
            },
            "ts_ms": 1_700_000_000_005,
            "version": (3 << 48) | (4711 << 16) | 1,
            "commit_ts_us": 1_700_000_000_000_000,
            "commit_ts_coarse": True,
        }
    )


def _cases() -> list[tuple[str, ChangeEvent]]:
    cases: list[tuple[str, ChangeEvent]] = []
    for row_id, slug, name, at in itertools.product([7, "x/y"], SLUGS, NAMES, ATS):
        old = {"id": row_id, "slug": "old", "name": "before", "at": "2023-12-31 23:59:59", "v": 3}
        new = {"id": row_id, "slug": slug, "name": name, "at": at, "v": 4}
        cases.append((f"u {row_id!r} {slug!r} {name!r} {at!r}", _event("u", row_id, old, new)))
        cases.append((f"c {row_id!r} {slug!r}", _event("c", row_id, None, new)))
        cases.append((f"d {row_id!r} {slug!r}", _event("d", row_id, new, None)))
    return cases


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # the same class and message, or the same actions
        return (type(exc), str(exc))


@pytest.mark.parametrize("name", sorted(BINDINGS))
def test_plan_is_the_reference_plan(name: str) -> None:
    binding = Binding(table="shop.assets", namespace="assets", **BINDINGS[name])
    for label, event in _cases():
        expected = _outcome(reference_plan, binding, event, prefix=PREFIX)
        got = _outcome(plan, binding, event, prefix=PREFIX)
        assert got == expected, label


def test_plan_with_key_of_and_signature_is_the_reference_plan() -> None:
    binding = Binding(table="shop.assets", namespace="assets", key_columns=["slug"])

    def key_of(image: Mapping[str, Any]) -> str | None:
        return None if image.get("name") == "unkeyed" else f"sem:{image['slug']}"

    def signature_of(image: Mapping[str, Any]) -> str | None:
        return "sig" if image.get("id") == 7 else None

    for label, event in _cases():
        options = functools.partial(_outcome, prefix=PREFIX, key_of=key_of, signature_of=signature_of)
        expected = options(reference_plan, binding, event)
        got = options(plan, binding, event)
        assert got == expected, label


def test_the_cases_cover_actions_and_errors() -> None:
    """The matrix above reaches writes, invalidations and each kind of BindError (not only one)."""
    binding = Binding(table="shop.assets", namespace="assets", key_columns=["slug"])
    results = [_outcome(plan, binding, e, prefix=PREFIX) for _, e in _cases()]
    kinds = {a.kind for r in results if isinstance(r, list) for a in r}
    errors = {r[1].split(";")[0][:20] for r in results if isinstance(r, tuple)}
    assert kinds == {"write", "invalidate"}
    assert any("holds" in r[1] for r in results if isinstance(r, tuple))
    assert any("cannot be cached" in r[1] for r in results if isinstance(r, tuple))
    assert len(errors) >= 2
