"""Whether the topics that events wait for still exist, asked of the broker rather than left to
librdkafka: what :class:`~connectors.kafka.producer.ChangeProducer`'s delivery thread does once events
have waited :data:`TOPIC_GONE_AFTER_S` without any acknowledgement, and every
:data:`TOPIC_WATCH_EVERY_S` while none waits.

A connector once kept an event for more than 25 s after the broker came back empty (the session would
have ended only at the delivery timeout, every change since stale with nothing fenced); librdkafka did
not fail it within its ``topic.metadata.propagation.max.ms``, and that was not reproduced since. With this
check the session ends once the broker says a topic is gone, whatever librdkafka made of it: the next
session recreates the change topic and fences.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)

TOPIC_GONE_AFTER_S = 5.0
"""How long librdkafka goes on waiting for a topic the broker no longer has before it fails the events
waiting for it (``topic.metadata.propagation.max.ms``, 30 s by default), and how long events wait without
an acknowledgement before :class:`TopicCheck` asks. Only a broker that lost its data or a deleted topic
gets there (the connector creates its topics before it produces). Measured against Tansu restarted empty:
the waiting event failed 31.5 s after the broker came back with librdkafka's default."""
TOPIC_CHECK_EVERY_S = 2.0
"""How often the broker is asked while events wait, counted from the end of the last check, so that a
broker slow to answer leaves the delivery thread time to serve reports and client errors."""
TOPIC_WATCH_EVERY_S = 5.0
"""How often the broker is asked while no event waits: a broker that came back without its data while
the connector had nothing to send ends the session within about this long (the next recreates the change
topic and fences), instead of at the next change of a bound table, which may be hours away while the
events the broker lost stay unapplied and their rows stale. One metadata request per topic."""
TOPIC_CHECK_TIMEOUT_S = 1.0
"""Longest one metadata request of a check waits; no answer leaves it to the next check (and an
unreachable broker to the producer's own bound)."""
TOPIC_GONE_CODES = frozenset(
    {KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART}
)
"""What librdkafka or the broker say of a topic that does not exist (a delivery's error or metadata's)."""


class TopicCheck:
    """The topics a producer sent to, and when the broker was last asked about them.

    :meth:`sent` on the producing thread, :meth:`due` and :meth:`gone` on the delivery thread."""

    def __init__(self) -> None:
        self._topics: set[str] = set()
        self._checked_at = 0.0

    def sent(self, topic: str) -> None:
        if topic not in self._topics:  # a lookup per message; the set changes a few times a session
            self._topics.add(topic)

    def due(self, now: float, waiting_since: float) -> bool:
        """True when events waited :data:`TOPIC_GONE_AFTER_S` unacknowledged and the last check ended
        :data:`TOPIC_CHECK_EVERY_S` ago."""
        return now - waiting_since >= TOPIC_GONE_AFTER_S and now - self._checked_at >= TOPIC_CHECK_EVERY_S

    def idle_due(self, now: float) -> bool:
        """True when no event waits and the last check ended :data:`TOPIC_WATCH_EVERY_S` ago."""
        return now - self._checked_at >= TOPIC_WATCH_EVERY_S

    def gone(self, client: Producer) -> tuple[str, str] | None:
        """The first topic sent to that the broker says it does not have, and its answer; None when it
        has them all or did not answer. The producer's ``allow.auto.create.topics`` is off: asking
        creates nothing."""
        try:
            for topic in sorted(self._topics):
                try:
                    found = client.list_topics(topic=topic, timeout=TOPIC_CHECK_TIMEOUT_S).topics.get(topic)
                except KafkaException as exc:
                    log.debug("metadata of %r while events wait: %r", topic, exc)
                    return None
                if found is None:
                    return topic, "not in the broker's metadata"
                if found.error is not None and found.error.code() in TOPIC_GONE_CODES:
                    return topic, found.error.str()
            return None
        finally:
            self._checked_at = time.monotonic()
