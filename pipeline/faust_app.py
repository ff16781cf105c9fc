"""The worker's Faust app and worker: :class:`FreshkeyApp` (the consumer of :mod:`pipeline.consumer`,
its fetch settings, the change topic's :class:`~pipeline.intake.Intake`, batch acknowledgement),
:class:`PromptTableManager`, the collector settings of a worker process (:func:`freeze_gc`) and
:class:`FreshkeyWorker` (a stop that always ends)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any, cast

import faust
from faust.tables import TableManager
from faust.types import Message

from pipeline.consumer import Consumer, Transport
from pipeline.intake import Intake


class PromptTableManager(TableManager):
    """Faust's table manager without the 1 s sleep it takes before closing the list of tables.

    Faust sleeps so that tables an agent declares while starting are still subscribed to; freshkey
    declares every table in :func:`pipeline.app.create_app`, before the worker starts (a later one is
    refused with "Too late to add tables"). The consumer group join waits for this step, so the sleep
    was a whole second of every worker start (launch -> first apply)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class FreshkeyApp(faust.App):
    """faust.App with a configurable consumer fetch wait and fetch minimum (``kafka://`` brokers only),
    an optional :class:`Intake` for one set of topics (:meth:`use_intake`) and a
    :class:`PromptTableManager`."""

    def __init__(
        self, *args: Any, fetch_max_wait_ms: int = 10, fetch_min_bytes: int = 1, **kwargs: Any
    ) -> None:
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.intake: Intake | None = None
        kwargs.setdefault("TableManager", PromptTableManager)
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return Transport(self.conf.broker_consumer, self)

    def use_intake(self, topic: faust.TopicT, *, batch: int, capacity: int) -> Intake:
        """Subscribe to ``topic`` and deliver its messages to the returned intake (not to agents). Its
        consumer acknowledges each message with ``app.consumer.ack(message)`` once it is done with it, and
        skips messages of an older consumer generation (:meth:`current`)."""
        self.intake = Intake(topic.topics, batch=batch, capacity=capacity)
        # Cleared with the agents' buffers when partitions are revoked, and when flow resumes.
        self.flow_control.manage_queue(self.intake)  # type: ignore[arg-type]
        self.topics.add(topic)  # what the consumer subscribes to, as an agent's topic would be
        return self.intake

    def current(self, message: Message) -> bool:
        """Whether ``message`` was fetched in the current consumer generation while flow is active (a
        message fetched before a rebalance is fetched again after it, by whichever worker holds it)."""
        return self.flow_control.is_active() and message.generation_id == self.consumer_generation_id

    def current_of(self, messages: Sequence[Message]) -> list[Message]:
        """Those of ``messages`` that are :meth:`current`."""
        if not self.flow_control.is_active():
            return []
        generation = self.consumer_generation_id
        return [m for m in messages if m.generation_id == generation]

    def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge ``messages`` (their offsets may be committed): Faust's ``consumer.ack`` of each."""
        cast(Consumer, self.consumer).ack_many(messages)


GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default: 700).

A batch keeps its messages, events and plans alive until its tiers answered: about 10 container objects
per change, 5,000 for a batch of 500. At 700 the collector ran seven times per batch, each time walking
the batch's objects again and promoting them to the older generations, whose passes walked them once
more: 2 µs of the 20 µs per change of decode, plan and apply (tests/benchmarks/worker_path.py: 18.4
against 20.5 µs; with the collector off, 18.6), and 35.5 -> 32.3 µs per change of the whole worker
(``freshkey bench pipeline --only single,worker``, medians of five rounds). At 10,000 most of a batch
is freed by reference counting before a pass sees it; cycles still get collected, a little later. The
connector does the same for its own allocation pattern (:mod:`connectors.gc_tuning`)."""


def freeze_gc() -> None:
    """Move everything allocated so far (the imported modules, the app) out of the cyclic collector's
    reach: a full collection then walks only what the worker allocates later. With torch imported a full
    pass took 74 ms, long enough to show in the lag's p99. Then collect the youngest generation every
    :data:`GC_YOUNG_THRESHOLD` allocations instead of every 700."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


class FreshkeyWorker(faust.Worker):
    """faust.Worker that always ends within ``shutdown_grace_s`` of SIGTERM/SIGINT.

    A graceful stop waits for agents and the consumer group to leave; when something hangs (a broker
    that does not answer, a tier being retried), the process exits anyway after the grace period. Nothing
    is lost: offsets move only past applied changes, so whatever was in flight is replayed.
    """

    def __init__(self, *args: Any, shutdown_grace_s: float = 15.0, **kwargs: Any) -> None:
        self.shutdown_grace_s = shutdown_grace_s
        self._watchdog: threading.Timer | None = None
        super().__init__(*args, **kwargs)

    async def on_first_start(self) -> None:
        freeze_gc()  # every module is imported and the app is built: keep them out of the collector
        await super().on_first_start()

    def _schedule_shutdown(self, signal: signal.Signals) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Timer(self.shutdown_grace_s, self._force_exit, args=(signal,))
            self._watchdog.daemon = True
            self._watchdog.start()
        super()._schedule_shutdown(signal)

    def _force_exit(self, sig: signal.Signals) -> None:
        logging.getLogger(__name__).warning(
            "graceful stop took longer than %.1f s after %s: exiting now (unacknowledged changes are "
            "replayed by the next worker)",
            self.shutdown_grace_s,
            sig.name,
        )
        logging.shutdown()
        os._exit(0)


__all__ = ["FreshkeyApp", "FreshkeyWorker", "Intake", "freeze_gc"]
