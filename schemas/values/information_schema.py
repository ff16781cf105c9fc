"""Column types of direct reads (``information_schema``), and JSON forms back to query parameters."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import Any

from schemas.values.columns import _KIND_OF, ColumnType

_QUOTED = re.compile(r"'((?:[^']|'')*)'")
_PARENS = re.compile(r"\(([^)]*)\)")
_JSON_CHECK = re.compile(r"^\s*json_valid\s*\(\s*`?(?P<name>(?:[^`]|``)+?)`?\s*\)\s*$", re.IGNORECASE)


def json_checked_columns(check_clauses: Iterable[str]) -> set[str]:
    """The columns that a ``JSON_VALID(col)`` check makes JSON (MariaDB's JSON type), from the
    ``CHECK_CLAUSE`` values of ``information_schema.CHECK_CONSTRAINTS`` for one table."""
    found: set[str] = set()
    for clause in check_clauses:
        match = _JSON_CHECK.match(clause or "")
        if match is not None:
            found.add(match.group("name").replace("``", "`"))
    return found


def column_type_from_information_schema(row: Mapping[str, Any], *, json_checked: bool = False) -> ColumnType:
    """The :class:`ColumnType` of one ``information_schema.COLUMNS`` row (``DATA_TYPE``,
    ``COLUMN_TYPE``, ``NUMERIC_SCALE``, ``DATETIME_PRECISION``; keys in any case). ``json_checked``:
    the column has a ``JSON_VALID`` check (:func:`json_checked_columns`)."""
    get = {str(k).upper(): v for k, v in row.items()}.get
    data_type = str(get("DATA_TYPE") or "").lower()
    column_type = str(get("COLUMN_TYPE") or data_type)
    if json_checked and _KIND_OF.get(data_type) == "text":
        data_type = "json"
    kind = _KIND_OF.get(data_type, "unknown")
    length: int | None = None
    scale: int | None = None
    members: tuple[str, ...] = ()
    if kind in ("enum", "set"):
        members = tuple(m.replace("''", "'") for m in _QUOTED.findall(column_type))
    elif data_type in ("binary", "bit"):
        size = _PARENS.search(column_type)
        length = int(size.group(1)) if size and size.group(1).strip().isdigit() else 1
    elif kind == "decimal":
        scale = _int_or_none(get("NUMERIC_SCALE"))
    elif kind in ("time", "datetime", "timestamp"):
        scale = _int_or_none(get("DATETIME_PRECISION"))
    return ColumnType(
        data_type,
        unsigned="unsigned" in column_type.lower(),
        length=length,
        scale=scale,
        members=members,
    )


def _int_or_none(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def json_to_sql(value: object, column: ColumnType | None) -> object:
    """A value in its JSON form as a query parameter for its column (the reverse of the mapping, for
    key lookups): base64 back to bytes for binary columns; anything else as it is. Raises
    :class:`ValueError` for a value no row of that column can hold (invalid base64)."""
    if column is None or value is None:
        return value
    if column.kind in ("binary", "geometry"):
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            raise ValueError(f"{value!r:.60} is not the base64 form of a {column.data_type} value") from None
    return value
