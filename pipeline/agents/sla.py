"""SLA evaluation and consumer progress: the timers that judge the targets and publish transitions, and
the figures (assignment, high watermarks, committed offsets) the backlog target needs."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from connectors.exceptions import ConfigurationError, ConnectorError
from connectors.kafka.topics import TopicRestorer, TopicSpec
from pipeline.context import Worker
from pipeline.observe.sla import SlaViolation

log = logging.getLogger(__name__)

VIOLATIONS_TOPIC_RETRY_S = 3.0
"""How soon the worker asks again for the violations topic when the broker did not answer."""

TICK_AFTER_S = 0.005
"""How long after a multiple of the evaluation interval the SLA is evaluated."""


def until_next_tick(now: float, interval_s: float) -> float:
    """Seconds from ``now`` (unix s) to the next evaluation: just after the next multiple of the interval.

    Windowed lag figures cover whole seconds (``pipeline.observe.sketch``): evaluated just after each one
    completes (for an interval that divides a second or is a whole number of them), the SLA state holds
    the figures that ``/freshkey/stats`` and the dashboard give for the same window during that second.
    """
    return (math.floor(now / interval_s) + 1) * interval_s + TICK_AFTER_S - now


class _Restorer(Protocol):
    def restore(
        self, wanted: Mapping[str, TopicSpec], *, timeout_s: float = ...
    ) -> tuple[list[str], list[str]]: ...


async def create_violations_topic(
    restorer: _Restorer, topic: str, partitions: int, ready: asyncio.Event
) -> None:
    """Create the SLA violations topic ``topic`` when the broker lacks it, then set ``ready``; asked again
    while the broker does not answer (violations wait in memory meanwhile), given up on a refusal, said
    why.

    This topic only: the change topic is the connector's to create. A worker that asked for it here while
    a broker that lost its data came back created it, unseen by the connector."""
    wanted = {topic: TopicSpec(partitions)}
    while True:
        try:
            await asyncio.to_thread(restorer.restore, wanted, timeout_s=30.0)
        except ConfigurationError as exc:
            log.error("SLA violations will not be published: %s", exc)
            return
        except ConnectorError as exc:
            log.warning(
                "the SLA violations topic is not ready yet (asked again in %.0f s): %s",
                VIOLATIONS_TOPIC_RETRY_S,
                exc,
            )
            await asyncio.sleep(VIOLATIONS_TOPIC_RETRY_S)
            continue
        ready.set()
        return


def install(w: Worker) -> None:
    app, settings = w.app, w.settings
    change_topic = settings.kafka.change_topic
    violations_ready = asyncio.Event()
    pending: list[SlaViolation] = []

    @app.task
    async def create_violations_topic_task() -> None:
        await create_violations_topic(
            TopicRestorer(settings.kafka),
            settings.sla.violations_topic,
            settings.kafka.partitions,
            violations_ready,
        )

    @app.task
    async def evaluate_sla_every_interval() -> None:
        interval_s = settings.sla.evaluation_interval_s
        while True:
            await asyncio.sleep(until_next_tick(time.time(), interval_s))
            await evaluate_sla()

    async def evaluate_sla() -> None:
        _, transitions = w.sla.evaluate()
        for event in transitions:
            w.otel.on_sla_event(event)
            log.log(logging.WARNING if event.kind == "violation" else logging.INFO, "%s", event.message)
        pending.extend(transitions)
        while pending and violations_ready.is_set():
            await w.topics["violations"].send(key=w.sla.worker.encode(), value=pending[0].to_json())
            pending.pop(0)

    async def refresh_progress() -> None:
        """Feed ConsumerProgress: the change topic's partitions assigned here, every partition's high
        watermark (the consumer's fetch figure where it has one, else the broker's) and the group's
        committed offsets. What cannot be read stays unknown, and counts against the SLA."""
        assigned: list[Any] = []
        try:
            assigned = [tp for tp in app.consumer.assignment() if tp.topic == change_topic]
        except Exception as exc:  # the consumer has not started: nothing is assigned
            log.debug("no assignment yet: %r", exc)
        w.progress.set_assignment(tp.partition for tp in assigned)
        highs: dict[int, int] = {}
        for tp in assigned:
            try:
                high = app.consumer.highwater(tp)
            except Exception:  # not fetched yet, or rebalancing
                continue
            if isinstance(high, int) and high >= 0:
                highs[tp.partition] = high
        try:
            figures = await asyncio.to_thread(w.broker_offsets.read)
        except Exception as exc:  # broker unreachable or slow: the figures stay as they were
            log.debug("no offsets from the broker: %r", exc)
        else:
            w.progress.set_committed(figures.committed)
            for partition, high in figures.highs.items():
                highs[partition] = max(high, highs.get(partition, high))
        w.progress.set_high_watermarks(highs)

    @app.timer(settings.telemetry.consumer_lag_interval_s)
    async def sample_high_watermarks() -> None:
        await refresh_progress()

    async def on_partitions_assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Right after each rebalance (even one that leaves this worker nothing): the timer only ticks
        # every interval.
        assigned = args[0] if args else kwargs.get("assigned", ())
        w.progress.set_assignment(tp.partition for tp in assigned if tp.topic == change_topic)

    app.on_partitions_assigned.connect(on_partitions_assigned)
