"""Change events as Kafka messages, for the connector's hot path: the same bytes' meaning as
:mod:`schemas.codec`, at a fraction of its per-event cost.

- :func:`encode_change`: the JSON of :func:`schemas.codec.encode` (same fields, same order, ``oversize``
  only when true) written by orjson straight from the event's fields instead of by pydantic's serializer
  walking the images' ``Any`` values. A value orjson would write otherwise than pydantic, or not at all
  (integers beyond 64 bits, a ``Decimal``, a ``datetime``, a dataclass), makes it fall back to
  :func:`schemas.codec.encode` for that event: whatever the images hold, a consumer decodes the same
  event. The images a binlog or snapshot row becomes (:mod:`schemas.values`) are plain JSON values, so
  the fallback is for events built elsewhere.
- :class:`MessageKeys`: :func:`schemas.codec.message_key`, with each table's percent-encoded
  ``db/table/`` prefix made once and integer key values (never escaped) written as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import orjson

from schemas import ChangeEvent, encode
from schemas.events import KeyValue

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""Types orjson writes in its own way are passed to the fallback instead (pydantic writes them)."""


def encode_change(event: ChangeEvent) -> bytes:
    """The message value of a change: what :func:`schemas.codec.encode` gives, decoded the same."""
    fields = event.__dict__
    body = dict(fields)
    body["source"] = fields["source"].__dict__
    if not body["oversize"]:
        del body["oversize"]  # on the wire only when true (schemas.events)
    try:
        return orjson.dumps(body, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: a value only pydantic writes (or nobody)
        return encode(event)


class MessageKeys:
    """:func:`schemas.codec.message_key` per change, with each table's prefix made once."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, str], str] = {}

    def key(self, db: str, table: str, key: Mapping[str, KeyValue]) -> bytes:
        """``db/table/<row key>``, each part percent-encoded (``schemas.codec.message_key``)."""
        prefix = self._prefixes.get((db, table))
        if prefix is None:
            prefix = self._prefixes[(db, table)] = f"{quote(db, safe='')}/{quote(table, safe='')}/"
        # str(int) is digits and "-", which quote leaves as they are.
        if len(key) == 1:  # the usual one-column key: no generator, no join
            (value,) = key.values()
            return (prefix + (str(value) if type(value) is int else quote(str(value), safe=""))).encode()
        row = "/".join(str(v) if type(v) is int else quote(str(v), safe="") for v in key.values())
        return (prefix + row).encode()
