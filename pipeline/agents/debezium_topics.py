"""New Debezium topics: a table Debezium starts capturing after the worker started gets a topic of its
own, and faust-streaming's Kafka driver subscribes to a list of topics, not to a pattern. A worker that
went on without it would leave that table's cache entries stale with nothing said. So, with
``FRESHKEY_KAFKA_DEBEZIUM_TOPICS=regex:...``, the worker lists the topics every
``FRESHKEY_KAFKA_DEBEZIUM_TOPIC_CHECK_S``; when a new one matches it says which and exits with status 70
(``pipeline.outages.restart``): its supervisor starts it again, subscribed to every matching topic, and
the new topic is read from its beginning."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from connectors.kafka.topics import topic_names
from pipeline.config import debezium_options
from pipeline.context import Worker
from pipeline.outages import restart
from schemas.debezium import DebeziumTopics

log = logging.getLogger(__name__)


def new_topics(names: Iterable[str], subscribed: Iterable[str], topics: DebeziumTopics) -> list[str]:
    """The topics in ``names`` that match ``topics`` and are not ``subscribed``, sorted."""
    have = set(subscribed)
    return sorted(name for name in names if name not in have and topics.matches(name))


def install(w: Worker) -> None:
    settings = w.settings
    options = debezium_options(settings)
    interval_s = settings.kafka.debezium_topic_check_s
    if options.input != "debezium" or options.topics.pattern is None or interval_s <= 0:
        return
    subscribed = frozenset(w.topics["changes"].topics)

    @w.app.task
    async def watch_debezium_topics() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                names = await asyncio.to_thread(topic_names, settings.kafka)
            except Exception as exc:  # the broker away, a login refused: looked for again next time
                log.warning("new Debezium topics not looked for now: %s", exc)
                continue
            found = new_topics(names, subscribed, options.topics)
            if found:
                restart(
                    f"Debezium topic(s) {', '.join(found)} match FRESHKEY_KAFKA_DEBEZIUM_TOPICS="
                    f"regex:{options.topics.pattern} and were created after the worker subscribed"
                )
