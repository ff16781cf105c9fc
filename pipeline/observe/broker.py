"""A topic's high watermarks and a consumer group's committed offsets, read straight from the broker."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class BrokerFigures(NamedTuple):
    """One reading of :class:`BrokerOffsets`: partition -> high watermark, and -> committed offset."""

    highs: dict[int, int]
    committed: dict[int, int | None]
    """The group's committed offset (the next one to consume); None: the group committed none there."""


class BrokerOffsets:
    """A topic's high watermarks and a consumer group's committed offsets, read straight from the broker.

    What :class:`~pipeline.observe.progress.ConsumerProgress` needs to tell "caught up" from "unknown" for
    partitions the worker has received nothing on (a quiet partition after a restart, an agent that died
    before its first message) and for the partitions it does not hold (before it joined its group). A
    librdkafka client that never subscribes: it does not join the group and commits nothing, it only asks (one
    ListOffsets per partition and one OffsetFetch: about 1 ms here for 3 partitions).

    Blocking: call :meth:`read` in a thread. It raises ``confluent_kafka.KafkaException`` when the broker
    does not answer within ``timeout_s`` or the topic does not exist. Some brokers answer ListOffsets
    with less than the log end (Tansu, measured here: the last record batch's base offset + 1); the
    progress keeps the highest figure from any source, and the consumer's own (fetch) high watermarks
    are exact there.

    ``config``: more librdkafka settings, the security ones in particular
    (``connectors.kafka.security.librdkafka_config``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        group_id: str,
        topic: str,
        timeout_s: float = 5.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self._config = dict(config or {})
        self.group_id = group_id
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._lock = threading.Lock()

    def read(self) -> BrokerFigures:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        with self._lock:
            if self._consumer is None:
                from confluent_kafka import Consumer

                self._consumer = Consumer(
                    {
                        **self._config,
                        "bootstrap.servers": self.bootstrap,
                        "group.id": self.group_id,
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                        "logger": log,
                    }
                )
            consumer = self._consumer
            metadata = consumer.list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
            if metadata is None or metadata.error is not None:
                error = metadata.error if metadata is not None else None
                raise KafkaException(error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
            partitions = sorted(metadata.partitions)
            highs = {
                p: int(consumer.get_watermark_offsets(TopicPartition(self.topic, p), self.timeout_s)[1])
                for p in partitions
            }
            committed = consumer.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=self.timeout_s
            )
        return BrokerFigures(highs, {tp.partition: tp.offset if tp.offset >= 0 else None for tp in committed})

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
