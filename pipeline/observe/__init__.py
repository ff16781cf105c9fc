"""What the worker reports as it goes: one report per batch, one lag aggregator, several listeners.

``ChangeProcessor.apply`` builds one :class:`BatchReport` per applied batch (counts, and the lags and
stage times as arrays) and hands it to its :class:`Observers`, which records it once into the
:class:`~pipeline.observe.sketch.LagSketch` (the one lag aggregator) and passes it on. The listeners
(:class:`~pipeline.observe.stats.WorkerStats` for ``/freshkey/stats``, the SLA evaluator, the dashboard's
series, the OpenTelemetry instruments, the consumer progress) keep their counts and read every lag figure
from that sketch, so the same window gives the same figure everywhere. Nothing is reported per change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from pipeline.observe.report import (
    STAGE_PLAN,
    STAGE_SOURCE,
    STAGE_TOTAL,
    STAGE_TRANSPORT,
    TIER_STAGE_PREFIX,
    BatchBuilder,
    BatchReport,
    Repeated,
)
from pipeline.observe.sketch import LagSketch

__all__ = [
    "STAGE_PLAN",
    "STAGE_SOURCE",
    "STAGE_TOTAL",
    "STAGE_TRANSPORT",
    "TIER_STAGE_PREFIX",
    "ApplyObserver",
    "BatchBuilder",
    "BatchReport",
    "Observers",
    "Repeated",
]

log = logging.getLogger(__name__)


class ApplyObserver(Protocol):
    """A listener of the worker. :class:`Observers` calls only the methods an observer has."""

    def attach(self, sketch: LagSketch) -> None:
        """Read lag figures from ``sketch`` (called once, when added); it is fed before ``on_batch``."""

    def on_event(self, kind: str) -> None:
        """One thing happened outside a batch's changes: ``ddl``, ``unbound``, ``dead_lettered``, ..."""

    def on_batch(self, report: BatchReport) -> None:
        """A batch is in every tier (or refused for good, see ``ChangeProcessor.apply``)."""

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        """The worker acknowledged everything up to ``offset`` on that partition."""


class Observers:
    """Feeds the :class:`LagSketch` and fans every call out to the observers that have the method.

    An observer that raises is logged (once per observer and kind of error) and skipped: reporting must
    never stop a batch that the tiers already took (a poison value in a lag figure would otherwise fail
    the batch after its writes, again on every replay).
    """

    def __init__(self, observers: Iterable[object] = (), *, sketch: LagSketch | None = None) -> None:
        self.sketch = sketch if sketch is not None else LagSketch()
        self.observers: list[object] = []
        self.errors = 0
        self._logged: set[tuple[int, type]] = set()
        self._calls: dict[str, list[tuple[object, Any]]] = {}
        for observer in observers:
            self.add(observer)

    def add(self, observer: object) -> None:
        """Attach ``observer`` to the sketch and have it called from now on."""
        attach = getattr(observer, "attach", None)
        if attach is not None:
            attach(self.sketch)
        self.observers.append(observer)
        for method in ("on_event", "on_batch", "on_offset"):
            bound = getattr(observer, method, None)
            if bound is not None:
                self._calls.setdefault(method, []).append((observer, bound))

    def _failed(self, observer: object, exc: Exception) -> None:
        self.errors += 1
        key = (id(observer), type(exc))
        if key not in self._logged:
            self._logged.add(key)
            log.error("observer %s failed (%r); skipped (logged once)", type(observer).__name__, exc)

    def on_event(self, kind: str) -> None:
        for observer, call in self._calls.get("on_event", ()):
            try:
                call(kind)
            except Exception as exc:
                self._failed(observer, exc)

    def on_batch(self, report: BatchReport) -> None:
        try:
            report.record_into(self.sketch)
        except Exception as exc:
            self._failed(self.sketch, exc)
        for observer, call in self._calls.get("on_batch", ()):
            try:
                call(report)
            except Exception as exc:
                self._failed(observer, exc)

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        for observer, call in self._calls.get("on_offset", ()):
            try:
                call(topic, partition, offset)
            except Exception as exc:
                self._failed(observer, exc)
