"""What the worker has done: outcome counts, commit-to-cache lag, per-partition progress.

Served as JSON by the worker (``/freshkey/stats``) so that ``freshkey demo`` and operators can read it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerStats:
    max_samples: int = 1_000_000
    outcomes: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    offsets: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    lag_ms: dict[str, deque[float]] = field(default_factory=dict)
    coarse_lag_samples: Counter[str] = field(default_factory=Counter)
    stages: dict[str, deque[float]] = field(default_factory=dict)

    def record_stage(self, stage: str, ms: float) -> None:
        """Time spent in one stage of the path (connector clock in ms, so +-1 ms)."""
        samples = self.stages.get(stage)
        if samples is None:
            samples = self.stages[stage] = deque(maxlen=self.max_samples)
        samples.append(ms)

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_event(self, kind: str) -> None:
        self.events[kind] += 1

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        self.outcomes[f"{tier}:{outcome}"] += 1

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        self.record_lag(namespace, lag_ms, coarse=coarse)
        for stage, ms in stages.items():
            self.record_stage(stage, ms)

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        self.record_offset(topic, partition, offset)

    # -- records ------------------------------------------------------------------------------------------
    def record_lag(self, namespace: str, lag_ms: float, *, coarse: bool) -> None:
        """Commit-to-cache lag of one change; coarse ones (1 s binlog clock) are only counted."""
        if coarse:
            self.coarse_lag_samples[namespace] += 1
            return
        samples = self.lag_ms.get(namespace)
        if samples is None:
            samples = self.lag_ms[namespace] = deque(maxlen=self.max_samples)
        samples.append(lag_ms)

    def record_offset(self, topic: str, partition: int, offset: int) -> None:
        key = f"{topic}/{partition}"
        if offset > self.offsets.get(key, -1):
            self.offsets[key] = offset

    def snapshot(self) -> dict[str, Any]:
        return {
            "uptime_s": time.time() - self.started_at,
            "events": dict(self.events),
            "outcomes": dict(self.outcomes),
            "lag_ms": {ns: summarize(samples) for ns, samples in self.lag_ms.items()},
            "coarse_lag_samples": dict(self.coarse_lag_samples),
            "stages_ms": {stage: summarize(samples) for stage, samples in self.stages.items()},
            "offsets": dict(self.offsets),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    rank = (len(sorted_values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def summarize(samples: Iterable[float]) -> dict[str, float | int | None]:
    """p50, p99, max and count of lag samples (ms)."""
    values = sorted(samples)
    if not values:
        return {"p50": None, "p99": None, "max": None, "samples": 0}
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": values[-1],
        "samples": len(values),
    }
