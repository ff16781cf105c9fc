"""The worker's topics, kept on the broker: a broker that lost its data (a restart of Tansu's memory
storage, an Apache Kafka whose volume is gone, a deleted topic) comes back without them, and the worker
never has them auto-created (:func:`forbid_topic_auto_creation`).

Every :data:`CHECK_EVERY_S` the worker lists the broker's topics. Those it writes or reads itself (dead
letters, model updates, hotness, SLA violations, its tables' changelogs) it recreates as they were
declared, with a warning. The change topic it only reports, once per disappearance: it is the
connector's, which recreates it and fences every namespace before producing again (its events on the
lost topic may never have reached a worker); the worker's consumer finds it again at its next metadata
refresh (:data:`METADATA_MAX_AGE_MS`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from aiokafka import client as aiokafka_client

from connectors.exceptions import ConfigurationError, ConnectorError
from connectors.kafka.topics import TopicRestorer, TopicSpec
from pipeline.context import Worker

log = logging.getLogger(__name__)

OnEvent = Callable[[str], None]

CHECK_EVERY_S = 3.0
"""How often the worker looks for its topics on the broker (one metadata request)."""

METADATA_MAX_AGE_MS = 5_000
"""How often the worker's consumer refreshes the broker's metadata (one request of a few topics):
aiokafka's default, 5 min, kept a worker that joined while the change topic was missing from reading it
for that long after the connector recreated it."""


class _MetadataRequest(aiokafka_client.MetadataRequest):
    """aiokafka's metadata request with topic auto-creation off (it always asks for it, with no setting)."""

    def __init__(
        self, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None
    ) -> None:
        super().__init__(topics, allow_auto_topic_creation=False)


def forbid_topic_auto_creation() -> None:
    """Make every aiokafka client of this process ask for metadata without topic auto-creation.

    aiokafka asks a broker to create every topic it looks up. A broker that lost its data (Tansu's memory
    storage after a restart, an Apache Kafka whose volume is gone) then recreates the change topic at
    the worker's first look, with the broker's default partition count (4 on Tansu): the connector
    refuses that topic and stops, and the dead-letter, model-update and hotness topics would come back
    with the wrong partition counts and configs. Without auto-creation the connector recreates the change
    topic (and fences every namespace), and :func:`install` the worker's own topics."""
    aiokafka_client.MetadataRequest = _MetadataRequest


def owned_topics(w: Worker) -> dict[str, TopicSpec]:
    """The topics this worker recreates when the broker lost them, as it declares them."""
    kafka = w.settings.kafka
    own = {
        kafka.dead_letter_topic: TopicSpec(kafka.partitions),
        kafka.model_update_topic: TopicSpec(kafka.partitions),
        kafka.hotness_topic: TopicSpec(kafka.partitions),
        w.settings.sla.violations_topic: TopicSpec(kafka.partitions),
    }
    for table in w.app.tables.values():
        changelog = table.changelog_topic
        own[changelog.get_topic_name()] = TopicSpec(
            changelog.partitions or kafka.partitions,
            {"cleanup.policy": "compact"} if changelog.compacting else {},
        )
    return own


class TopicKeeper:
    """What the worker makes of one look at the broker's topics (:meth:`saw`): a warning per owned topic
    recreated, an error per input topic (read but not owned) gone missing, once per disappearance."""

    def __init__(self, own: Mapping[str, TopicSpec], inputs: Iterable[str], on_event: OnEvent) -> None:
        self.own = dict(own)
        self.inputs = sorted(set(inputs) - set(own))
        self.on_event = on_event
        self.missing: set[str] = set()

    def saw(self, created: Iterable[str], existing: Iterable[str]) -> None:
        for topic in created:
            self.on_event("topic_recreated")
            log.warning(
                "topic %r was missing on the broker (a broker that lost its data, or a deleted topic): "
                "recreated with %d partitions",
                topic,
                self.own[topic].partitions,
            )
        have = set(existing)
        for topic in self.inputs:
            if topic not in have and topic not in self.missing:
                self.on_event("input_topic_missing")
                log.error(
                    "topic %r is missing on the broker (a broker that lost its data, or a deleted topic): "
                    "no change reaches the caches until the connector recreates it, and it fences every "
                    "namespace then",
                    topic,
                )
            elif topic in have and topic in self.missing:
                log.warning(
                    "topic %r is back on the broker: the worker reads it again after its next metadata "
                    "refresh (within %.0f s)",
                    topic,
                    METADATA_MAX_AGE_MS / 1000,
                )
        self.missing = {t for t in self.inputs if t not in have}


def install(w: Worker) -> None:
    kafka = w.settings.kafka

    @w.app.task
    async def keep_topics() -> None:
        # Built once the app runs: every table is declared by then.
        keeper = TopicKeeper(owned_topics(w), w.topics["changes"].topics, w.processor.observers.on_event)
        restorer = TopicRestorer(kafka)
        refused = ""
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                created, existing = await asyncio.to_thread(restorer.restore, keeper.own)
            except ConfigurationError as exc:  # a creation the broker refuses: said once, tried again
                if str(exc) != refused:
                    log.error("the worker cannot recreate its topics: %s", exc)
                refused = str(exc)
                continue
            except ConnectorError as exc:  # the broker away: the consumer says so; looked at next time
                log.debug("topics not checked now: %s", exc)
                continue
            refused = ""
            keeper.saw(created, existing)
