"""What the value mapping knows of a column: :class:`ColumnType`, and the kinds its type names map to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JsonValue = None | bool | int | float | str | list[Any] | dict[str, Any]

# -- column types ------------------------------------------------------------------------------------------

_KINDS: dict[str, tuple[str, ...]] = {
    "integer": ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean"),
    "decimal": ("decimal", "numeric", "dec", "fixed"),
    "float": ("float",),
    "double": ("double", "double precision", "real"),
    "bit": ("bit",),
    "date": ("date",),
    "datetime": ("datetime",),
    "timestamp": ("timestamp",),
    "time": ("time",),
    "year": ("year",),
    "text": ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "long varchar"),
    "binary": ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "long varbinary"),
    "enum": ("enum",),
    "set": ("set",),
    "json": ("json",),
    "geometry": (
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    ),
    "uuid": ("uuid",),
    "inet4": ("inet4",),
    "inet6": ("inet6",),
    # The binlog without character-set metadata cannot tell a text column from a binary one: the value's
    # Python type decides (str: text, bytes: base64).
    "string": ("string",),
}
_KIND_OF = {name: kind for kind, names in _KINDS.items() for name in names}
_INTEGER_BITS = {"tinyint": 8, "bool": 8, "boolean": 8, "smallint": 16, "mediumint": 24, "int": 32}


@dataclass(frozen=True, slots=True)
class ColumnType:
    """What the value mapping needs to know about a column: its type as MySQL names it.

    ``data_type`` is the lower-case name ``information_schema.COLUMNS.DATA_TYPE`` uses (``int``,
    ``varbinary``, ``datetime``...), ``json`` for a MariaDB LONGTEXT with a ``JSON_VALID`` check;
    ``length`` the bytes of a BINARY(n) or the bits of a BIT(n); ``scale`` the decimals of a DECIMAL or
    the fractional-second digits of a temporal type; ``members`` the values of an ENUM or SET, in their
    defined order. An unknown ``data_type`` maps values by their Python type.
    """

    data_type: str
    unsigned: bool = False
    length: int | None = None
    scale: int | None = None
    members: tuple[str, ...] = ()
    kind: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_type", self.data_type.lower())
        object.__setattr__(self, "kind", _KIND_OF.get(self.data_type, "unknown"))

    @property
    def integer_bits(self) -> int:
        """Width of an integer column (64 for BIGINT)."""
        return _INTEGER_BITS.get(self.data_type, 64)
