"""The worker's topics after a broker lost its data (``pipeline.agents.broker_topics``): which it
recreates and how, and what it says about the topics it reads but does not own."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from connectors.exceptions import ConfigurationError, KafkaUnavailableError
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import TopicSpec
from pipeline.agents import sla
from pipeline.agents.broker_topics import TopicKeeper, owned_topics
from pipeline.faust_app import FreshkeyApp
from pipeline.settings import SlaSettings

KAFKA = KafkaSettings(
    bootstrap="127.0.0.1:1",
    partitions=5,
    change_topic="c",
    dead_letter_topic="dl",
    model_update_topic="mu",
    hotness_topic="hot",
)


def test_the_owned_topics_are_as_the_worker_declares_them_and_not_the_change_topic() -> None:
    app = FreshkeyApp("keeper-test", broker="kafka://127.0.0.1:1")
    app.Table("hotness", default=None, key_type=str, value_type=str, partitions=KAFKA.partitions)
    worker: Any = SimpleNamespace(
        settings=SimpleNamespace(kafka=KAFKA, sla=SlaSettings(violations_topic="v")), app=app
    )
    assert owned_topics(worker) == {
        "dl": TopicSpec(5),
        "mu": TopicSpec(5),
        "hot": TopicSpec(5),
        "v": TopicSpec(5),
        "keeper-test-hotness-changelog": TopicSpec(5, {"cleanup.policy": "compact"}),
    }


def test_recreated_topics_are_counted_and_a_missing_input_is_said_once_per_disappearance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []
    keeper = TopicKeeper({"dl": TopicSpec(3), "hot": TopicSpec(3)}, ["c", "dl"], events.append)
    assert keeper.inputs == ["c"], "an owned topic is recreated, not waited for"
    caplog.set_level(logging.INFO, logger="pipeline.agents.broker_topics")

    keeper.saw([], ["c", "dl", "hot"])
    assert events == [] and not caplog.records

    keeper.saw(["dl", "hot"], ["dl", "hot"])  # the broker came back empty
    keeper.saw([], ["dl", "hot"])
    keeper.saw([], ["dl", "hot"])
    assert events == ["topic_recreated", "topic_recreated", "input_topic_missing"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "topic 'c' is missing on the broker" in errors[0]
    assert "recreated with 3 partitions" in caplog.records[0].getMessage()

    caplog.clear()
    keeper.saw([], ["c", "dl", "hot"])  # the connector recreated it
    assert [r.getMessage() for r in caplog.records] == [
        "topic 'c' is back on the broker: the worker reads it again after its next metadata refresh "
        "(within 5 s)"
    ]
    keeper.saw([], ["dl", "hot"])  # and it went away again: said again
    assert events[-1] == "input_topic_missing" and events.count("input_topic_missing") == 2


class _Restorer:
    """Stands in for the broker's admin API: answers as told, records what it was asked to create."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, TopicSpec]] = []

    def restore(self, wanted: Any, *, timeout_s: float = 10.0) -> tuple[list[str], list[str]]:
        self.asked.append(dict(wanted))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return sorted(wanted), sorted(wanted)


def test_the_sla_task_asks_for_its_violations_topic_only_and_again_while_the_broker_is_away(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the task asked for the change and dead-letter topics as well: a worker whose task ran while
    a broker that lost its data came back created the change topic (tests/integration/test_broker_loss.py
    caught it in 5 of 16 runs); and a broker away for longer than one ask ended the task for good, every
    later violation unpublished."""
    monkeypatch.setattr(sla, "VIOLATIONS_TOPIC_RETRY_S", 0.0)
    restorer = _Restorer(KafkaUnavailableError("Kafka at x does not answer"), None)
    ready = asyncio.Event()
    with caplog.at_level(logging.WARNING):
        asyncio.run(sla.create_violations_topic(restorer, "v", 5, ready))
    assert ready.is_set()
    assert restorer.asked == [{"v": TopicSpec(5)}, {"v": TopicSpec(5)}]
    assert "not ready yet" in caplog.text


def test_the_sla_task_gives_up_on_a_refusal_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    restorer = _Restorer(ConfigurationError("cannot create topic 'v': POLICY_VIOLATION"))
    ready = asyncio.Event()
    with caplog.at_level(logging.ERROR):
        asyncio.run(sla.create_violations_topic(restorer, "v", 5, ready))
    assert not ready.is_set()
    assert "SLA violations will not be published: cannot create topic 'v'" in caplog.text
