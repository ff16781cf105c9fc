"""connectors.kafka.topics against the real broker: what a short end offset says, and what it does not."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import end_offsets, ensure_topics, record_exists

pytestmark = pytest.mark.integration


def test_an_event_the_end_offset_leaves_out_is_found_by_reading_it(kafka_bootstrap: str) -> None:
    """The connector remembers the offsets Kafka acknowledged; a broker reporting a lower end offset has
    not necessarily lost them (some report the last batch's base offset + 1). Reading the last
    acknowledged event tells a real loss from a short report."""
    tag = uuid.uuid4().hex[:8]
    settings = KafkaSettings(
        bootstrap=kafka_bootstrap,
        change_topic=f"freshkey.changes.{tag}",
        dead_letter_topic=f"freshkey.dead-letters.{tag}",
        partitions=1,
    )
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 50})
    for i in range(10):  # one batch
        producer.produce(settings.change_topic, value=b"%d" % i, partition=0)
    assert producer.flush(10) == 0
    reported = end_offsets(settings, settings.change_topic, 1)[0]
    assert 1 <= reported <= 10
    assert record_exists(settings, settings.change_topic, 0, 9, timeout_s=5)
    assert not record_exists(settings, settings.change_topic, 0, 10, timeout_s=2), "nothing there yet"
