"""What the worker tells the Debezium decoder, and what the decoder answers besides an event.

:class:`DebeziumOptions` (``FRESHKEY_WORKER_INPUT``, ``FRESHKEY_DEBEZIUM_*``) with :class:`DebeziumTopics`
(``FRESHKEY_KAFKA_DEBEZIUM_TOPICS``); :data:`ColumnTypes`, the lookup of a table's MySQL column types;
:class:`Skip`, a message with no row change (counted, never dead-lettered); :class:`DebeziumError`, a
message that is no valid event (a dead letter with the reason).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.codec import DecodeError
from schemas.values import ColumnType

ColumnTypes = Callable[[str, str], Mapping[str, ColumnType] | None]
"""``(database, table) -> column name -> type`` (e.g. ``connectors.database.column_types``, cached), or
None when the table's types are not known."""

HEARTBEAT_PREFIX = "__debezium-heartbeat"
"""Debezium's default heartbeat topic prefix (``heartbeat.topics.prefix``)."""


class DebeziumError(DecodeError):
    """A Debezium message that cannot become a freshkey event; ``reason`` says why and what to change."""


@dataclass(frozen=True, slots=True)
class Skip:
    """A message that carries no row change for the cache, with the reason (counted, never dead-lettered)."""

    reason: str


class DebeziumTopics(BaseModel):
    """Which topics hold Debezium change events: names, or one regular expression (``regex:<pattern>``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: tuple[str, ...] = ()
    pattern: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> DebeziumTopics:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(
                    f"the topic pattern {self.pattern!r} is not a regular expression: {exc}"
                ) from None
        return self

    @classmethod
    def parse(cls, text: str | list[str] | tuple[str, ...]) -> DebeziumTopics:
        """``FRESHKEY_KAFKA_DEBEZIUM_TOPICS``: ``regex:<pattern>``, a JSON list, or comma-separated names."""
        if isinstance(text, list | tuple):
            return cls(names=tuple(str(t).strip() for t in text if str(t).strip()))
        text = text.strip()
        if text.startswith("regex:"):
            return cls(pattern=text.removeprefix("regex:"))
        if text.startswith("["):
            try:
                names = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"the topic list {text!r} is not a JSON list: {exc}") from None
            return cls.parse(list(names))
        return cls(names=tuple(t.strip() for t in text.split(",") if t.strip()))

    def matches(self, topic: str) -> bool:
        if topic in self.names:
            return True
        return self.pattern is not None and re.fullmatch(self.pattern, topic) is not None


class DebeziumOptions(BaseModel):
    """How the worker reads its input (the settings behind ``FRESHKEY_WORKER_INPUT`` and
    ``FRESHKEY_DEBEZIUM_*``). The ``*_handling_mode`` fields repeat the Debezium connector's own settings
    of the same name: they are used only to decode messages that carry no schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Literal["freshkey", "debezium"] = "freshkey"
    topics: DebeziumTopics = DebeziumTopics()
    version_source: Literal["binlog", "gtid"] = Field(
        "binlog",
        description="binlog: file/pos/row (mixes safely with freshkey's own); gtid: see "
        "schemas.debezium.envelope.",
    )
    gtid_debezium_only: bool = Field(
        False,
        description="Acknowledge that namespaces with GTID versions are fed by Debezium alone (never by "
        "freshkey's connector with GTID versions, or fenced when switching).",
    )
    schemaless: Literal["types", "as-is"] = Field(
        "types",
        description="Messages without a schema: types = decode with the table's column types (the worker "
        "reads them from the database), else refuse; as-is = cache the values as Debezium wrote them.",
    )
    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    time_precision_mode: Literal["adaptive_time_microseconds", "adaptive", "connect", "isostring"] = (
        "adaptive_time_microseconds"
    )
    bigint_unsigned_handling_mode: Literal["long", "precise"] = "long"

    @model_validator(mode="after")
    def _gtid_is_acknowledged(self) -> DebeziumOptions:
        if self.input == "debezium" and self.version_source == "gtid" and not self.gtid_debezium_only:
            raise ValueError(
                "FRESHKEY_DEBEZIUM_VERSION_SOURCE=gtid: Debezium numbers the changes inside a transaction "
                "(transaction.total_order counts the change records of every captured table) differently "
                "from freshkey's connector (rows of bound tables), so a namespace that ever held GTID "
                "versions from freshkey's connector could keep an older change of a row changed twice in "
                "one transaction. Use FRESHKEY_DEBEZIUM_VERSION_SOURCE=binlog (safe to mix with freshkey's "
                "own events), or a version_column in the binding; or set "
                "FRESHKEY_DEBEZIUM_GTID_DEBEZIUM_ONLY=true if these namespaces are fed by Debezium alone "
                "(fence them when switching)"
            )
        if self.input == "debezium" and not self.topics.names and self.topics.pattern is None:
            raise ValueError(
                "FRESHKEY_WORKER_INPUT=debezium needs FRESHKEY_KAFKA_DEBEZIUM_TOPICS: the Debezium topics "
                "(comma-separated names, a JSON list, or regex:<pattern>, e.g. "
                "regex:dbserver1\\.inventory\\..*)"
            )
        return self
