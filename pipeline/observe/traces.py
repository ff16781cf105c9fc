"""Traces of the pipeline: one sampled cache action in ``every`` followed from its database commit to the
last tier.

A span ``freshkey.apply`` per traced batch, with one child ``freshkey.change`` per sampled action that
starts at the commit time and ends when every tier acknowledged it, carrying the namespace, a hash of the
cache key (never the key: keys hold user data), the version and each tier's outcome.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry import trace
from opentelemetry.trace import Tracer

from cache_writer import CacheAction
from pipeline.observe.report import BatchReport

_FITS = {
    "invalidate": frozenset({"tombstoned", "not_newer"}),
    "write": frozenset({"applied", "not_newer"}),
}


def _outcomes_by_action(actions: Sequence[CacheAction], reported: Sequence[str]) -> list[str] | None:
    """Each action's outcome in one tier, from that tier's outcomes in reporting order, or None.

    ``ChangeProcessor.apply`` sends a tier the batch's invalidations, then its writes, each group in
    batch order (a batch of one kind: simply batch order), and reports one outcome per action in that
    order. ``None`` when the reports do not fit that order (a count differs, or an invalidation would
    get "applied").
    """
    if len(reported) != len(actions):
        return None
    order = [i for i, a in enumerate(actions) if a.kind == "invalidate"]
    order += [i for i, a in enumerate(actions) if a.kind == "write"]
    by_action = [""] * len(actions)
    for position, index in enumerate(order):
        outcome = reported[position]
        if outcome not in _FITS[actions[index].kind]:
            return None
        by_action[index] = outcome
    return by_action


def key_hash(key: str) -> str:
    """A stable, short digest of a cache key for traces (the key itself may hold user data)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class _Binding(Protocol):
    @property
    def namespace(self) -> str: ...


class _Event(Protocol):
    @property
    def op(self) -> str: ...

    @property
    def ts_ms(self) -> int: ...


class PlannedChange(Protocol):
    """What the tracer needs of one planned change (``pipeline.processor.Planned`` is one)."""

    @property
    def binding(self) -> _Binding: ...

    @property
    def event(self) -> _Event: ...

    @property
    def actions(self) -> Sequence[CacheAction]: ...


@dataclass
class _BatchTrace:
    started_ns: int
    received_ms: float
    planned_ms: float
    changes: list[tuple[str, str, int, CacheAction]]
    """(namespace, op, connector read ms, action) of every action of the batch, in apply order."""
    sampled: list[int]
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    tier_done_ns: dict[str, int] = field(default_factory=dict)


class BatchTracer:
    """Traces one sampled action in ``every`` (0: none) of the batches applied inside
    :meth:`trace_batch`; :meth:`on_batch` gives it the batch's outcomes."""

    def __init__(self, tracer: Tracer, every: int = 100) -> None:
        self._tracer = tracer
        self.trace_sample_every = every
        self._sample_counter = 0
        self._batch: _BatchTrace | None = None

    def on_batch(self, report: BatchReport) -> None:
        batch = self._batch
        if batch is not None:
            batch.outcomes = {tier: list(sent) for tier, sent in report.tier_outcomes.items()}
            batch.tier_done_ns = {tier: int(ms * 1_000_000) for tier, ms in report.tier_done_ms.items()}

    @contextlib.contextmanager
    def trace_batch(
        self, planned: Sequence[PlannedChange], *, received_ms: float, planned_ms: float
    ) -> Iterator[None]:
        """Trace the sampled actions of one batch applied inside the ``with`` block.

        Outcomes are matched to actions by the worker's reporting order (see
        :func:`_outcomes_by_action`); a tier whose reports do not fit is left out of the spans.
        """
        every = self.trace_sample_every
        total = sum(len(p.actions) for p in planned)
        first = self._sample_counter
        self._sample_counter += total
        sampled = list(range((-first) % every, total, every)) if every > 0 else []
        if not sampled:
            yield
            return
        root = self._tracer.start_span(
            "freshkey.apply",
            attributes={"freshkey.batch.actions": total, "freshkey.batch.sampled": len(sampled)},
        )
        if not root.is_recording():  # no SDK tracer provider installed
            root.end()
            yield
            return
        changes = [(p.binding.namespace, p.event.op, p.event.ts_ms, a) for p in planned for a in p.actions]
        batch = _BatchTrace(time.time_ns(), received_ms, planned_ms, changes, sampled)
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None
            self._emit(root, batch, time.time_ns())

    def _emit(self, root: trace.Span, batch: _BatchTrace, ended_ns: int) -> None:
        context = trace.set_span_in_context(root)
        outcomes = {
            tier: by_action
            for tier, reported in batch.outcomes.items()
            if (by_action := _outcomes_by_action([c[3] for c in batch.changes], reported)) is not None
        }
        for index in batch.sampled:
            namespace, op, read_ms, action = batch.changes[index]
            attributes: dict[str, str | int | bool] = {
                "freshkey.namespace": namespace,
                "freshkey.key.hash": key_hash(action.key),
                "freshkey.version": str(action.version),
                "freshkey.op": op,
                "freshkey.action": action.kind,
            }
            for tier, outcome in outcomes.items():
                attributes[f"freshkey.outcome.{tier}"] = outcome[index]
            commit_ns = action.commit_ts_us * 1000
            span = self._tracer.start_span(
                "freshkey.change", context=context, start_time=min(commit_ns, ended_ns), attributes=attributes
            )
            span.add_event("read by connector", timestamp=int(read_ms * 1_000_000))
            span.add_event("received by worker", timestamp=int(batch.received_ms * 1_000_000))
            span.add_event("keys computed", timestamp=int(batch.planned_ms * 1_000_000))
            for tier, done_ns in batch.tier_done_ns.items():
                span.add_event(f"acknowledged by {tier}", timestamp=done_ns)
            span.end(end_time=ended_ns)
        root.end(end_time=ended_ns)
