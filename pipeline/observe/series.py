"""The dashboard's time series: per-second figures of what the worker did, for the last few minutes.

:class:`SeriesRecorder` is an :class:`~pipeline.observe.ApplyObserver`. It counts events and outcomes
per second itself; every lag and stage figure it serves is read from the worker's lag sketch
(:mod:`pipeline.observe.sketch`), the one ``/freshkey/stats`` and the SLA read: a point's percentiles are
those of its second, the summary's those of the window it states (``window_s``), computed exactly as the
stats page and the SLA compute theirs. Seconds older than ``retention_s`` are dropped. Everything runs
on the worker's event loop: no locks.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.observe.report import (
    STAGE_PLAN,
    STAGE_SOURCE,
    STAGE_TOTAL,
    STAGE_TRANSPORT,
    TIER_STAGE_PREFIX,
    BatchReport,
)
from pipeline.observe.sketch import COARSE, LAG, P50, P99, STAGE, LagSketch, Reading, window_name

LAG_QUANTILES = {"p50": P50, "p95": 0.95, "p99": P99}
STAGE_QUANTILES = {"p50": P50, "p99": P99}
SUMMARY_WINDOW_S = 60
CHANGE_OPS = ("c", "u", "d", "r")
"""Event kinds that are row changes (the others: ddl, unbound, dead_lettered)."""


@dataclass
class _Counts:
    """What was counted during one wall-clock second (unix ``t``)."""

    t: int
    events: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)


def stage_order(stage: str) -> tuple[int, str]:
    """Path order: source, transport, plan, the tiers (as named), then the end-to-end total."""
    fixed = {STAGE_SOURCE: 0, STAGE_TRANSPORT: 1, STAGE_PLAN: 2}
    if stage in fixed:
        return fixed[stage], ""
    if stage.startswith(TIER_STAGE_PREFIX):
        return 3, ""  # tiers keep the order they were first seen in (sorted() is stable)
    if stage == STAGE_TOTAL:
        return 5, ""
    return 4, stage


def _summary(reading: Reading, quantiles: dict[str, float]) -> dict[str, Any] | None:
    return reading.summary(quantiles) if reading.n else None


class SeriesRecorder:
    """Per-second counts and the sketch's figures; an ApplyObserver of the worker.

    ``snapshot(since)`` is the JSON of ``/freshkey/api/series``: one point per second that saw anything
    (seconds with no activity are absent: counts are zero there and lags unknown), a ``summary`` of the
    last ``SUMMARY_WINDOW_S`` seconds, and ``windows``: the lag figures of every window the worker
    reports (the SLA's among them), the same objects as ``/freshkey/stats``'s.
    """

    def __init__(self, retention_s: int = 900, clock: Callable[[], float] = time.time) -> None:
        if retention_s < 1:
            raise ValueError("retention_s must be at least 1")
        self.retention_s = retention_s
        self._clock = clock
        self._counts: dict[int, _Counts] = {}
        self._newest = 0
        self._points: dict[int, dict[str, Any]] = {}
        """Points of seconds that are over (nothing is added to them any more)."""
        self.started_at = clock()
        self.sketch = LagSketch(retention_s=retention_s, clock=clock)

    # -- ApplyObserver --------------------------------------------------------------------------------
    def attach(self, sketch: LagSketch) -> None:
        sketch.retain(self.retention_s)
        self.sketch = sketch

    def on_event(self, kind: str) -> None:
        self._current(None).events[kind] += 1

    def on_batch(self, report: BatchReport) -> None:
        second = self._current(report.at)
        second.events.update(report.events)
        outcomes = second.outcomes
        for (_tier, _namespace, outcome), count in report.outcomes.items():
            outcomes[outcome] += count

    # -- reading ---------------------------------------------------------------------------------------
    def stages(self) -> list[str]:
        """Every stage seen, in path order."""
        return sorted(self.sketch.names(STAGE), key=stage_order)

    def snapshot(self, since: float | None = None) -> dict[str, Any]:
        now = self._clock()
        self._expire(int(now))
        start = int(now) - self.retention_s + 1
        if since is not None:
            start = max(start, math.floor(since))
        seconds = sorted(t for t in {*self._counts, *self.sketch.seconds(since=start)} if t >= start)
        points = [self._points.get(t) or self._point(t, now) for t in seconds]
        return {
            "now": now,
            "started_at": self.started_at,
            "resolution_s": 1,
            "retention_s": self.retention_s,
            "stages": self.stages(),
            "points": points,
            "summary": self._summary(now),
            "windows": {
                window_name(s): {
                    "window_s": s,
                    "end": self.sketch.end(now),
                    "lag_ms": self.sketch.window(LAG, seconds=s, now=now).summary(),
                }
                for s in self.sketch.windows_s
            },
        }

    def _point(self, t: int, now: float) -> dict[str, Any]:
        counts = self._counts.get(t) or _Counts(t)
        sketch = self.sketch
        point = {
            "t": t,
            "events": dict(counts.events),
            "outcomes": dict(counts.outcomes),
            "lag_ms": _summary(sketch.second(t, LAG), LAG_QUANTILES),
            "coarse_lag_samples": sketch.second(t, COARSE).n,
            "stages_ms": {
                stage: summary
                for stage in self.stages()
                if (summary := _summary(sketch.second(t, STAGE, [stage]), STAGE_QUANTILES)) is not None
            },
        }
        if t < math.floor(now):
            self._points[t] = point  # over: nothing is added to it any more
        return point

    def _summary(self, now: float) -> dict[str, Any]:
        """The last ``SUMMARY_WINDOW_S`` whole seconds as of ``now`` (the sketch's window)."""
        sketch = self.sketch
        end = sketch.end(now)
        start = end - SUMMARY_WINDOW_S
        events: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for t, counts in self._counts.items():
            if start <= t < end:
                events.update(counts.events)
                outcomes.update(counts.outcomes)
        # Divide by the seconds the window really covers, so a worker up for 5 s is not averaged over 60.
        covered = max(1.0, min(float(SUMMARY_WINDOW_S), end - self.started_at))

        def read(kind: str, names: list[str] | None = None) -> Reading:
            return sketch.window(kind, names, seconds=SUMMARY_WINDOW_S, now=now)

        return {
            "window_s": SUMMARY_WINDOW_S,
            "end": end,
            "events": dict(events),
            "events_per_s": sum(events.values()) / covered,
            "changes_per_s": sum(events[op] for op in CHANGE_OPS) / covered,
            "outcomes": dict(outcomes),
            "lag_ms": _summary(read(LAG), LAG_QUANTILES),
            "coarse_lag_samples": read(COARSE).n,
            "stages_ms": {
                stage: summary
                for stage in self.stages()
                if (summary := _summary(read(STAGE, [stage]), STAGE_QUANTILES)) is not None
            },
        }

    # -- the ring -------------------------------------------------------------------------------------
    def _current(self, at: float | None) -> _Counts:
        # A wall clock stepped back keeps adding to the newest second (as the sketch does).
        t = max(int(self._clock() if at is None else at), self._newest)
        counts = self._counts.get(t)
        if counts is None:
            self._newest = t
            self._expire(t)
            counts = self._counts[t] = _Counts(t)
        return counts

    def _expire(self, now_s: int) -> None:
        oldest = now_s - self.retention_s + 1
        for table in (self._counts, self._points):
            for t in [t for t in table if t < oldest]:
                del table[t]
