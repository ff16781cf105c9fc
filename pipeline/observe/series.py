"""The dashboard's time series: per-second aggregates of what the worker did, for the last few minutes.

:class:`SeriesRecorder` is an :class:`~pipeline.observe.ApplyObserver`. Each second it keeps the
commit-to-cache lag and every stage's time in a :class:`Sketch` (log-spaced buckets, so memory per second
is bounded by the range of values, not by the throughput, and any percentile is within 1 % of the exact
one), plus the outcome and event counts. Seconds older than ``retention_s`` are dropped, so the recorder
never grows past ``retention_s`` buckets. Everything runs on the worker's event loop: no locks.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.observe import STAGE_PLAN, STAGE_SOURCE, STAGE_TOTAL, STAGE_TRANSPORT, TIER_STAGE_PREFIX

RELATIVE_ACCURACY = 0.01
"""A quantile of a :class:`Sketch` is within this fraction of the true sample value (DDSketch's bound)."""
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_ZERO_BELOW_MS = 1e-3
"""Values closer to zero than 1 µs count as zero (the log buckets need a positive magnitude)."""

LAG_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
STAGE_QUANTILES = {"p50": 0.50, "p99": 0.99}
SUMMARY_WINDOW_S = 60
CHANGE_OPS = ("c", "u", "d", "r")
"""Event kinds that are row changes (the others: ddl, unbound, dead_lettered)."""


class Sketch:
    """Quantiles of a stream of values with bounded relative error (a small DDSketch).

    A value v > 0 falls in bucket ``ceil(log_gamma(v))``; the bucket's representative value is within
    ``RELATIVE_ACCURACY`` of every value in it. Negative values (clock skew between hosts can make a stage
    look negative by a millisecond) are kept in a mirrored store, so they are not silently clamped. The
    minimum and maximum are exact.
    """

    __slots__ = ("_neg", "_pos", "_zero", "count", "max", "min")

    def __init__(self) -> None:
        self._pos: Counter[int] = Counter()
        self._neg: Counter[int] = Counter()
        self._zero = 0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        if math.isnan(value):
            return
        self.count += 1
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if value > _ZERO_BELOW_MS:
            self._pos[_index(value)] += 1
        elif value < -_ZERO_BELOW_MS:
            self._neg[_index(-value)] += 1
        else:
            self._zero += 1

    def merge(self, other: Sketch) -> None:
        self._pos.update(other._pos)
        self._neg.update(other._neg)
        self._zero += other._zero
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The value of rank ``floor(q * (count - 1))`` (lower rank, like ``numpy`` 'lower'), or None."""
        if self.count == 0:
            return None
        if q <= 0:
            return self.min
        if q >= 1:
            return self.max
        rank = q * (self.count - 1)
        seen = 0
        for index in sorted(self._neg, reverse=True):
            seen += self._neg[index]
            if seen > rank:
                return self._clamp(-_value(index))
        seen += self._zero
        if seen > rank:
            return self._clamp(0.0)
        for index in sorted(self._pos):
            seen += self._pos[index]
            if seen > rank:
                return self._clamp(_value(index))
        return self.max

    def summary(self, quantiles: Mapping[str, float]) -> dict[str, float | int] | None:
        """``{"count": n, "p50": ..., ..., "max": ...}`` in ms rounded to µs, or None when empty."""
        if self.count == 0:
            return None
        result: dict[str, float | int] = {"count": self.count}
        for name, q in quantiles.items():
            result[name] = _round(self.quantile(q))
        result["max"] = _round(self.max)
        return result

    def _clamp(self, value: float) -> float:
        return min(max(value, self.min), self.max)


def _index(magnitude: float) -> int:
    return math.ceil(math.log(magnitude) / _LOG_GAMMA)


def _value(index: int) -> float:
    return 2 * _GAMMA**index / (_GAMMA + 1)


def _round(value: float | None) -> float:
    assert value is not None
    return round(value, 3)


@dataclass
class _Second:
    """Everything observed during one wall-clock second (unix ``t``)."""

    t: int
    events: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    lag: Sketch = field(default_factory=Sketch)
    coarse: int = 0
    stages: dict[str, Sketch] = field(default_factory=dict)

    def point(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "events": dict(self.events),
            "outcomes": dict(self.outcomes),
            "lag_ms": self.lag.summary(LAG_QUANTILES),
            "coarse_lag_samples": self.coarse,
            "stages_ms": {name: sketch.summary(STAGE_QUANTILES) for name, sketch in self.stages.items()},
        }


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


class SeriesRecorder:
    """A ring buffer of per-second aggregates; an ApplyObserver of the worker.

    ``snapshot(since)`` is the JSON of ``/freshkey/api/series``: one point per second that saw anything
    (seconds with no activity are absent: counts are zero there and lags unknown), and a summary of the
    last ``SUMMARY_WINDOW_S`` seconds with percentiles over all of its samples (not an average of the
    per-second percentiles).
    """

    def __init__(self, retention_s: int = 900, clock: Callable[[], float] = time.time) -> None:
        if retention_s < 1:
            raise ValueError("retention_s must be at least 1")
        self.retention_s = retention_s
        self._clock = clock
        self._seconds: deque[_Second] = deque()
        self._stages: list[str] = []
        self.started_at = clock()

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_event(self, kind: str) -> None:
        self._current().events[kind] += 1

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        self._current().outcomes[outcome] += 1

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        second = self._current()
        if coarse:
            second.coarse += 1
        else:
            second.lag.add(lag_ms)
        for stage, ms in stages.items():
            sketch = second.stages.get(stage)
            if sketch is None:
                sketch = second.stages[stage] = Sketch()
                if stage not in self._stages:
                    self._stages.append(stage)
                    self._stages.sort(key=stage_order)
            sketch.add(ms)

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        """Offsets are in :class:`~pipeline.observe.stats.WorkerStats`; nothing per second to keep."""

    # -- reading ---------------------------------------------------------------------------------------
    def snapshot(self, since: float | None = None) -> dict[str, Any]:
        now = self._clock()
        self._expire(int(now))
        start = -math.inf if since is None else math.floor(since)
        window_start = int(now) - SUMMARY_WINDOW_S + 1
        return {
            "now": round(now, 3),
            "started_at": round(self.started_at, 3),
            "resolution_s": 1,
            "retention_s": self.retention_s,
            "stages": list(self._stages),
            "points": [s.point() for s in self._seconds if s.t >= start],
            "summary": self._summary([s for s in self._seconds if s.t >= window_start], now),
        }

    def _summary(self, seconds: Iterable[_Second], now: float) -> dict[str, Any]:
        lag = Sketch()
        stages: dict[str, Sketch] = {}
        events: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        coarse = 0
        for second in seconds:
            lag.merge(second.lag)
            for name, sketch in second.stages.items():
                stages.setdefault(name, Sketch()).merge(sketch)
            events.update(second.events)
            outcomes.update(second.outcomes)
            coarse += second.coarse
        # Divide by the seconds the window really covers, so a worker up for 5 s is not averaged over 60.
        covered = max(1.0, min(float(SUMMARY_WINDOW_S), now - self.started_at))
        return {
            "window_s": SUMMARY_WINDOW_S,
            "events": dict(events),
            "events_per_s": round(sum(events.values()) / covered, 3),
            "changes_per_s": round(sum(events[op] for op in CHANGE_OPS) / covered, 3),
            "outcomes": dict(outcomes),
            "lag_ms": lag.summary(LAG_QUANTILES),
            "coarse_lag_samples": coarse,
            "stages_ms": {
                name: stages[name].summary(STAGE_QUANTILES) for name in self._stages if name in stages
            },
        }

    # -- the ring -------------------------------------------------------------------------------------
    def _current(self) -> _Second:
        t = int(self._clock())
        if self._seconds and self._seconds[-1].t >= t:
            # Same second, or the wall clock stepped back: keep adding to the newest bucket.
            return self._seconds[-1]
        self._expire(t)
        second = _Second(t)
        self._seconds.append(second)
        return second

    def _expire(self, now_s: int) -> None:
        oldest = now_s - self.retention_s + 1
        while self._seconds and self._seconds[0].t < oldest:
            self._seconds.popleft()
