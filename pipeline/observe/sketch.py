"""The lag sketch: the one aggregator of lag samples behind the stats page, the SLA, the dashboard and
the Prometheus histograms, so that the same window gives the same figure everywhere.

What it keeps. Samples (ms) per key ``(kind, name)``: :data:`LAG` (commit-to-cache lag of a namespace,
precise clock), :data:`COARSE` (the same, one-second binlog clock: counted and exported, never in a
percentile) and :data:`STAGE` (time spent in one stage of the path, see :mod:`pipeline.observe`). They
are kept in one-second slots, each a histogram, and in since-start totals. A batch is recorded at once
per key (one ``searchsorted`` and one ``bincount``; a few values are counted one by one, cheaper than
numpy's fixed cost), never with a call per change.

Buckets and percentiles: :mod:`pipeline.observe.buckets` (nearest rank, at most 4.43 % high, never
low; exact at the sketch's exact bounds: the Prometheus bucket bounds and the SLA thresholds).

Windows. "The last W s" as of ``now`` are the ``ceil(W)`` whole seconds before the current one,
``[floor(now) - ceil(W), floor(now))``: the current second, still filling, is left out, so every reading
made within one second (``/freshkey/stats``, the SLA evaluation, the dashboard) covers the same samples
and gives the same figures. A window is at most one second late.

Memory is bounded: slots older than ``retention_s`` are dropped, and a slot that is over holds, per key,
only the run of buckets its samples touched. Thread-safe (a lock): recorded and mostly read on the
worker's event loop, read by the Prometheus scrape thread too.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.observe.buckets import (
    BOUNDS,
    BUCKETS,
    GROWTH,
    MAX_BUCKET_MS,
    MIN_BUCKET_MS,
    P50,
    P99,
    BucketScheme,
    Cells,
    Reading,
    Values,
    rank,
)
from schemas.metrics import LAG_BUCKETS_MS, STAGE_BUCKETS_MS

__all__ = [
    "BOUNDS",
    "BUCKETS",
    "COARSE",
    "DEFAULT_WINDOWS_S",
    "EXPORT_BOUNDS_MS",
    "GROWTH",
    "LAG",
    "MAX_BUCKET_MS",
    "MIN_BUCKET_MS",
    "P50",
    "P99",
    "STAGE",
    "BucketScheme",
    "Key",
    "LagSketch",
    "Reading",
    "Values",
    "rank",
    "window_name",
]

LAG = "lag"
COARSE = "coarse"
STAGE = "stage"
Key = tuple[str, str]
"""``(kind, name)``: ``(LAG, namespace)``, ``(COARSE, namespace)`` or ``(STAGE, stage name)``."""

EXPORT_BOUNDS_MS: tuple[float, ...] = tuple(sorted({*LAG_BUCKETS_MS, *STAGE_BUCKETS_MS}))
"""Exact bounds of every sketch: the Prometheus histograms' bucket bounds (``schemas.metrics``)."""
DEFAULT_WINDOWS_S: tuple[float, ...] = (10.0, 60.0)
"""The windows every reader reports (the SLA adds its evaluation window)."""


def window_name(seconds: float | None) -> str:
    """``last_60s`` (``None``: ``since_start``): the key of a window in the JSON answers."""
    return "since_start" if seconds is None else f"last_{seconds:g}s"


SMALL_BATCH = 24
"""Up to this many values are counted one by one (cheaper than numpy's fixed cost per call)."""


@dataclass(slots=True)
class _Slot:
    t: int
    cells: dict[Key, Cells] = field(default_factory=dict)

    def close(self) -> None:
        """Nothing more is added: keep only the buckets touched."""
        self.cells = {key: cells.compacted() for key, cells in self.cells.items()}


class LagSketch:
    """The one lag aggregator (see the module docstring).

    ``exact_bounds_ms``: values that ``at_most`` counts exactly and that percentiles compare exactly
    against, besides :data:`EXPORT_BOUNDS_MS`; more can be required (:meth:`require_exact`) until the
    first sample. ``clock`` returns unix seconds (``time.time``); tests pass their own.
    """

    def __init__(
        self,
        *,
        exact_bounds_ms: Iterable[float] = (),
        retention_s: int = 900,
        windows_s: Iterable[float] = DEFAULT_WINDOWS_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if retention_s < 1:
            raise ValueError(f"retention_s={retention_s}: keep at least one second")
        self.scheme = BucketScheme((*EXPORT_BOUNDS_MS, *exact_bounds_ms))
        self._bounds = tuple(float(b) for b in self.scheme.bounds)
        self.retention_s = retention_s
        self.windows_s: tuple[float, ...] = ()
        for seconds in windows_s:
            self.add_window(seconds)
        self.clock = clock
        self._lock = threading.Lock()
        self._slots: deque[_Slot] = deque()
        self._by_t: dict[int, _Slot] = {}
        self._totals: dict[Key, Cells] = {}
        """Since start, in the order the keys were first recorded."""

    # -- configuration ------------------------------------------------------------------------------
    def require_exact(self, *bounds_ms: float) -> None:
        """Make ``bounds_ms`` exact bounds. Only before the first sample: a bucket already counted cannot
        be split (build the sketch with ``exact_bounds_ms`` then)."""
        missing = set(bounds_ms) - set(self.scheme.exact)
        if not missing:
            return
        with self._lock:
            if self._totals:
                raise ValueError(
                    f"the lag sketch already holds samples: {sorted(missing)} ms cannot become exact bounds "
                    "now; attach the SLA evaluator before the worker applies anything"
                )
            self.scheme = BucketScheme((*self.scheme.exact, *missing))
            self._bounds = tuple(float(b) for b in self.scheme.bounds)

    def retain(self, seconds: int) -> None:
        """Keep at least the last ``seconds`` seconds."""
        self.retention_s = max(self.retention_s, seconds)

    def add_window(self, seconds: float) -> None:
        """Report this window too (and keep the slots it needs)."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a window is a positive number of seconds, not {seconds!r}")
        self.windows_s = tuple(sorted({*self.windows_s, float(seconds)}))
        self.retain(math.ceil(seconds))

    # -- recording ----------------------------------------------------------------------------------
    def record(self, key: Key, values: Sequence[float] | Values, *, at: float | None = None) -> None:
        """Samples of ``key`` (ms) taken at ``at`` (unix s; default: now). NaN and infinities are dropped."""
        t = math.floor(self.clock() if at is None else at)
        if len(values) > SMALL_BATCH:
            v = np.asarray(values, dtype=np.float64).ravel()
            finite = np.isfinite(v)
            if not finite.all():
                v = v[finite]
            if v.size == 0:
                return
            counts = np.bincount(self.scheme.index(v), minlength=self.scheme.size)
            n, total, top = int(v.size), float(np.maximum(v, 0.0).sum()), float(v.max())
            with self._lock:
                for cells in self._cells(key, t):
                    cells.counts += counts
                    cells.n += n
                    cells.total += total
                    cells.max = max(cells.max, top)
            return
        bounds, buckets, total, top = self._bounds, [], 0.0, -math.inf
        for x in values.tolist() if isinstance(values, np.ndarray) else values:
            if math.isfinite(x):
                buckets.append(bisect.bisect_left(bounds, x))
                total += x if x > 0 else 0.0
                top = x if x > top else top
        n = len(buckets)
        if not n:
            return
        with self._lock:
            for cells in self._cells(key, t):
                for i in buckets:
                    cells.counts[i] += 1
                cells.n += n
                cells.total += total
                cells.max = max(cells.max, top)

    def record_repeated(self, key: Key, value: float, count: int, *, at: float | None = None) -> None:
        """``count`` samples of the same value (a stage the whole batch spent together)."""
        if count <= 0 or not math.isfinite(value):
            return
        t = math.floor(self.clock() if at is None else at)
        i = bisect.bisect_left(self._bounds, value)
        with self._lock:
            for cells in self._cells(key, t):
                cells.counts[i] += count
                cells.n += count
                cells.total += max(value, 0.0) * count
                cells.max = max(cells.max, value)

    def _cells(self, key: Key, t: int) -> tuple[Cells, Cells]:
        """The open cells of ``key`` for second ``t`` and since start (under the lock)."""
        slots = self._slots
        if not slots or t > slots[-1].t:
            if slots:
                slots[-1].close()
            slot = _Slot(t)
            slots.append(slot)
            self._by_t[t] = slot
            self._expire(t)
        # A wall clock stepped back adds to the newest slot.
        current = slots[-1].cells.get(key)
        if current is None:
            current = slots[-1].cells[key] = Cells(0, np.zeros(self.scheme.size, dtype=np.int64))
        total = self._totals.get(key)
        if total is None:
            total = self._totals[key] = Cells(0, np.zeros(self.scheme.size, dtype=np.int64))
        return current, total

    def _expire(self, now_s: int) -> None:
        while self._slots and self._slots[0].t < now_s - self.retention_s:
            del self._by_t[self._slots.popleft().t]

    # -- reading ------------------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        """The names of ``kind`` recorded since start, in the order they were first recorded."""
        with self._lock:
            return [name for k, name in self._totals if k == kind]

    def end(self, now: float | None = None) -> int:
        """Where the windows read at ``now`` end: the start of the current second (unix s)."""
        return math.floor(self.clock() if now is None else now)

    def window(
        self, kind: str, names: Collection[str] | None = None, *, seconds: float, now: float | None = None
    ) -> Reading:
        """The samples of ``kind`` (only ``names``; None: every name) in the last ``seconds`` at ``now``."""
        end = self.end(now)
        with self._lock:
            cells = [
                c
                for slot in self._window_slots(seconds, end)
                for (k, name), c in slot.cells.items()
                if k == kind and (names is None or name in names)
            ]
            return Reading.of(self.scheme, cells, seconds, end)

    def window_per_name(self, kind: str, *, seconds: float, now: float | None = None) -> dict[str, Reading]:
        """:meth:`window` of each name of ``kind`` with samples in the window, in one pass."""
        end = self.end(now)
        with self._lock:
            by_name: dict[str, list[Cells]] = {}
            for slot in self._window_slots(seconds, end):
                for (k, name), c in slot.cells.items():
                    if k == kind:
                        by_name.setdefault(name, []).append(c)
            order = [name for k, name in self._totals if k == kind and name in by_name]
            return {name: Reading.of(self.scheme, by_name[name], seconds, end) for name in order}

    def _window_slots(self, seconds: float, end: int) -> list[_Slot]:
        start = end - max(1, math.ceil(seconds - 1e-9))
        if end - start > len(self._by_t):
            return [s for s in self._slots if start <= s.t < end]
        return [slot for t in range(start, end) if (slot := self._by_t.get(t)) is not None]

    def second(self, t: int, kind: str, names: Collection[str] | None = None) -> Reading:
        """The samples of one second (``[t, t + 1)``)."""
        with self._lock:
            slot = self._by_t.get(t)
            cells = (
                []
                if slot is None
                else [
                    c for (k, name), c in slot.cells.items() if k == kind and (names is None or name in names)
                ]
            )
            return Reading.of(self.scheme, cells, 1, t + 1)

    def since_start(self, kind: str, names: Collection[str] | None = None) -> Reading:
        """Every sample of ``kind`` (only ``names``; None: every name) since the sketch was built."""
        with self._lock:
            cells = [
                c for (k, name), c in self._totals.items() if k == kind and (names is None or name in names)
            ]
            return Reading.of(self.scheme, cells, None, None)

    def since_start_per_name(self, kind: str) -> dict[str, Reading]:
        """:meth:`since_start` of each name of ``kind``, in the order first recorded."""
        with self._lock:
            return {
                name: Reading.of(self.scheme, [c], None, None)
                for (k, name), c in self._totals.items()
                if k == kind
            }

    def seconds(self, since: int | None = None) -> list[int]:
        """The seconds (unix) with samples still held, from ``since`` on, oldest first."""
        with self._lock:
            return [s.t for s in self._slots if since is None or s.t >= since]

    def cumulative(self, kind: str, bounds: Sequence[float]) -> list[tuple[str, list[int], int, float]]:
        """Per name of ``kind``, since start: the counts ``<= b`` for each exact bound ``b``, the count and
        the sum (negative samples as 0): a cumulative Prometheus histogram."""
        with self._lock:
            rows = []
            for (k, name), c in self._totals.items():
                if k != kind:
                    continue
                below = np.cumsum(c.counts)
                le = []
                for b in bounds:
                    i = self.scheme.position(b) - c.lo
                    le.append(0 if i < 0 else int(below[min(i, len(below) - 1)]))
                rows.append((name, le, c.n, c.total))
            return rows
