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

Only precise lag samples count (a commit-time column in the binding, see :mod:`pipeline.plan`): a coarse
sample (the binlog's one-second clock) cannot tell 10 ms from 900 ms. Lag is measured against the
worker's clock, so clock skew between the database and the worker host adds to it.

How exact it is. The lag figures come from the worker's lag sketch (:mod:`pipeline.observe.sketch`),
the one ``/freshkey/stats`` and the dashboard read, over the evaluation window: the ``ceil(W)`` whole
seconds before the current one (``window_end_ms`` in the state). Both thresholds are exact bounds of the
sketch, so the *decisions* are exact over the samples in the window: "p99 <= T" holds exactly when at
least ``ceil(0.99 n)`` of the ``n`` samples are <= T (nearest rank), and the p99 reported beside it is
<= T exactly then (it is at most 4.43 % above the true p99, never below it).

A state change into ``violated`` emits one :class:`SlaViolation` of kind ``violation``; the first return
to ``ok`` after it emits one of kind ``recovery``. A worker evaluates the changes of the partitions it
owns: with several workers, each one reports its own share (``worker`` in the state and the events).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

from pipeline.observe.progress import ConsumerProgress, ConsumerSnapshot
from pipeline.observe.report import BatchReport
from pipeline.observe.sketch import LAG, P50, P99, LagSketch, rank
from pipeline.observe.sla_state import (
    SlaState,
    SlaViolation,
    Status,
    TargetName,
    TargetState,
    format_ms,
)
from pipeline.settings import SlaSettings

__all__ = [
    "SlaEvaluator",
    "SlaState",
    "SlaViolation",
    "Status",
    "TargetName",
    "TargetState",
    "format_ms",
]


class SlaEvaluator:
    """An :class:`~pipeline.observe.ApplyObserver` that judges the lag samples against the targets.

    The lag figures come from the worker's lag sketch (:meth:`attach`, done by ``Observers.add``; until
    then a sketch of its own, fed by nobody). ``progress`` (the worker's :class:`ConsumerProgress` of the
    change topic) is what the ``backlog_age`` target judges; without it that target is ``no_data``. Its
    window must be the SLA's.

    ``clock`` returns seconds since the epoch (``time.time``); tests pass their own (the sketch's clock
    should be the same). Not thread-safe: the worker feeds and evaluates it on its event loop.
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
        self.sketch = LagSketch(clock=clock)
        self.attach(self.sketch)
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
    def attach(self, sketch: LagSketch) -> None:
        """Judge the lag samples of ``sketch``: its thresholds become exact bounds, its windows include
        the evaluation window."""
        sketch.require_exact(self.settings.p99_lag_ms, self.settings.window_ms)
        sketch.add_window(self.settings.evaluation_window_s)
        self.sketch = sketch

    def on_batch(self, report: BatchReport) -> None:
        """Only the heartbeat: when the newest applied beat was committed (precise lags only)."""
        if self.heartbeat_namespace is None:
            return
        lags = report.lags.get(self.heartbeat_namespace)
        if lags is not None and len(lags):
            committed = report.at * 1000 - float(lags.min())
            self._last_heartbeat_commit_ms = max(self._last_heartbeat_commit_ms or -math.inf, committed)

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self) -> tuple[SlaState, list[SlaViolation]]:
        """Judge the window as of now; returns the new state and the transition events (0 or 1)."""
        now_ms = self._now_ms()
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
        reading = self.sketch.window(
            LAG, self._namespaces or None, seconds=s.evaluation_window_s, now=now_ms / 1000
        )
        n = reading.n
        p50, p99 = reading.quantile(P50), reading.quantile(P99)
        fraction = reading.at_most(s.window_ms) / n if n else None
        window = f"last {s.evaluation_window_s:g} s"
        targets: list[TargetState] = []
        if n == 0 or p99 is None or fraction is None:
            targets.append(
                self._target("p99_lag", "no_data", s.p99_lag_ms, None, "ms", f"no samples ({window})", now_ms)
            )
            targets.append(
                self._target(
                    "consistency_window", "no_data", s.window_fraction, None, "fraction", "no samples", now_ms
                )
            )
        else:
            # Exact: the threshold is a bound of the sketch, and p99 <= threshold exactly when this holds.
            p99_ok = reading.at_most(s.p99_lag_ms) >= rank(P99, n)
            targets.append(
                self._target(
                    "p99_lag",
                    "ok" if p99_ok else "violated",
                    s.p99_lag_ms,
                    p99,
                    "ms",
                    f"p99 lag {format_ms(p99, s.p99_lag_ms)} {'<=' if p99_ok else '>'} {s.p99_lag_ms:g} ms "
                    f"({n} samples, {window})",
                    now_ms,
                )
            )
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
            max_ms=reading.max if n else None,
            within_window_fraction=fraction,
            window_end_ms=None if reading.end is None else reading.end * 1000,
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
