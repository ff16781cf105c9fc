"""What the worker reports as it goes: one small interface, several listeners.

The worker calls an :class:`ApplyObserver` at each step; :class:`~pipeline.observe.stats.WorkerStats`
(the JSON stats page) and the OpenTelemetry instruments are listeners. ``stages`` maps a stage name to the ms
spent in it; the stage names are the constants below.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

log = logging.getLogger(__name__)

STAGE_SOURCE = "commit->connector"
"""Database commit to the connector reading it from the binlog (needs a µs commit-time column)."""
STAGE_TRANSPORT = "connector->worker"
"""Connector read to the worker receiving the batch: Kafka produce, ack and consume."""
STAGE_PLAN = "worker->planned"
"""Decoding, binding and computing the cache keys of the batch."""
TIER_STAGE_PREFIX = "planned->tier:"
"""Followed by the tier name: planned to that tier acknowledging the whole batch."""
STAGE_TOTAL = "commit->applied"


class ApplyObserver(Protocol):
    def on_event(self, kind: str) -> None:
        """One message handled: an op (c/u/d/r), ``ddl``, ``unbound`` or ``dead_lettered``."""

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        """One cache action's result in one tier: applied, tombstoned or stale."""

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        """A change is in every tier; ``lag_ms`` is commit -> applied (coarse: one-second commit clock)."""

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        """The worker acknowledged everything up to ``offset`` on that partition."""


class Observers:
    """Fans every call out to several observers.

    An observer that raises is logged (once per observer and kind of error) and skipped: reporting must
    never stop a batch that the tiers already took (a poison value in a lag figure would otherwise fail
    the batch after its writes, again on every replay).
    """

    def __init__(self, observers: Sequence[ApplyObserver] = ()) -> None:
        self.observers = list(observers)
        self.errors = 0
        self._logged: set[tuple[int, type]] = set()

    def add(self, observer: ApplyObserver) -> None:
        self.observers.append(observer)

    def _failed(self, observer: ApplyObserver, exc: Exception) -> None:
        self.errors += 1
        key = (id(observer), type(exc))
        if key not in self._logged:
            self._logged.add(key)
            log.error("observer %s failed (%r); skipped (logged once)", type(observer).__name__, exc)

    def on_event(self, kind: str) -> None:
        for o in self.observers:
            try:
                o.on_event(kind)
            except Exception as exc:
                self._failed(o, exc)

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        for o in self.observers:
            try:
                o.on_outcome(tier, namespace, outcome)
            except Exception as exc:
                self._failed(o, exc)

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        for o in self.observers:
            try:
                o.on_applied(namespace, op, lag_ms, coarse=coarse, stages=stages)
            except Exception as exc:
                self._failed(o, exc)

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        for o in self.observers:
            try:
                o.on_offset(topic, partition, offset)
            except Exception as exc:
                self._failed(o, exc)
