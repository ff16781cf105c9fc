"""From a change event and its binding to the cache actions that make every tier agree with the row.

Pure: no I/O. The Faust agent (``pipeline.worker``) decodes, calls :func:`plan`, applies the actions to
the tiers and records the outcomes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from cache_writer import CacheAction, entry_key
from schemas import Binding, ChangeEvent, VersionError, column_version, encode_value
from schemas.versions import MAX_VERSION, datetime_to_us


class BindError(ValueError):
    """The event does not fit its binding (a named column is missing, a version is unusable)."""


def _column(image: Mapping[str, Any], column: str, what: str, event: ChangeEvent) -> Any:
    try:
        return image[column]
    except KeyError:
        raise BindError(
            f"{what} column {column!r} of the binding is not in {event.source.db}.{event.source.table}"
        ) from None


def _key(binding: Binding, event: ChangeEvent, image: Mapping[str, Any], prefix: str) -> str:
    columns = binding.key_columns or tuple(event.key)
    values = []
    for column in columns:
        value = _column(image, column, "key", event)
        if value is None or not isinstance(value, int | str) or isinstance(value, bool):
            raise BindError(f"key column {column!r} holds {value!r}; a key must be an integer or a string")
        values.append(value)
    return entry_key(prefix, binding.namespace, values)


def _value(binding: Binding, event: ChangeEvent, image: Mapping[str, Any]) -> bytes:
    projected = (
        image
        if binding.value_columns is None
        else {c: _column(image, c, "value", event) for c in binding.value_columns}
    )
    try:
        return encode_value(projected)
    except TypeError as exc:  # e.g. an integer beyond 64 bits
        raise BindError(f"value of {event.source.db}.{event.source.table} cannot be cached: {exc}") from None


def event_version(binding: Binding, event: ChangeEvent) -> int:
    """The version of this change: the event's (binlog coordinates), or the binding's version column.

    A delete has no version column of its own (its before image holds the version of the row it
    removes), so it is that version + 1: a delete is newer than the row state it removes, and a fill of
    that state read just before the delete is refused by the tombstone.
    """
    if binding.version_column is None:
        return event.version
    image = event.after if event.after is not None else event.before
    assert image is not None
    try:
        version = column_version(_column(image, binding.version_column, "version", event))
    except VersionError as exc:
        raise BindError(str(exc)) from None
    if event.after is None:
        if version >= MAX_VERSION:
            raise BindError("version column at its maximum: a delete cannot be newer")
        version += 1
    return version


def commit_time_us(binding: Binding, event: ChangeEvent) -> tuple[int, bool]:
    """Commit time in µs and whether it is coarse (the binlog's one-second timestamp).

    The binding's commit time column is read from the after image; a delete has none (its before image
    holds the time of the previous change), so a delete falls back to the binlog timestamp.
    """
    if binding.commit_time_column is None or event.after is None:
        return event.commit_ts_us, event.commit_ts_coarse
    value = _column(event.after, binding.commit_time_column, "commit time", event)
    try:
        return datetime_to_us(dt.datetime.fromisoformat(value)), False
    except (TypeError, ValueError):
        raise BindError(f"commit time column holds {value!r}, not a DATETIME") from None


def plan(binding: Binding, event: ChangeEvent, *, prefix: str) -> list[CacheAction]:
    """The actions for one change, in the order they must be applied."""
    version = event_version(binding, event)
    commit_us, _ = commit_time_us(binding, event)
    actions: list[CacheAction] = []
    if event.before is not None:
        old_key = _key(binding, event, event.before, prefix)
        if event.after is None or old_key != _key(binding, event, event.after, prefix):
            actions.append(CacheAction("invalidate", old_key, version, commit_us))
    if event.after is not None:
        key = _key(binding, event, event.after, prefix)
        if binding.on_change == "invalidate":
            actions.append(CacheAction("invalidate", key, version, commit_us))
        else:
            actions.append(CacheAction("write", key, version, commit_us, _value(binding, event, event.after)))
    return actions
