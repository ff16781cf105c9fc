"""Which topics make a Debezium-reading worker restart to subscribe to them."""

from __future__ import annotations

from pipeline.agents.debezium_topics import new_topics
from schemas.debezium import DebeziumTopics


def test_a_new_topic_that_matches_the_pattern_is_new() -> None:
    topics = DebeziumTopics.parse(r"regex:dbserver1\.inventory\..*")
    names = ["dbserver1.inventory.orders", "dbserver1.inventory.customers", "dbserver1.other.x", "__consumer"]
    assert new_topics(names, ["dbserver1.inventory.orders"], topics) == ["dbserver1.inventory.customers"]
    assert new_topics(names, ["dbserver1.inventory.orders", "dbserver1.inventory.customers"], topics) == []


def test_the_pattern_matches_whole_names() -> None:
    topics = DebeziumTopics.parse(r"regex:dbserver1\.inventory\.orders")
    assert new_topics(["dbserver1.inventory.orders_archive"], [], topics) == []
