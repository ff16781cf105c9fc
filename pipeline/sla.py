"""Consistency-lag SLAs: targets in settings, evaluated over a sliding window of applied changes.

Four targets, each ``ok``, ``violated`` or ``no_data``:

- ``p99_lag``: the 99th percentile of commit-to-cache lag (every tier acknowledged) is at most
  ``FRESHKEY_SLA_P99_LAG_MS`` (default 200 ms);
- ``consistency_window``: at least ``FRESHKEY_SLA_WINDOW_FRACTION`` (default 0.9999, "four nines") of
  the changes were visible in every tier within ``FRESHKEY_SLA_WINDOW_MS`` (default 1500 ms);
- ``heartbeat``: once a heartbeat (``connectors.heartbeat``) has been applied, the next one is never
  overdue by more than the consistency window;
- ``backlog_age``: no change waits on the change topic for longer than the consistency window without
  the worker acknowledging it ("consumer lag in time", see :class:`ConsumerProgress`). With the heartbeat,
  this is the target that sees a stalled worker *while* it is stalled, and it needs no heartbeat binding
  and no lag sample: the other two learn of a stall only when the late changes finally arrive. A
  partition this worker cannot vouch for (not assigned, no figure yet) counts against it.

Only precise lag samples count (a commit-time column in the binding, see :mod:`pipeline.apply`): a coarse
sample (the binlog's one-second clock) cannot tell 10 ms from 900 ms. Lag is measured against the
worker's clock, so clock skew between the database and the worker host adds to it.

How exact it is. The p99 and consistency-window *decisions* are exact over the samples in the window:
the evaluator counts the samples at or under each threshold, and "p99 <= T" holds exactly when at least
``ceil(0.99 n)`` of the ``n`` samples are <= T (nearest-rank percentile). The *reported* percentiles come
from a fixed-bucket histogram with bucket bounds growing by ``2 ** (1 / 16)``: for a nearest-rank
percentile ``x`` above :data:`MIN_BUCKET_MS`, the reported value ``e`` satisfies ``x <= e < x * 1.0443``
(at most 4.43 % high, never low); it is also capped by the window's exact maximum.

Memory is bounded: the window is kept as :data:`SLOTS` time slots (one second each for the default 60 s
window), each a sparse histogram of at most :data:`BUCKETS` + 1 counts, so the window forgets a sample
between ``window`` and ``window * (1 + 1 / SLOTS)`` after it was recorded.

A state change into ``violated`` emits one :class:`SlaViolation` of kind ``violation``; the first return
to ``ok`` after it emits one of kind ``recovery``. A worker evaluates the changes of the partitions it
owns: with several workers, each one reports its own share (``worker`` in the state and the events).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

P99 = 0.99
MIN_BUCKET_MS = 0.1
"""Upper bound of the first histogram bucket; lower lags (and negative ones, from clock skew) go there."""
GROWTH = 2 ** (1 / 16)
"""Ratio of consecutive bucket bounds: the reported percentiles are at most ``GROWTH - 1`` (4.43 %) high."""
MAX_BUCKET_MS = 3_600_000.0
BUCKETS = math.ceil(math.log(MAX_BUCKET_MS / MIN_BUCKET_MS, GROWTH)) + 1
BOUNDS: tuple[float, ...] = tuple(MIN_BUCKET_MS * GROWTH**i for i in range(BUCKETS))
"""Upper bounds (inclusive) of the buckets; a lag above the last bound goes to an overflow bucket."""
SLOTS = 60

TargetName = Literal["p99_lag", "consistency_window", "heartbeat", "backlog_age"]
Status = Literal["ok", "violated", "no_data"]


class SlaSettings(BaseSettings):
    """The promises: how far behind the database the caches may be, and how that is judged."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_SLA_", extra="ignore")

    p99_lag_ms: float = Field(200.0, gt=0, description="Target for the p99 of commit-to-cache lag.")
    window_ms: float = Field(
        1500.0, gt=0, description="Consistency window: changes must be visible in every tier within it."
    )
    window_fraction: float = Field(
        0.9999, gt=0, le=1, description="Share of changes that must be visible within window_ms."
    )
    evaluation_window_s: float = Field(60.0, gt=0, description="Sliding window the targets are judged on.")
    evaluation_interval_s: float = Field(1.0, gt=0, description="How often the worker evaluates.")
    violations_topic: str = Field("freshkey.sla-violations", description="Where violations are published.")
    namespaces: tuple[str, ...] = Field(
        (), description="Namespaces whose lag counts (JSON list); empty: all of them."
    )


def bucket_of(lag_ms: float) -> int:
    """Index of the bucket holding ``lag_ms``: bucket i holds (BOUNDS[i-1], BOUNDS[i]]."""
    return bisect.bisect_left(BOUNDS, lag_ms)


def quantile_from_buckets(counts: Mapping[int, int], q: float, *, max_ms: float) -> float | None:
    """Nearest-rank ``q`` quantile from bucket counts, as the upper bound of its bucket (capped by max).

    ``None`` when there are no samples. See the module docstring for the error bound.
    """
    n = sum(counts.values())
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return min(BOUNDS[index], max_ms) if index < BUCKETS else max_ms
    raise AssertionError("unreachable: the counts add up to n")  # pragma: no cover


class TargetState(BaseModel):
    """One target as last evaluated. ``threshold`` and ``measured`` are in ``unit``."""

    model_config = ConfigDict(frozen=True)

    name: TargetName
    status: Status
    threshold: float
    measured: float | None
    unit: Literal["ms", "fraction"]
    since_ms: int = Field(description="When this target entered its status, ms since the epoch.")
    detail: str


class SlaViolation(BaseModel):
    """A transition of a worker's SLA state: into violation, or the recovery from one."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["violation", "recovery"]
    at_ms: int = Field(description="When the evaluator saw the transition, ms since the epoch.")
    worker: str
    violated: tuple[TargetName, ...] = Field(
        description="Targets violated at a violation; the targets that had been violated, at a recovery."
    )
    since_ms: int = Field(
        description="When the violation began (for a recovery: its duration is at - since)."
    )
    samples: int
    evaluation_window_s: float
    targets: tuple[TargetState, ...]
    message: str

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))


class SlaState(BaseModel):
    """A worker's SLA state: served at ``/freshkey/sla`` and read by ``freshkey sla``."""

    model_config = ConfigDict(frozen=True)

    status: Status = Field(description="violated if any target is; else ok if any is; else no_data.")
    since_ms: int
    evaluated_at_ms: int
    worker: str
    evaluation_window_s: float
    samples: int = Field(description="Precise lag samples in the window.")
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    within_window_fraction: float | None
    targets: tuple[TargetState, ...]
    violations: int = Field(description="Violation events since the worker started.")
    last_event: SlaViolation | None
    backlog_age_ms: float | None = Field(
        None,
        description="How long the oldest change waiting on this worker's partitions of the change topic "
        "has waited, at least (0: caught up; None: not known, or not reported by this worker).",
    )
    unknown_partitions: int | None = Field(
        None,
        description="Partitions of the change topic this worker should know about but has no figure for "
        "(see /freshkey/consumer-lag); None: consumer progress not reported by this worker.",
    )

    @property
    def violated(self) -> bool:
        return self.status == "violated"


# -- consumer progress: how long changes wait on the change topic -------------------------------------

PartitionState = Literal["caught_up", "behind", "stalled", "unknown"]
OBSERVATIONS_PER_PARTITION = 256
"""Bound on the (high watermark, time) observations kept per partition (see :class:`ConsumerProgress`)."""


class PartitionProgress(BaseModel):
    """One partition of the change topic as this worker sees it: a value of ``/freshkey/consumer-lag``.

    ``state``: ``caught_up`` (nothing waits), ``behind`` (changes wait, the oldest for at most the
    consistency window), ``stalled`` (the oldest waits longer than the window) or ``unknown`` (this worker
    has no figure: not assigned to it, or no acknowledged position or high watermark yet). ``lag`` and
    ``age_ms`` are this worker's figures and are null whenever the state is unknown; for a partition not
    assigned here, ``group_lag`` and ``group_age_ms`` say what the worker group's committed offset shows.
    """

    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int | None = Field(description="None only while the topic's partitions are not known at all.")
    state: PartitionState
    assigned: bool = Field(description="Assigned to this worker now.")
    lag: int | None = Field(
        description="Messages not yet acknowledged here: highwater - acked_offset - 1; null: unknown."
    )
    age_ms: float | None = Field(
        description="How long the oldest of them has been waiting, at least (0: caught up; null: unknown)."
    )
    acked_offset: int | None = Field(
        description="Every offset up to this one is applied (acknowledged here, or committed by the group)."
    )
    highwater: int | None = Field(description="Offset of the next message to be written, as last seen.")
    committed_offset: int | None = Field(
        description="The worker group's committed offset (the next one to consume), as last read."
    )
    group_lag: int | None = Field(
        None, description="Not assigned here: highwater - committed_offset (not committed by the group)."
    )
    group_age_ms: float | None = Field(
        None,
        description="Not assigned here: how long the oldest message above the group's committed offset had "
        "been waiting, at least, when that offset was read.",
    )
    unknown_ms: float | None = Field(
        None, description="Assigned here but unknown: for how long (it counts against the SLA after a grace)."
    )
    reason: str | None = Field(None, description="Why the state is unknown.")

    @property
    def key(self) -> str:
        """``topic/partition``, the key of this row in ``/freshkey/consumer-lag``."""
        return f"{self.topic}/{'?' if self.partition is None else self.partition}"


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """What :meth:`ConsumerProgress.snapshot` saw at ``at_ms``.

    ``partitions``: the partitions of the change topic assigned to this worker, or, while none is, every
    partition of the topic it knows of (all ``unknown``); never empty. ``unassigned_ms``: how long no
    partition of the topic has been assigned here (None while one is).
    """

    at_ms: float
    topic: str
    window_ms: float
    grace_ms: float
    partitions: tuple[PartitionProgress, ...]
    unassigned_ms: float | None

    @property
    def unknown(self) -> int:
        """How many of ``partitions`` have no figure."""
        return sum(p.state == "unknown" for p in self.partitions)

    @property
    def oldest_ms(self) -> float | None:
        """The age of the oldest waiting change on the assigned partitions whose age is known."""
        ages = [p.age_ms for p in self.partitions if p.assigned and p.age_ms is not None]
        return max(ages) if ages else None


@dataclass(slots=True)
class _Figures:
    """What is known of one partition. Offsets follow Kafka: a position or high watermark is the next
    offset (to acknowledge, to be written)."""

    position: int | None = None
    """Every offset below it is applied: acknowledged here or committed by the group. None: unknown."""
    high: int | None = None
    """The highest known end of the log: a broker's figure, or past a message received or acknowledged."""
    high_seen: bool = False
    """A broker's high watermark arrived (``high`` from messages alone says nothing of what follows them)."""
    committed: int | None = None
    committed_at_ms: float | None = None
    assigned_since_ms: float | None = None
    fresh: bool = True
    """Nothing received since the (re)assignment: the first message received is where the consumer started."""
    floor: int | None = None
    """Assigned with no position: the high watermark then; offsets from here on came later, unacknowledged."""
    seen: list[tuple[int, float]] = field(default_factory=list)
    """(high watermark, ms): every offset below ``high`` existed at that time. Both strictly increasing
    (a Pareto frontier: an observation another one beats on both counts is dropped)."""

    def observe(self, high: int, at_ms: float) -> None:
        seen = self.seen
        i = bisect.bisect_left(seen, high, key=lambda o: o[0])
        if i < len(seen) and seen[i][1] <= at_ms:
            return  # already known: at least these offsets existed earlier
        j = i + 1 if i < len(seen) and seen[i][0] == high else i
        k = bisect.bisect_left(seen, at_ms, lo=0, hi=i, key=lambda o: o[1])
        seen[k:j] = [(high, at_ms)]
        if len(seen) > OBSERVATIONS_PER_PARTITION:
            # Dropping the second newest makes the offsets it covered look younger (the next observation
            # is later): ages stay lower bounds, never inflated.
            del seen[-2]

    def existed_at(self, offset: int) -> float | None:
        """The earliest time ``offset`` is known to have existed (been written), or None."""
        i = bisect.bisect_right(self.seen, offset, key=lambda o: o[0])
        return self.seen[i][1] if i < len(self.seen) else None

    def advance(self, position: int) -> None:
        if self.position is None or position > self.position:
            self.position = position
        if self.high is None or self.position > self.high:
            self.high = self.position  # offsets below a position exist: the log's end is at least there
        del self.seen[: bisect.bisect_right(self.seen, self.position, key=lambda o: o[0])]


class ConsumerProgress:
    """How far this worker is behind on the change topic, in messages and in time, partition by partition.

    The worker (``pipeline/worker.py``) feeds it: :meth:`on_received` for every message its agent
    receives, :meth:`on_offset` (an ApplyObserver call) for every one it acknowledges,
    :meth:`set_assignment` with the change topic's partitions assigned to it, :meth:`set_high_watermarks`
    and, optionally, :meth:`set_committed` (the group's committed offsets, read from the broker) every
    ``refresh_interval_s``.

    What it guarantees. The *age* of a partition is how long its oldest unacknowledged message has been
    waiting, and it is a lower bound, never inflated: a message is known to exist from the earliest of
    its Kafka timestamp (capped by the time it was received) and the first time a high watermark above
    its offset was seen; messages are written in offset order, so each such sighting dates every lower
    offset too. A partition whose high watermark is above the acknowledged position has therefore been
    waiting at least since the oldest unacknowledged message was received, or, not fetched yet, since
    the high watermark was first seen above the position. A worker that acknowledges nothing while
    changes wait (its agent crashed, a tier refuses writes) shows a growing age, with or without lag
    samples or heartbeats.

    A partition this worker should know about but has no figure for is ``unknown``, never "caught up":
    while nothing of the topic is assigned here, every partition of it (``partitions``, plus any one seen);
    once some are, those without a position or a high watermark. :class:`SlaEvaluator` counts them
    against the ``backlog_age`` target after ``grace_ms`` (the window plus one refresh interval: figures
    arrive once per interval, so a shorter absence cannot be told from a slow refresh).

    Thread-safe: fed on the event loop, read by the Prometheus scrape thread too.
    """

    def __init__(
        self,
        topic: str,
        *,
        partitions: int | None = None,
        window_ms: float = 1500.0,
        refresh_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if partitions is not None and partitions < 1:
            raise ValueError(f"partitions={partitions}: a topic has at least one partition")
        if window_ms <= 0 or refresh_interval_s <= 0:
            raise ValueError("window_ms and refresh_interval_s must be positive")
        self.topic = topic
        self.window_ms = window_ms
        self.grace_ms = window_ms + refresh_interval_s * 1000
        self.clock = clock
        self._lock = threading.Lock()
        self._parts: dict[int, _Figures] = {p: _Figures() for p in range(partitions or 0)}
        self._assigned: frozenset[int] = frozenset()
        self._ever_assigned = False
        self._unassigned_since_ms = self._now_ms()

    def _now_ms(self) -> float:
        return self.clock() * 1000

    def _part(self, partition: int) -> _Figures:
        figures = self._parts.get(partition)
        if figures is None:
            figures = self._parts[partition] = _Figures()
        return figures

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_event(self, kind: str) -> None:
        pass

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        pass

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        pass

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        """The worker acknowledged ``offset`` (every tier took it): the position moves past it."""
        if topic != self.topic or partition < 0 or offset < 0:
            return
        with self._lock:
            figures = self._part(partition)
            figures.fresh = False
            figures.advance(offset + 1)

    # -- what the worker feeds ------------------------------------------------------------------------
    def on_received(self, topic: str, partition: int, offset: int, timestamp_ms: float | None) -> None:
        """The agent received this message (before applying it). ``timestamp_ms``: its Kafka timestamp."""
        if topic != self.topic or partition < 0 or offset < 0:
            return
        now = self._now_ms()
        # A timestamp from a clock ahead of this one would make the message look younger than its receipt.
        existed = now if timestamp_ms is None or not math.isfinite(timestamp_ms) else min(timestamp_ms, now)
        with self._lock:
            figures = self._part(partition)
            if figures.fresh:
                # The consumer starts a (re)assigned partition at the group's committed offset: everything
                # below the first message received was applied (here or by the worker that had it).
                figures.fresh = False
                figures.advance(offset)
            if figures.high is None or offset + 1 > figures.high:
                figures.high = offset + 1
            if figures.position is None or offset >= figures.position:
                figures.observe(offset + 1, existed)

    def set_assignment(self, partitions: Iterable[int]) -> None:
        """The change topic's partitions assigned to this worker now (empty: none, or not joined yet)."""
        now = self._now_ms()
        with self._lock:
            assigned = frozenset(p for p in partitions if p >= 0)
            for p in assigned - self._assigned:
                figures = self._part(p)
                figures.assigned_since_ms = now
                figures.fresh = True
                figures.floor = figures.high if figures.position is None else None
            for p in self._assigned - assigned:
                self._part(p).assigned_since_ms = None
            if assigned and not self._assigned:
                self._ever_assigned = True
            elif self._assigned and not assigned:
                self._unassigned_since_ms = now
            self._assigned = assigned

    def set_high_watermarks(self, highs: Mapping[int, int | None]) -> None:
        """The latest high watermarks (next offset to be written) of any partitions of the change topic.

        A figure lower than one seen before is ignored: a high watermark only grows, and some brokers
        answer ListOffsets with less than the log end (Tansu, measured here: the last batch's base
        offset + 1), so the highest figure from any source is the best one.
        """
        now = self._now_ms()
        with self._lock:
            for p, high in highs.items():
                if p < 0 or high is None or high < 0:
                    continue
                figures = self._part(p)
                figures.high_seen = True
                if figures.high is not None and high <= figures.high:
                    continue
                figures.high = high
                if figures.position is None and high == 0:
                    figures.advance(0)  # an empty partition: nothing to wait for
                if figures.position is None and p in self._assigned and figures.floor is None:
                    figures.floor = high
                elif figures.position is None or high > figures.position:
                    figures.observe(high, now)

    def set_committed(self, offsets: Mapping[int, int | None]) -> None:
        """The worker group's committed offsets (the next offset to consume; None or < 0: none yet)."""
        now = self._now_ms()
        with self._lock:
            for p, committed in offsets.items():
                if p < 0:
                    continue
                figures = self._part(p)
                if committed is None or committed < 0:
                    figures.committed = None
                    continue
                figures.committed, figures.committed_at_ms = committed, now
                figures.advance(committed)

    # -- what it answers ------------------------------------------------------------------------------
    def snapshot(self) -> ConsumerSnapshot:
        """Every partition of the change topic this worker should know about, as of now."""
        now = self._now_ms()
        with self._lock:
            if self._assigned:
                rows = [self._assigned_row(p, self._parts[p], now) for p in sorted(self._assigned)]
                unassigned_ms = None
            else:
                rows = [self._unassigned_row(p, self._parts[p]) for p in sorted(self._parts)]
                unassigned_ms = now - self._unassigned_since_ms
            if not rows:
                rows = [
                    PartitionProgress(
                        topic=self.topic,
                        partition=None,
                        state="unknown",
                        assigned=False,
                        lag=None,
                        age_ms=None,
                        acked_offset=None,
                        highwater=None,
                        committed_offset=None,
                        reason="the topic's partitions are not known yet",
                    )
                ]
        return ConsumerSnapshot(now, self.topic, self.window_ms, self.grace_ms, tuple(rows), unassigned_ms)

    def _assigned_row(self, p: int, f: _Figures, now: float) -> PartitionProgress:
        common: dict[str, Any] = {
            "topic": self.topic,
            "partition": p,
            "assigned": True,
            "acked_offset": None if f.position is None else f.position - 1,
            "highwater": f.high if f.high_seen else None,
            "committed_offset": f.committed,
        }
        if f.high_seen and f.high is not None and f.position is not None:
            lag = max(0, f.high - f.position)
            waited = self._age(f, f.position, now) if lag else 0.0
            state: PartitionState = (
                "caught_up" if not lag else "stalled" if waited > self.window_ms else "behind"
            )
            return PartitionProgress(state=state, lag=lag, age_ms=round(waited, 3), **common)
        unknown_ms = now - (f.assigned_since_ms if f.assigned_since_ms is not None else now)
        # Even without a figure, some messages may be proven to wait: received and not acknowledged, or
        # written (seen in a high watermark) after the assignment while nothing was acknowledged.
        age: float | None = None
        if f.high is not None and f.position is not None and f.high > f.position:
            age = round(self._age(f, f.position, now), 3)
        elif f.position is None and f.floor is not None and f.high is not None and f.high > f.floor:
            age = round(self._age(f, f.floor, now), 3)
        if not f.high_seen:
            reason = "assigned, no high watermark yet"
        else:
            reason = (
                "assigned, no acknowledged position yet (nothing received or acknowledged since the "
                "assignment, and the group's committed offset is not known)"
            )
        return PartitionProgress(
            state="unknown", lag=None, age_ms=age, unknown_ms=round(unknown_ms, 3), reason=reason, **common
        )

    @staticmethod
    def _age(f: _Figures, offset: int, now: float) -> float:
        existed = f.existed_at(offset)
        return max(0.0, now - existed) if existed is not None else 0.0

    def _unassigned_row(self, p: int, f: _Figures) -> PartitionProgress:
        group_lag = group_age = None
        if f.committed is not None and f.high is not None and f.high_seen:
            group_lag = max(0, f.high - f.committed)
            group_age = 0.0
            existed = f.existed_at(f.committed) if group_lag else None
            if existed is not None and f.committed_at_ms is not None:
                # Proven only up to the read of the committed offset: it may have moved on since.
                group_age = round(max(0.0, f.committed_at_ms - existed), 3)
        reason = "not assigned to this worker" + ("" if self._ever_assigned else " yet (joining the group)")
        return PartitionProgress(
            topic=self.topic,
            partition=p,
            state="unknown",
            assigned=False,
            lag=None,
            age_ms=None,
            acked_offset=None if f.committed is None else f.committed - 1,
            highwater=f.high if f.high_seen else None,
            committed_offset=f.committed,
            group_lag=group_lag,
            group_age_ms=group_age,
            reason=reason,
        )

    def rows(self) -> list[dict[str, Any]]:
        """The partitions as JSON objects, in partition order (the dashboard's consumer-lag card)."""
        return [row.model_dump(mode="json") for row in self.snapshot().partitions]

    def report(self) -> dict[str, dict[str, Any]]:
        """The body of ``/freshkey/consumer-lag``: ``{"topic/partition": PartitionProgress JSON}``.

        Only the change topic; never empty: a worker that knows nothing yet lists every partition (or,
        partition count unknown, ``"topic/?"``) as unknown. For example, before and after the group join::

            {"freshkey.changes/0": {"topic": "freshkey.changes", "partition": 0, "state": "unknown",
              "assigned": false, "lag": null, "age_ms": null, "acked_offset": 61999,
              "highwater": 124000, "committed_offset": 62000, "group_lag": 62000,
              "group_age_ms": 5012.0, "unknown_ms": null,
              "reason": "not assigned to this worker yet (joining the group)"}, ...}
            {"freshkey.changes/0": {"topic": "freshkey.changes", "partition": 0, "state": "stalled",
              "assigned": true, "lag": 3, "age_ms": 2210.5, "acked_offset": 123996,
              "highwater": 124000, "committed_offset": 123990, "group_lag": null,
              "group_age_ms": null, "unknown_ms": null, "reason": null}, ...}

        ``lag`` null means unknown, never "caught up"; a reader that wants one number per partition
        takes ``lag`` and treats null as "behind by an unknown amount".
        """
        return {row.key: row.model_dump(mode="json") for row in self.snapshot().partitions}

    def consumer_lag(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> messages not yet acknowledged, for the partitions with a known lag only."""
        return {
            (row.topic, row.partition): row.lag
            for row in self.snapshot().partitions
            if row.partition is not None and row.lag is not None
        }

    def ages(self) -> dict[tuple[str, int], float]:
        """(topic, partition) -> age in ms of the oldest waiting change, where this worker knows it."""
        return {
            (row.topic, row.partition): row.age_ms
            for row in self.snapshot().partitions
            if row.partition is not None and row.assigned and row.age_ms is not None
        }


@dataclass(slots=True)
class _Slot:
    start: float
    counts: dict[int, int] = field(default_factory=dict)
    n: int = 0
    within_p99: int = 0
    within_window: int = 0
    max_ms: float = -math.inf


class SlaEvaluator:
    """An :class:`~pipeline.observe.ApplyObserver` that judges the lag samples against the targets.

    ``progress`` (the worker's :class:`ConsumerProgress` of the change topic) is what the ``backlog_age``
    target judges; without it that target is ``no_data``. Its window must be the SLA's.

    ``clock`` returns seconds since the epoch (``time.time``); tests pass their own. Not thread-safe: the
    worker feeds and evaluates it on its event loop.
    """

    def __init__(
        self,
        settings: SlaSettings,
        *,
        worker: str = "",
        heartbeat_namespace: str | None = None,
        heartbeat_interval_ms: float = 500.0,
        progress: ConsumerProgress | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if progress is not None and progress.window_ms != settings.window_ms:
            raise ValueError(
                f"ConsumerProgress(window_ms={progress.window_ms:g}) differs from FRESHKEY_SLA_WINDOW_MS "
                f"({settings.window_ms:g}): build it with window_ms=settings.window_ms"
            )
        self.settings = settings
        self.progress = progress
        self.worker = worker
        self.heartbeat_namespace = heartbeat_namespace
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.clock = clock
        self._slot_s = settings.evaluation_window_s / SLOTS
        self._slots: deque[_Slot] = deque()
        self._namespaces = frozenset(settings.namespaces)
        self._last_heartbeat_commit_ms: float | None = None
        started = self._now_ms()
        self._status: Status = "no_data"
        self._since_ms = started
        self._target_since: dict[TargetName, tuple[Status, int]] = {}
        self._violation_since_ms: int | None = None
        self._violated_targets: tuple[TargetName, ...] = ()
        self.violations = 0
        self.last_event: SlaViolation | None = None
        self.state: SlaState = self._evaluate_state(started)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_event(self, kind: str) -> None:
        pass

    def on_outcome(self, tier: str, namespace: str, outcome: str) -> None:
        pass

    def on_applied(
        self, namespace: str, op: str, lag_ms: float, *, coarse: bool, stages: Mapping[str, float]
    ) -> None:
        if coarse:
            return
        if namespace == self.heartbeat_namespace:
            self._last_heartbeat_commit_ms = max(
                self._last_heartbeat_commit_ms or -math.inf, self.clock() * 1000 - lag_ms
            )
        if self._namespaces and namespace not in self._namespaces:
            return
        self.record(lag_ms)

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        pass

    # -- samples and evaluation -----------------------------------------------------------------------
    def record(self, lag_ms: float, *, at: float | None = None) -> None:
        """Count one precise commit-to-cache lag, applied at ``at`` (default: now, from ``clock``)."""
        now = self.clock() if at is None else at
        slot = self._slots[-1] if self._slots else None
        if slot is None or now >= slot.start + self._slot_s:
            slot = _Slot(start=now - (now % self._slot_s))
            self._slots.append(slot)
            self._forget_before(now - self.settings.evaluation_window_s)
        index = bucket_of(lag_ms)
        slot.counts[index] = slot.counts.get(index, 0) + 1
        slot.n += 1
        slot.within_p99 += lag_ms <= self.settings.p99_lag_ms
        slot.within_window += lag_ms <= self.settings.window_ms
        slot.max_ms = max(slot.max_ms, lag_ms)

    def _forget_before(self, horizon: float) -> None:
        while self._slots and self._slots[0].start + self._slot_s <= horizon:
            self._slots.popleft()

    def evaluate(self) -> tuple[SlaState, list[SlaViolation]]:
        """Judge the window as of now; returns the new state and the transition events (0 or 1)."""
        now_ms = self._now_ms()
        self._forget_before(now_ms / 1000 - self.settings.evaluation_window_s)
        self.state = self._evaluate_state(now_ms)
        events: list[SlaViolation] = []
        violated = tuple(t.name for t in self.state.targets if t.status == "violated")
        if self.state.status == "violated" and self._violation_since_ms is None:
            self._violation_since_ms = now_ms
            self._violated_targets = violated
            self.violations += 1
            events.append(self._event("violation", violated, now_ms))
        elif self.state.status == "violated":
            self._violated_targets = tuple(dict.fromkeys((*self._violated_targets, *violated)))
        elif self.state.status == "ok" and self._violation_since_ms is not None:
            events.append(self._event("recovery", self._violated_targets, now_ms))
            self._violation_since_ms = None
            self._violated_targets = ()
        if events:
            self.last_event = events[-1]
            self.state = self.state.model_copy(
                update={"last_event": self.last_event, "violations": self.violations}
            )
        return self.state, events

    def _event(
        self, kind: Literal["violation", "recovery"], violated: tuple[TargetName, ...], now_ms: int
    ) -> SlaViolation:
        since = self._violation_since_ms if self._violation_since_ms is not None else now_ms
        details = "; ".join(t.detail for t in self.state.targets if t.name in violated)
        if kind == "violation":
            message = f"SLA violated on {self.worker or 'this worker'}: {details}"
        else:
            message = (
                f"SLA met again on {self.worker or 'this worker'} after {(now_ms - since) / 1000:.1f} s "
                f"({', '.join(violated)})"
            )
        return SlaViolation(
            kind=kind,
            at_ms=now_ms,
            worker=self.worker,
            violated=violated,
            since_ms=since,
            samples=self.state.samples,
            evaluation_window_s=self.settings.evaluation_window_s,
            targets=self.state.targets,
            message=message,
        )

    def _target(
        self,
        name: TargetName,
        status: Status,
        threshold: float,
        measured: float | None,
        unit: Literal["ms", "fraction"],
        detail: str,
        now_ms: int,
    ) -> TargetState:
        previous = self._target_since.get(name)
        if previous is None or previous[0] != status:
            previous = (status, now_ms)
            self._target_since[name] = previous
        return TargetState(
            name=name,
            status=status,
            threshold=threshold,
            measured=measured,
            unit=unit,
            since_ms=previous[1],
            detail=detail,
        )

    def _evaluate_state(self, now_ms: int) -> SlaState:
        s = self.settings
        counts: dict[int, int] = {}
        n = within_p99 = within_window = 0
        max_ms = -math.inf
        for slot in self._slots:
            for index, count in slot.counts.items():
                counts[index] = counts.get(index, 0) + count
            n += slot.n
            within_p99 += slot.within_p99
            within_window += slot.within_window
            max_ms = max(max_ms, slot.max_ms)
        p50 = quantile_from_buckets(counts, 0.5, max_ms=max_ms)
        p99 = quantile_from_buckets(counts, P99, max_ms=max_ms)
        fraction = within_window / n if n else None
        window = f"last {s.evaluation_window_s:g} s"
        targets: list[TargetState] = []
        if n == 0:
            targets.append(
                self._target("p99_lag", "no_data", s.p99_lag_ms, None, "ms", f"no samples ({window})", now_ms)
            )
            targets.append(
                self._target(
                    "consistency_window", "no_data", s.window_fraction, None, "fraction", "no samples", now_ms
                )
            )
        else:
            p99_ok = within_p99 >= math.ceil(P99 * n)
            targets.append(
                self._target(
                    "p99_lag",
                    "ok" if p99_ok else "violated",
                    s.p99_lag_ms,
                    p99,
                    "ms",
                    f"p99 lag {p99:.1f} ms {'<=' if p99_ok else '>'} {s.p99_lag_ms:g} ms "
                    f"({n} samples, {window})",
                    now_ms,
                )
            )
            assert fraction is not None
            window_ok = fraction >= s.window_fraction
            targets.append(
                self._target(
                    "consistency_window",
                    "ok" if window_ok else "violated",
                    s.window_fraction,
                    fraction,
                    "fraction",
                    f"{fraction:.4%} of {n} changes within {s.window_ms:g} ms "
                    f"(target {s.window_fraction:.4%}, {window})",
                    now_ms,
                )
            )
        targets.append(self._heartbeat_target(now_ms))
        snapshot = self.progress.snapshot() if self.progress is not None else None
        targets.append(self._backlog_target(snapshot, now_ms))
        statuses = {t.status for t in targets}
        status: Status = "violated" if "violated" in statuses else "ok" if "ok" in statuses else "no_data"
        if status != self._status:
            self._status, self._since_ms = status, now_ms
        return SlaState(
            status=status,
            since_ms=self._since_ms,
            evaluated_at_ms=now_ms,
            worker=self.worker,
            evaluation_window_s=s.evaluation_window_s,
            samples=n,
            p50_ms=p50,
            p99_ms=p99,
            max_ms=max_ms if n else None,
            within_window_fraction=fraction,
            targets=tuple(targets),
            violations=self.violations,
            last_event=self.last_event,
            backlog_age_ms=snapshot.oldest_ms if snapshot is not None else None,
            unknown_partitions=snapshot.unknown if snapshot is not None else None,
        )

    def _heartbeat_target(self, now_ms: int) -> TargetState:
        s = self.settings
        if self.heartbeat_namespace is None or self._last_heartbeat_commit_ms is None:
            why = "no heartbeat binding" if self.heartbeat_namespace is None else "no heartbeat applied yet"
            return self._target("heartbeat", "no_data", s.window_ms, None, "ms", why, now_ms)
        # The heartbeat after the last applied one was committed about one interval later and is not in
        # the cache yet: it has been waiting at least this long.
        overdue_ms = max(0.0, now_ms - self._last_heartbeat_commit_ms - self.heartbeat_interval_ms)
        ok = overdue_ms <= s.window_ms
        detail = (
            f"next heartbeat of {self.heartbeat_namespace} waiting {overdue_ms:.0f} ms "
            f"({'<=' if ok else '>'} {s.window_ms:g} ms)"
        )
        if not ok:
            detail += ": the pipeline is stalled, or the heartbeat prober stopped"
        return self._target(
            "heartbeat", "ok" if ok else "violated", s.window_ms, overdue_ms, "ms", detail, now_ms
        )

    def _backlog_target(self, snapshot: ConsumerSnapshot | None, now_ms: int) -> TargetState:
        """``backlog_age``: violated when a change waits on this worker's partitions longer than the
        window, when an assigned partition stays unknown past the grace, or when no partition is assigned
        past the grace while changes wait on the topic (or whether they do cannot be told)."""
        window = self.settings.window_ms

        def target(status: Status, measured: float | None, detail: str) -> TargetState:
            return self._target("backlog_age", status, window, measured, "ms", detail, now_ms)

        if snapshot is None:
            return target("no_data", None, "consumer progress is not reported by this worker")
        rows, grace, topic = snapshot.partitions, snapshot.grace_ms, snapshot.topic
        problems: list[str] = []
        measured = [r.age_ms for r in rows if r.assigned and r.age_ms is not None]
        stalled = False
        for r in rows:
            if not r.assigned:
                continue
            if r.age_ms is not None and r.age_ms > window:
                stalled = True
                waiting = f"{r.lag} change(s)" if r.lag is not None else "changes"
                problems.append(f"{r.key}: {waiting} waiting, the oldest {r.age_ms / 1000:.1f} s")
            elif r.state == "unknown" and r.unknown_ms is not None and r.unknown_ms > grace:
                measured.append(r.unknown_ms)
                problems.append(f"{r.key} unknown for {r.unknown_ms / 1000:.1f} s ({r.reason})")
        if snapshot.unassigned_ms is not None and snapshot.unassigned_ms > grace:
            waiting_rows = [r for r in rows if r.group_age_ms is not None and r.group_age_ms > window]
            blind = [
                r for r in rows if r.highwater is None or (r.committed_offset is None and r.highwater > 0)
            ]
            if waiting_rows or blind:
                why = (
                    f"changes wait on {', '.join(r.key for r in waiting_rows)} (group offsets)"
                    if waiting_rows
                    else f"no figures for {', '.join(r.key for r in blind)} to tell whether changes wait"
                )
                measured.append(snapshot.unassigned_ms)
                problems.append(
                    f"no partition of {topic} assigned to this worker for "
                    f"{snapshot.unassigned_ms / 1000:.1f} s while {why}"
                )
            elif not problems:
                return target(
                    "ok",
                    0.0,
                    f"no partition of {topic} assigned to this worker for "
                    f"{snapshot.unassigned_ms / 1000:.1f} s; nothing waits (the group's committed offsets "
                    "are at the high watermarks)",
                )
        oldest = max(measured) if measured else None
        if problems:
            shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
            detail = f"{shown} (> {window:g} ms)"
            if stalled:
                detail += ": the worker acknowledges nothing while changes wait (stalled, or a tier refuses)"
            return target("violated", oldest, detail)
        if snapshot.unassigned_ms is not None:
            return target(
                "no_data",
                None,
                f"waiting for a partition of {topic} ({snapshot.unassigned_ms / 1000:.1f} s without one)",
            )
        unknown = [r for r in rows if r.state == "unknown"]
        if unknown:
            return target(
                "no_data", oldest, f"no figure yet for {', '.join(r.key for r in unknown)} (within the grace)"
            )
        lag = sum(r.lag or 0 for r in rows)
        return target(
            "ok",
            oldest,
            f"oldest waiting change {oldest or 0.0:.0f} ms (<= {window:g} ms); {lag} message(s) behind on "
            f"{len(rows)} partition(s) of {topic}",
        )
