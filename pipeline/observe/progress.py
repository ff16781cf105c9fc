"""Consumer progress: how far the worker is behind on the change topic, in messages and in time."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipeline.observe.partitions import (
    OBSERVATIONS_PER_PARTITION,
    ConsumerSnapshot,
    PartitionFigures,
    PartitionProgress,
    PartitionState,
)

__all__ = [
    "OBSERVATIONS_PER_PARTITION",
    "ConsumerProgress",
    "ConsumerSnapshot",
    "PartitionFigures",
    "PartitionProgress",
    "PartitionState",
]


class ConsumerProgress:
    """How far this worker is behind on the change topic, in messages and in time, partition by partition.

    The worker (``pipeline.agents.changes`` and ``pipeline.agents.sla``) feeds it: :meth:`on_received` for
    every message its agent receives, :meth:`on_offset` (an ApplyObserver call) for every one it acknowledges,
    :meth:`set_assignment` with the change topic's partitions assigned to it, :meth:`set_high_watermarks` and,
    optionally, :meth:`set_committed` (the group's committed offsets, read from the broker) every
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
        self._parts: dict[int, PartitionFigures] = {p: PartitionFigures() for p in range(partitions or 0)}
        self._assigned: frozenset[int] = frozenset()
        self._ever_assigned = False
        self._unassigned_since_ms = self._now_ms()

    def _now_ms(self) -> float:
        return self.clock() * 1000

    def _part(self, partition: int) -> PartitionFigures:
        figures = self._parts.get(partition)
        if figures is None:
            figures = self._parts[partition] = PartitionFigures()
        return figures

    # -- ApplyObserver --------------------------------------------------------------------------------
    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        """The worker acknowledged ``offset`` (every tier took it): the position moves past it."""
        if topic != self.topic or partition < 0 or offset < 0:
            return
        with self._lock:
            figures = self._part(partition)
            figures.fresh = False
            if figures.position is not None and offset + 1 < figures.position:
                figures.restart(offset + 1)
            else:
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

    def _assigned_row(self, p: int, f: PartitionFigures, now: float) -> PartitionProgress:
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
    def _age(f: PartitionFigures, offset: int, now: float) -> float:
        existed = f.existed_at(offset)
        return max(0.0, now - existed) if existed is not None else 0.0

    def _unassigned_row(self, p: int, f: PartitionFigures) -> PartitionProgress:
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
