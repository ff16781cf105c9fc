"""Sending what the binlog brings: each item encoded as a Kafka message, or its smaller stand-in.

What :class:`Sender` guarantees to the session:

- every message it produces is numbered by the session's :class:`CheckpointTracker` and acknowledges
  that number only once Kafka acknowledged it, so the checkpoint never passes it (invariant 4);
- a change keeps its key (namespace + primary key), so one row's events stay on one partition, in
  binlog order (invariant 5);
- no item can stop the connector by its size: over the message limit, now or at the broker, a change is
  sent as an invalidation (``oversize=True``, no images: the worker drops the row's entries and the
  application reads it through), a DDL statement cut, a dead letter without its original, a model update
  as a dead letter; the stand-in acknowledges the original's number;
- a row of the model registry table becomes a model update on its topic, or a dead letter saying why
  not (:mod:`connectors.registry`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from pydantic import ValidationError

from connectors.checkpoint import CheckpointTracker
from connectors.encoding import MessageKeys, encode_change
from connectors.exceptions import ConfigurationError
from connectors.kafka.limit import MessageLimit
from connectors.kafka.producer import OnDelivered, OnTooLarge
from connectors.kafka.settings import KafkaSettings
from connectors.metrics import ConnectorMetrics, ConnectorStats
from connectors.registry import RegistryRowError, update_from_row
from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, decode, encode
from schemas.codec import DecodeError, dead_letter

log = logging.getLogger(__name__)

ACK_LATENCY_SAMPLE = 16
"""One event in this many records its acknowledgement latency (``freshkey.connector.ack.latency``): an
OpenTelemetry record costs about as much as producing the event, and a uniform sample keeps the
distribution (its quantiles) while the count is a sixteenth of the events."""

DDL_QUERY_CHARS = 16_000
"""A DDL statement too large for a message is sent cut to this many characters (the worker re-reads
the table's columns from the database; the statement is only a record)."""


class MessageProducer(Protocol):
    """What the sender needs of a producer (:class:`~connectors.kafka.producer.ChangeProducer`)."""

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivered: OnDelivered,
        *,
        on_too_large: OnTooLarge | None = None,
        partition: int | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ModelUpdateMessage:
    """A model update read from the registry table, encoded for the model-update topic."""

    key: bytes
    value: bytes


Item = ChangeEvent | DdlEvent | FenceEvent | DeadLetter | ModelUpdateMessage
"""What a session sends."""


class Sender:
    """Produces a session's items through ``producer``, numbered by ``tracker`` (see the module)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        limit: MessageLimit,
        tracker: CheckpointTracker,
        producer: MessageProducer,
        *,
        stats: ConnectorStats,
        metrics: ConnectorMetrics,
    ) -> None:
        self.kafka = kafka
        self.limit = limit
        self.tracker = tracker
        self.producer = producer
        self.stats = stats
        self.metrics = metrics
        self.keys = MessageKeys()
        self._acknowledge = tracker.acknowledged  # bound once: every event's report holds it
        self._refused_bound = self._refused

    def message(self, item: Item) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of an item."""
        if isinstance(item, ChangeEvent):  # by far the most frequent: first
            source = item.source
            return (
                self.kafka.change_topic,
                self.keys.key(source.db, source.table, item.key),
                encode_change(item),
            )
        if isinstance(item, ModelUpdateMessage):
            return self.kafka.model_update_topic, item.key, item.value
        if isinstance(item, DeadLetter):
            return self.kafka.dead_letter_topic, b"connector", encode(item)
        if isinstance(item, FenceEvent):
            key = f"fence/{item.source.db}/{item.source.table}".encode()
            return self.kafka.change_topic, key, encode(item)
        return self.kafka.change_topic, f"ddl/{item.source.db}".encode(), encode(item)

    def send(self, item: Item, seq: int | None = None, *, partition: int | None = None) -> None:
        """Produce ``item``, or its smaller stand-in when it is over the limit (now or at the broker).

        ``seq``: the event number a stand-in acknowledges (the original's); the checkpoint waits for it.
        A :class:`FenceEvent` goes to every partition of the change topic (see its docstring), each copy
        numbered on its own; anything else to the partition of its key (``partition``: this one).
        """
        if partition is None and isinstance(item, FenceEvent):
            for each in range(self.kafka.partitions):
                self.send(item, partition=each)
            return
        topic, key, value = self.message(item)
        if not self.limit.fits(key, value):
            smaller = self.stand_in(item, len(key) + len(value))
            if smaller is not None:
                self.send(smaller, seq)
                return
        if seq is None:
            seq = self.tracker.produced()
        delivered: Callable[[], None]
        if seq % ACK_LATENCY_SAMPLE:
            delivered = partial(self._acknowledge, seq)
        else:
            delivered = partial(self._acknowledge_timed, seq, time.monotonic())
        # Only small objects wait for the delivery report, never the item: a refused message's stand-in
        # is made from its own bytes (_refused).
        refused = partial(self._refused_bound, topic, seq)
        self.producer.produce(topic, key, value, delivered, on_too_large=refused, partition=partition)

    def _acknowledge_timed(self, seq: int, sent: float) -> None:
        self.tracker.acknowledged(seq)
        self.metrics.ack_latency.record((time.monotonic() - sent) * 1000)

    def _refused(self, topic: str, seq: int, key: bytes, value: bytes) -> None:
        """Kafka refused the message of event ``seq`` as too large (librdkafka at once, or the broker):
        send its stand-in, which acknowledges ``seq``. The item is read back from the message's value
        (what :meth:`message` wrote, decoded the worker's way): a change's key is ints and strings, so
        its stand-in has the same message key, and goes to the same partition."""
        size = len(key) + len(value)
        try:
            smaller = self.stand_in(self._item_of(topic, key, value), size)
        except (DecodeError, ValidationError) as exc:  # what message() wrote always reads back
            raise ConfigurationError(
                f"a {size}-byte message for {topic!r} is too large for Kafka, and reading it back for its "
                f"stand-in failed ({exc}); raise the broker's max.message.bytes"
            ) from exc
        if smaller is None:
            raise ConfigurationError(
                f"a {size}-byte message for {topic!r} is too large for Kafka and cannot be made smaller; "
                "raise the broker's max.message.bytes"
            )
        self.send(smaller, seq)

    def _item_of(self, topic: str, key: bytes, value: bytes) -> Item:
        """The item a message of this sender was made from (:meth:`message`), as far as
        :meth:`stand_in` needs it."""
        if topic == self.kafka.change_topic:
            return decode(value)
        if topic == self.kafka.dead_letter_topic:
            return DeadLetter.model_validate_json(value)
        return ModelUpdateMessage(key, value)

    def registry_row(self, event: ChangeEvent) -> None:
        """A change of the model registry table: a model update, or a dead letter saying why not."""
        try:
            update = update_from_row(event)
        except RegistryRowError as exc:
            self.stats.dead_letters += 1
            log.warning("model registry row %s: %s", event.key, exc)
            self.send(self.dead_letter(str(exc), encode(event), stage="model-registry"))
            return
        if update is None:
            return
        self.send(ModelUpdateMessage(update.model.encode(), update.model_dump_json().encode()))
        log.info(
            "model update from the registry: %s %s for %s",
            update.model,
            update.model_version,
            update.namespaces,
        )

    def dead_letter(self, reason: str, original: bytes, *, stage: str) -> DeadLetter:
        """A dead letter whose copy of the original is bounded by the Kafka settings."""
        return dead_letter(
            reason, original, stage=stage, max_original_bytes=self.kafka.dead_letter_max_original_bytes
        )

    def stand_in(self, item: Item, size: int) -> Item | None:
        """The stand-in for an item of ``size`` bytes over the limit, or None when it has none."""
        limit = self.limit.max_bytes
        if isinstance(item, ChangeEvent):
            if item.oversize:
                return None
            self.stats.oversize += 1
            self.metrics.oversize.add(1)
            log.warning(
                "row %s.%s key %s: its change is %d bytes, over the %d-byte message limit "
                "(FRESHKEY_KAFKA_MAX_MESSAGE_BYTES): sent as an invalidation, the application reads it "
                "through",
                item.source.db,
                item.source.table,
                item.key,
                size,
                limit,
            )
            return ChangeEvent.model_validate(
                {**item.model_dump(), "before": None, "after": None, "oversize": True}
            )
        if isinstance(item, DdlEvent):
            if len(item.query) <= DDL_QUERY_CHARS:
                return None
            log.warning("DDL in %s is %d bytes, over the message limit: sent cut", item.source.db, size)
            cut = f"{item.query[:DDL_QUERY_CHARS]} /* freshkey: cut, {len(item.query)} chars in all */"
            return item.model_copy(update={"query": cut})
        if isinstance(item, ModelUpdateMessage):
            self.stats.dead_letters += 1
            log.warning(
                "model update from the registry is %d bytes, over the message limit: dead letter", size
            )
            return self.dead_letter(
                f"model update of {size} bytes is over the {limit}-byte message limit",
                item.value,
                stage="model-registry",
            )
        if isinstance(item, FenceEvent):
            return None  # bounded: a few hundred bytes
        if item.original_b64:
            return item.model_copy(update={"original_b64": "", "truncated": True})
        return None
