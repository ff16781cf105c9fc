"""The rows of a rows event, decoded straight from its bytes into their JSON form.

pymysqlreplication decodes a row column by column through a chain of generic calls (a branch per type
for every value, a method call per byte read, a ``datetime`` built and then formatted again by
:mod:`schemas.values`): on the connector's backlogs that was half of its CPU. :func:`row_decoder` makes,
once per table map, a decoder for the table's columns that reads each value from the event's bytes and
gives what ``binlog_row_converter(types)(values, none_sources)`` gives for pymysqlreplication's value:
the same images, the same None for values it could not read (a zero DATETIME). The reader of each column
type is in :mod:`connectors.binlog.readers`.

It covers the column types of most tables (integers, FLOAT and DOUBLE, CHAR/VARCHAR/TEXT/BLOB in any
character set, DECIMAL, ENUM, SET, BIT, YEAR, DATE, TIME, DATETIME and TIMESTAMP with fractions) in full
row images. A table with any other column type (MySQL's binary JSON, GEOMETRY), a partial image
(``binlog_row_image`` other than FULL), an event in a form it does not expect, or a value it cannot
decode exactly as pymysqlreplication does (a byte sequence its character set refuses: pymysqlreplication
raises) makes :func:`decode_rows` return None, and the caller reads the event with pymysqlreplication as
before: nothing is decoded differently, only faster.

One difference, on purpose: a DATE that is no calendar day (``2024-02-30``, which MySQL stores under
``ALLOW_INVALID_DATES``) is None, as a direct read maps it; pymysqlreplication raises there, and the
connector stopped at that event. ``tests/integration/test_binlog_rowdecode.py`` holds the two equal on
every covered type, row by row, against a real server's binlog, and shows that difference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.binlog.lean import LeanRows
from connectors.binlog.readers import Reader, Refused, column_reader
from schemas.values import ColumnType, JsonValue, binlog_value_converter

log = logging.getLogger(__name__)

Image = dict[str, JsonValue]
Decoded = list[dict[str, Any]]
"""Rows in pymysqlreplication's shape (``{"values": ...}`` or ``{"before_values": ..., "after_values":
...}``), every image already in JSON form: the event's ``row_converter`` is :func:`as_is`."""


def as_is(values: Mapping[str, object], none_sources: Mapping[str, str] | None) -> dict[str, JsonValue]:
    """The row converter of rows this module decoded: their images are in JSON form already."""
    return values  # type: ignore[return-value]


class RowDecoder:
    """Decodes the rows of one table map's events (made by :func:`row_decoder`)."""

    def __init__(self, names: Sequence[str], readers: Sequence[Reader], converters: Sequence[Any]) -> None:
        self._columns = tuple(zip(names, readers, converters, strict=True))
        self._count = len(self._columns)
        self._null_bytes = (self._count + 7) // 8
        self._full = bytes([0xFF] * (self._count // 8)) + (
            bytes([(1 << (self._count % 8)) - 1]) if self._count % 8 else b""
        )

    def _image(self, data: bytes, pos: int) -> tuple[Image, int]:
        nulls = int.from_bytes(data[pos : pos + self._null_bytes], "little")
        pos += self._null_bytes
        image: Image = {}
        bit = 1
        for name, read, convert in self._columns:
            if nulls & bit:
                image[name] = None
            else:
                value, pos = read(data, pos)
                image[name] = value if convert is None or value is None else convert(value)
            bit <<= 1
        return image, pos

    def decode(self, event: Any, update: bool) -> Decoded:
        """The rows of ``event`` (its bytes not read yet); raises :class:`Refused` for anything that is
        not exactly a full-image event of this table map's columns."""
        if not event.complete or event.number_of_columns != self._count:
            raise Refused("another column count")
        if event._ignore_decode_errors:
            raise Refused("lenient decoding asked for")
        bitmaps = [event.columns_present_bitmap]
        if update:
            bitmaps.append(event.columns_present_bitmap2)
        for present in bitmaps:
            if bytes(present) != self._full:
                raise Refused("a partial row image")
        wrapper = event.packet
        if getattr(wrapper, "_BinLogPacketWrapper__data_buffer", None) != b"":
            raise Refused("bytes pushed back into the packet")
        packet = wrapper.packet
        data, start = packet._data, packet._position
        end = start + (event.event_size - wrapper.read_bytes)
        if type(data) is not bytes or end > len(data):
            raise Refused("a packet in another form")
        return self._rows(data[:end], start, end, update)

    def rows_of(self, event: LeanRows) -> Decoded:
        """The rows of a :class:`~connectors.binlog.lean.LeanRows` (the same checks as :meth:`decode`)."""
        if event.number_of_columns != self._count:
            raise Refused("another column count")
        if event.present != self._full or event.present_after != self._full:
            raise Refused("a partial row image")
        return self._rows(event.data[: event.end], event.start, event.end, event.kind == "update")

    def _rows(self, data: bytes, start: int, end: int, update: bool) -> Decoded:
        rows: Decoded = []
        pos = start
        image = self._image
        if update:
            while pos < end:
                before, pos = image(data, pos)
                after, pos = image(data, pos)
                rows.append({"before_values": before, "after_values": after})
        else:
            while pos < end:
                values, pos = image(data, pos)
                rows.append({"values": values})
        if pos != end:
            raise Refused("rows end past the event")
        return rows


def row_decoder(columns: Sequence[Any], types: Mapping[str, ColumnType]) -> RowDecoder | None:
    """The decoder of a table map's rows (pymysqlreplication ``Column`` objects and their types, as
    :func:`schemas.values.binlog_column_types` names them); None when a column's type is not covered."""
    names: list[str] = []
    readers: list[Reader] = []
    converters: list[Any] = []
    for column in columns:
        name = column.name
        if not isinstance(name, str) or not name or name in names or name not in types:
            return None
        chosen = column_reader(column, types[name])
        if chosen is None:
            return None
        reader, as_json = chosen
        names.append(name)
        readers.append(reader)
        converters.append(None if as_json else binlog_value_converter(types[name]))
    if not names:
        return None
    return RowDecoder(names, readers, converters)


def decode_rows(decoder: RowDecoder | None, event: Any, update: bool) -> Decoded | None:
    """``event``'s rows decoded by ``decoder``; None (nothing read) where pymysqlreplication must.
    ``event`` is pymysqlreplication's or a :class:`~connectors.binlog.lean.LeanRows`."""
    if decoder is None:
        return None
    try:
        if type(event) is LeanRows:
            return decoder.rows_of(event)
        return decoder.decode(event, update)
    except Exception as exc:  # any doubt: pymysqlreplication reads the event, as before
        table = f"{getattr(event, 'schema', '?')}.{getattr(event, 'table', '?')}"
        log.debug("a rows event of %s is read by pymysqlreplication: %r", table, exc)
        return None
