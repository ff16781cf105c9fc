"""From a change event and its binding to the cache actions that make every tier agree with the row.

Pure: no I/O. The processor (``pipeline.processor``) decodes, calls :func:`plan`, applies the actions
to the tiers and records the outcomes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from cache_writer import CacheAction
from cache_writer.layout import namespace_prefix
from schemas import Binding, Change, VersionError, column_version, encode_value, row_key
from schemas.errors import InvalidInput
from schemas.versions import MAX_VERSION, datetime_to_us


class BindError(InvalidInput):
    """The event does not fit its binding (a named column is missing, a version is unusable)."""


def _column(image: Mapping[str, Any], column: str, what: str, event: Change) -> Any:
    try:
        return image[column]
    except KeyError:
        raise BindError(
            f"{what} column {column!r} of the binding is not in {event.source.db}.{event.source.table}"
        ) from None


def _key_values(binding: Binding, event: Change, image: Mapping[str, Any]) -> list[int | str]:
    columns = binding.key_columns or tuple(event.key)
    values: list[int | str] = []
    for column in columns:
        value = image[column] if column in image else _column(image, column, "key", event)
        kind = type(value)
        if (
            kind is not int
            and kind is not str
            and (  # the common types, without the isinstance calls
                value is None or not isinstance(value, int | str) or isinstance(value, bool)
            )
        ):
            raise BindError(f"key column {column!r} holds {value!r}; a key must be an integer or a string")
        values.append(value)
    return values


def _row_of(values: list[int | str]) -> str:
    """``schemas.row_key(values)``; a single integer (the usual primary key) without the general path."""
    if len(values) == 1 and type(values[0]) is int:
        return str(values[0])
    return row_key(values)


def image_row_key(binding: Binding, event: Change, image: Mapping[str, Any]) -> str:
    """The row key (``schemas.row_key`` of the key columns) of one image of the event."""
    return row_key(_key_values(binding, event, image))


def value_columns_of(binding: Binding, image: Mapping[str, Any]) -> tuple[str, ...]:
    """The columns a value of this image holds: the binding's projection, or every column of the row."""
    return binding.value_columns if binding.value_columns is not None else tuple(sorted(image))


def _value(binding: Binding, event: Change, image: Mapping[str, Any]) -> bytes:
    columns = binding.value_columns
    if columns is None:
        projected = image
    else:
        try:
            projected = {c: image[c] for c in columns}
        except KeyError:  # the first missing column in order, as _column names it
            projected = {c: _column(image, c, "value", event) for c in columns}
    try:
        return encode_value(projected)
    except TypeError as exc:  # e.g. an integer beyond 64 bits
        raise BindError(f"value of {event.source.db}.{event.source.table} cannot be cached: {exc}") from None


def event_version(binding: Binding, event: Change) -> int:
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


def commit_time_us(binding: Binding, event: Change) -> tuple[int, bool]:
    """Commit time in µs and whether it is coarse (the binlog's one-second timestamp).

    The binding's commit time column is read from the after image; a delete has none (its before image
    holds the time of the previous change), so a delete falls back to the binlog timestamp.
    """
    if binding.commit_time_column is None or event.after is None:
        return event.commit_ts_us, commit_time_coarse(binding, event)
    value = _column(event.after, binding.commit_time_column, "commit time", event)
    try:
        return datetime_to_us(dt.datetime.fromisoformat(value)), False
    except (TypeError, ValueError):
        raise BindError(f"commit time column holds {value!r}, not a DATETIME") from None


def commit_time_coarse(binding: Binding, event: Change) -> bool:
    """Whether :func:`commit_time_us` of this change is coarse, without reading the commit time again."""
    return (binding.commit_time_column is None or event.after is None) and event.commit_ts_coarse


KeyOf = Callable[[Mapping[str, Any]], str | None]
"""The cache key of an image (before or after) of the event; None: the image has no key (it cannot be
keyed, so no entry of it can exist). May raise :class:`BindError`."""
SignatureOf = Callable[[Mapping[str, Any]], str | None]
"""The schema signature an entry built from this (after) image carries; None: no signature."""


def plan(
    binding: Binding,
    event: Change,
    *,
    prefix: str,
    key_of: KeyOf | None = None,
    signature_of: SignatureOf | None = None,
) -> list[CacheAction]:
    """The actions for one change, in the order they must be applied.

    By default an image's key is its row key and writes carry no signature (a namespace without a
    model). ``key_of`` gives semantic keys; a semantic write also records its row key (field ``k``).
    An UPDATE whose two images have different keys invalidates the old one and writes the new one.
    """
    version = event_version(binding, event)
    commit_us, _ = commit_time_us(binding, event)

    key: KeyOf
    if key_of is None:
        entries = namespace_prefix(prefix, binding.namespace)  # what entry_key puts before the row key

        def row_entry_key(image: Mapping[str, Any]) -> str:
            return entries + _row_of(_key_values(binding, event, image))

        key = row_entry_key
    else:
        key = key_of

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
                    row=image_row_key(binding, event, event.after) if binding.semantic else None,
                )
            )
    return actions


def row_value(binding: Binding, row: Mapping[str, Any]) -> bytes:
    """The cached value of a row read from the database (a prewarm): the bytes a change of it writes."""
    if binding.value_columns is not None:
        missing = [c for c in binding.value_columns if c not in row]
        if missing:
            raise BindError(f"value column(s) {', '.join(missing)} of the binding are not in {binding.table}")
    projected = row if binding.value_columns is None else {c: row[c] for c in binding.value_columns}
    try:
        return encode_value(projected)
    except TypeError as exc:
        raise BindError(f"value of {binding.table} cannot be cached: {exc}") from None


def row_version(binding: Binding, row: Mapping[str, Any]) -> int | None:
    """The version of a row read from the database: its version column's (None without one)."""
    if binding.version_column is None:
        return None
    if binding.version_column not in row:
        raise BindError(f"version column {binding.version_column!r} is not in {binding.table}")
    try:
        return column_version(row[binding.version_column])
    except VersionError as exc:
        raise BindError(str(exc)) from None


def row_commit_time_us(binding: Binding, row: Mapping[str, Any]) -> int | None:
    """The commit time of a row read from the database: its commit time column's (None without one)."""
    if binding.commit_time_column is None or row.get(binding.commit_time_column) is None:
        return None
    try:
        return datetime_to_us(dt.datetime.fromisoformat(row[binding.commit_time_column]))
    except (TypeError, ValueError):
        return None
