"""One applied batch as the observers see it: :class:`BatchReport`, and :class:`BatchBuilder` that the
processor fills while it applies the batch (counts, and lags and stage times as arrays: the observers
do no work per change)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from pipeline.observe.sketch import COARSE, LAG, STAGE, LagSketch, Values

STAGE_SOURCE = "commit->connector"
"""Database commit to the connector reading it from the binlog (needs a µs commit-time column)."""
STAGE_TRANSPORT = "connector->worker"
"""Connector read to the worker receiving the batch: Kafka produce, ack and consume."""
STAGE_PLAN = "worker->planned"
"""Decoding, binding and computing the cache keys of the batch."""
TIER_STAGE_PREFIX = "planned->tier:"
"""Followed by the tier name: planned to that tier acknowledging the whole batch."""
STAGE_TOTAL = "commit->applied"


@dataclass(frozen=True, slots=True)
class Repeated:
    """``count`` samples of one value: a stage the whole batch spent together (planning, a tier)."""

    value: float
    count: int


@dataclass(frozen=True)
class BatchReport:
    """What one applied batch did, built once by ``ChangeProcessor.apply`` and read by every observer.

    Every change of the batch is counted once in ``events`` (its op, and ``change_applied``,
    ``change_superseded`` or ``change_not_newer``); every action a tier answered (or skipped, fenced) once
    in ``outcomes``. Lags are commit to every tier acknowledging, in ms, per namespace: ``lags`` with a
    precise commit clock, ``coarse_lags`` with the binlog's one-second one (counted, never a percentile).
    """

    at: float
    """When the batch was in every tier (unix s): the second its samples belong to."""
    events: Mapping[str, int] = field(default_factory=dict)
    outcomes: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """(tier, namespace, outcome) -> actions; outcomes: applied, tombstoned, not_newer, failed, fenced."""
    lags: Mapping[str, Values] = field(default_factory=dict)
    coarse_lags: Mapping[str, Values] = field(default_factory=dict)
    stages: Mapping[str, Values | Repeated] = field(default_factory=dict)
    """Time spent in each stage (the ``STAGE_*`` names, ``TIER_STAGE_PREFIX`` + tier), per change."""
    tier_outcomes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Per tier, the outcome of each action it was sent, in the order sent (the tracer matches them)."""
    tier_done_ms: Mapping[str, float] = field(default_factory=dict)
    """When each tier acknowledged the batch (unix ms)."""

    def record_into(self, sketch: LagSketch) -> None:
        """Every lag and stage time of the batch, into ``sketch`` (one call per key)."""
        for namespace, lags in self.lags.items():
            sketch.record((LAG, namespace), lags, at=self.at)
        for namespace, lags in self.coarse_lags.items():
            sketch.record((COARSE, namespace), lags, at=self.at)
        for stage, times in self.stages.items():
            if isinstance(times, Repeated):
                sketch.record_repeated((STAGE, stage), times.value, times.count, at=self.at)
            else:
                sketch.record((STAGE, stage), times, at=self.at)


class BatchBuilder:
    """Collects one batch for its :class:`BatchReport`: the processor calls :meth:`outcome` per action a
    tier answered and :meth:`change` per change it reports, then :meth:`report` once."""

    def __init__(self) -> None:
        self.events: Counter[str] = Counter()
        self.outcomes: Counter[tuple[str, str, str]] = Counter()
        self.tier_outcomes: dict[str, list[str]] = {}
        self.tier_done_ms: dict[str, float] = {}
        self._commits: dict[str, list[float]] = {}
        self._coarse_commits: dict[str, list[float]] = {}
        self._read_ms: list[float] = []
        self._precise_read_ms: list[float] = []
        self._precise_commit_ms: list[float] = []

    def tier_done(self, tier: str) -> None:
        """``tier`` acknowledged the batch's actions sent to it (now)."""
        self.tier_done_ms[tier] = time.time() * 1000

    def outcome(self, tier: str, namespace: str, outcome: str) -> None:
        """One action's outcome in ``tier``, in the order the actions were sent."""
        self.tier_outcomes.setdefault(tier, []).append(outcome)
        self.outcomes[(tier, namespace, outcome)] += 1

    def outcomes_of(self, tier: str, namespaces: Sequence[str], outcomes: Sequence[str]) -> None:
        """:meth:`outcome` for each action of one tier's answer at once: ``namespaces[i]`` and
        ``outcomes[i]`` are the i-th action's, in the order the actions were sent."""
        if len(namespaces) != len(outcomes):
            raise ValueError("one namespace per outcome")
        self.tier_outcomes.setdefault(tier, []).extend(outcomes)
        self.outcomes.update(zip(repeat(tier), namespaces, outcomes, strict=False))

    def skipped(self, tier: str, namespace: str, count: int = 1) -> None:
        """Actions not sent to ``tier``: it is fenced."""
        self.outcomes[(tier, namespace, "fenced")] += count

    def change(
        self, namespace: str, op: str, accounted: str, read_ms: float, commit_ms: float, *, coarse: bool
    ) -> None:
        """A change in every tier: its op, how it is accounted for (``change_applied``...), when the
        connector read it and when it was committed (ms)."""
        self.events[op] += 1
        self.events[accounted] += 1
        self._read_ms.append(read_ms)
        if coarse:
            self._coarse_commits.setdefault(namespace, []).append(commit_ms)
        else:
            self._commits.setdefault(namespace, []).append(commit_ms)
            self._precise_read_ms.append(read_ms)
            self._precise_commit_ms.append(commit_ms)

    def report(self, *, received_ms: float, planned_ms: float) -> BatchReport:
        """The report, as of now: lags are now minus the commit times."""
        now = time.time()
        now_ms = now * 1000
        n = len(self._read_ms)
        stages: dict[str, Values | Repeated] = {}
        if n:
            stages[STAGE_TRANSPORT] = received_ms - np.array(self._read_ms, dtype=np.float64)
            stages[STAGE_PLAN] = Repeated(planned_ms - received_ms, n)
        if self._precise_read_ms:
            read = np.array(self._precise_read_ms, dtype=np.float64)
            stages[STAGE_SOURCE] = read - np.array(self._precise_commit_ms, dtype=np.float64)
        previous = planned_ms
        for tier, done in sorted(self.tier_done_ms.items(), key=lambda item: item[1]):
            if n:
                stages[TIER_STAGE_PREFIX + tier] = Repeated(done - previous, n)
            previous = done
        return BatchReport(
            at=now,
            events=self.events,
            outcomes=self.outcomes,
            lags=_lags(now_ms, self._commits),
            coarse_lags=_lags(now_ms, self._coarse_commits),
            stages=stages,
            tier_outcomes=self.tier_outcomes,
            tier_done_ms=self.tier_done_ms,
        )


def _lags(now_ms: float, commits: Mapping[str, list[float]]) -> dict[str, Values]:
    return {namespace: now_ms - np.array(c, dtype=np.float64) for namespace, c in commits.items()}
