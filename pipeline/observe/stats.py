"""What the worker has done: outcome counts, commit-to-cache lag, per-partition progress.

Served as JSON by the worker (``/freshkey/stats``) so that ``freshkey demo`` and operators can read it.
Every lag figure is read from the worker's :class:`~pipeline.observe.sketch.LagSketch`, the one the SLA
and the dashboard read: each figure states its window (``window_s``; null: since the worker started),
and the same window gives the same figure on every page (see the sketch's module docstring).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.observe.report import BatchReport
from pipeline.observe.sketch import COARSE, LAG, STAGE, LagSketch, Reading, window_name


@dataclass
class WorkerStats:
    """Counts and offsets of the worker, and the lag figures of its sketch (attached by ``Observers``).

    ``snapshot()`` is the body of ``/freshkey/stats``::

        {"uptime_s", "events", "outcomes", "offsets",
         "lag_ms": {namespace: {"window_s": null, "samples", "p50", "p99", "max"}},  # since start
         "coarse_lag_samples": {namespace: n}, "stages_ms": {stage: {...}},          # since start
         "windows": {"last_10s": {"window_s": 10, "end": <unix s>, "lag_ms": {...}, # every namespace
                                  "lag_ms_by_namespace": {...}, "stages_ms": {...}}, "last_60s": ...,
                     "since_start": {...}}}

    Percentiles are nearest-rank, at most 4.43 % high and never low (see the sketch).
    """

    clock: Callable[[], float] = time.time
    outcomes: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    offsets: dict[str, int] = field(default_factory=dict)
    sketch: LagSketch = field(default_factory=LagSketch)
    started_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    # -- ApplyObserver --------------------------------------------------------------------------------
    def attach(self, sketch: LagSketch) -> None:
        self.sketch = sketch

    def on_event(self, kind: str) -> None:
        self.events[kind] += 1

    def on_batch(self, report: BatchReport) -> None:
        self.events.update(report.events)
        for (tier, _namespace, outcome), count in report.outcomes.items():
            self.outcomes[f"{tier}:{outcome}"] += count

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        self.record_offset(topic, partition, offset)

    # -- records ------------------------------------------------------------------------------------------
    def record_offset(self, topic: str, partition: int, offset: int) -> None:
        """The last offset acknowledged on a partition. The latest, not the highest: after a broker lost
        its topics the recreated partition starts again from 0, and the old figure would read as caught
        up until the new log passed it."""
        self.offsets[f"{topic}/{partition}"] = offset

    def window(self, seconds: float | None, *, now: float | None = None) -> dict[str, Any]:
        """Every lag figure over the last ``seconds`` as of ``now`` (``None``: since start)."""
        sketch = self.sketch
        end = None if seconds is None else sketch.end(now)

        def read(kind: str) -> Reading:
            if seconds is None:
                return sketch.since_start(kind)
            return sketch.window(kind, seconds=seconds, now=end)

        def per_name(kind: str) -> dict[str, Reading]:
            if seconds is None:
                return sketch.since_start_per_name(kind)
            return sketch.window_per_name(kind, seconds=seconds, now=end)

        return {
            "window_s": seconds,
            "end": end,
            "lag_ms": read(LAG).summary(),
            "lag_ms_by_namespace": {ns: reading.summary() for ns, reading in per_name(LAG).items()},
            "coarse_lag_samples": read(COARSE).n,
            "stages_ms": {stage: reading.summary() for stage, reading in per_name(STAGE).items()},
        }

    def snapshot(self, *, now: float | None = None) -> dict[str, Any]:
        now = self.clock() if now is None else now
        since_start = self.window(None)
        windows = {window_name(s): self.window(s, now=now) for s in self.sketch.windows_s}
        windows["since_start"] = since_start
        return {
            "uptime_s": now - self.started_at,
            "events": dict(self.events),
            "outcomes": dict(self.outcomes),
            "lag_ms": since_start["lag_ms_by_namespace"],
            "coarse_lag_samples": {
                ns: reading.n for ns, reading in self.sketch.since_start_per_name(COARSE).items()
            },
            "stages_ms": since_start["stages_ms"],
            "windows": windows,
            "offsets": dict(self.offsets),
        }
