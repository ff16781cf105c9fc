"""Debezium MySQL change events (Kafka Connect JSON converter) as freshkey events. Pure: no I/O.

Users who already run Debezium's MySQL connector point freshkey's worker at its topics instead of running
freshkey's connector (``FRESHKEY_WORKER_INPUT=debezium``). :func:`decode_any` is the one call the worker
makes per message: a freshkey change topic message is decoded as always; a Debezium message becomes a
:class:`~schemas.events.ChangeEvent` (or a :class:`~schemas.events.DdlEvent` for a schema change or a
truncate), or a :class:`Skip` with the reason (tombstones, heartbeats, transaction markers), or raises
:class:`DebeziumError` (a :class:`~schemas.codec.DecodeError`: a dead letter with the reason).

The package, along its seams:

- :mod:`schemas.debezium.options`: what the worker tells the decoder (:class:`DebeziumOptions`,
  :class:`DebeziumTopics`, the column-type lookup) and what it answers besides an event (:class:`Skip`,
  :class:`DebeziumError`);
- :mod:`schemas.debezium.envelope`: the message (wrapper, envelope, key, source block) as a freshkey
  event, with its version;
- :mod:`schemas.debezium.columns`: each column value, from Debezium's encoding to freshkey's JSON form.
"""

from schemas.debezium.envelope import decode_any, decode_debezium
from schemas.debezium.options import (
    HEARTBEAT_PREFIX,
    ColumnTypes,
    DebeziumError,
    DebeziumOptions,
    DebeziumTopics,
    Skip,
)

__all__ = [
    "HEARTBEAT_PREFIX",
    "ColumnTypes",
    "DebeziumError",
    "DebeziumOptions",
    "DebeziumTopics",
    "Skip",
    "decode_any",
    "decode_debezium",
]
