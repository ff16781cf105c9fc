"""Whether the topics that events wait for still exist, asked of the broker rather than left to
librdkafka: what :class:`~connectors.kafka.producer.ChangeProducer`'s delivery thread does once events
have waited :data:`TOPIC_GONE_AFTER_S` without any acknowledgement; and whether the change topic is
still the one a session began with (:class:`TopicWatch`, every :data:`TOPIC_WATCH_EVERY_S`).

A connector once kept an event for more than 25 s after the broker came back empty (the session would
have ended only at the delivery timeout, every change since stale with nothing fenced); librdkafka did
not fail it within its ``topic.metadata.propagation.max.ms``, and that was not reproduced since. With this
check the session ends once the broker says a topic is gone, whatever librdkafka made of it: the next
session recreates the change topic and fences.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from connectors.kafka.topics import NO_TOPIC_ID, describe_ids

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
"""How often :class:`TopicWatch` asks the broker whether the change topic is still the one the session
began with, events waiting or not. A broker that came back without its data while the connector had
nothing to send went unnoticed until the next change of a bound table, which may be hours away, the events
the broker lost unapplied and their rows stale; a topic someone else created again meanwhile (a worker
starting then) until an event landed below an offset acknowledged before, on the partition that lost
it. One request (DescribeTopics, 0.3 ms on Tansu here) per look."""
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


class TopicWatch:
    """The topics a session vouches for by identity (topic -> its id when the session began): whether
    each is still there and still the same topic (a topic lost with a broker's data, or deleted, and
    created again gets another id). :meth:`due` and :meth:`changed` on the delivery thread.

    The first look comes :data:`TOPIC_WATCH_EVERY_S` after the session began (which had just read the
    ids), and the admin client is made for it then (``admin``, a factory): a session's start costs
    nothing more."""

    def __init__(self, admin: Callable[[], AdminClient], ids: Mapping[str, str]) -> None:
        self._make_admin = admin
        self._admin: AdminClient | None = None
        self._ids = dict(ids)
        self._checked_at = time.monotonic()

    def due(self, now: float) -> bool:
        return bool(self._ids) and now - self._checked_at >= TOPIC_WATCH_EVERY_S

    def changed(self) -> tuple[str, str, bool] | None:
        """(topic, what the broker says of it, whether it is there again as another topic) for the first
        watched topic that is gone or another; None when all are as they were or the broker did not
        answer (an unreachable broker is the producer's own bound)."""
        try:
            if self._admin is None:
                self._admin = self._make_admin()
            now_ids = describe_ids(self._admin, self._ids, TOPIC_CHECK_TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:
            log.debug("describing the watched topics: %r", exc)
            return None
        finally:
            self._checked_at = time.monotonic()
        for topic, began in sorted(self._ids.items()):
            now_id = now_ids.get(topic, began)
            if now_id is None:
                return topic, "not on the broker any more", False
            if began != NO_TOPIC_ID and now_id != NO_TOPIC_ID and now_id != began:
                return (
                    topic,
                    f"created again: its topic id is {now_id}, was {began} when the session began",
                    True,
                )
        return None


def gone_reason(bootstrap: str, topic: str, detail: str) -> str:
    """Why a session ends when the broker no longer has ``topic``."""
    return (
        f"Kafka at {bootstrap} no longer has topic {topic!r} (a broker that lost its data, "
        f"or a deleted topic; {detail}): the next session recreates it and fences"
    )


def recreated_reason(bootstrap: str, topic: str, why: str) -> str:
    """Why a session ends when ``topic`` is another topic than the one it began with."""
    return (
        f"Kafka at {bootstrap} has topic {topic!r} {why} (a broker that lost its data, or a "
        "deleted topic, created again by another process): events Kafka acknowledged may be lost"
    )
