"""The lag sketch: the one aggregator of lag samples behind the stats page, the SLA, the dashboard and
the Prometheus histograms, so that the same window gives the same figure everywhere.

What it keeps. Samples (ms) per key ``(kind, name)``: :data:`LAG` (commit-to-cache lag of a namespace,
precise clock), :data:`COARSE` (the same, one-second binlog clock: counted and exported, never in a
percentile) and :data:`STAGE` (time spent in one stage of the path, see :mod:`pipeline.observe`). They
are kept in one-second slots, each a histogram, and in since-start totals. A batch is recorded at once
(one ``searchsorted`` and one ``bincount`` per key), never change by change.

Buckets. Upper bounds grow by ``2 ** (1 / 16)`` from :data:`MIN_BUCKET_MS` to :data:`MAX_BUCKET_MS`; the
sketch's *exact bounds* (the Prometheus bucket bounds, the SLA thresholds) are inserted among them.
Bucket ``i`` holds ``(bounds[i-1], bounds[i]]``; a value above the last bound goes to an overflow bucket,
one at or below :data:`MIN_BUCKET_MS` (clock skew can make it negative) to the first.

Percentiles. Nearest rank: the q-quantile of n samples is the ``ceil(q n)``-th smallest, reported as the
upper bound of its bucket, capped by the exact maximum. For a true quantile ``x`` above
:data:`MIN_BUCKET_MS` the reported value ``e`` satisfies ``x <= e < x * 1.0443`` (never low, at most
4.43 % high), and for an exact bound ``T``: ``e <= T`` exactly when ``x <= T``, i.e. exactly when at least
``ceil(q n)`` samples are ``<= T``. A decision "p99 <= T" and the p99 printed beside it always agree.

Windows. "The last W s" as of ``now`` are the ``ceil(W)`` whole seconds before the current one,
``[floor(now) - ceil(W), floor(now))``: the current second, still filling, is left out, so every reading
made within one second (``/freshkey/stats``, the SLA evaluation, the dashboard) covers the same samples
and gives the same figures. A window is at most one second late.

Memory is bounded: slots older than ``retention_s`` are dropped, and a slot holds, per key, only the run
of buckets its samples touched. Thread-safe (a lock): recorded and mostly read on the worker's event
loop, read by the Prometheus scrape thread too.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.metrics import LAG_BUCKETS_MS, STAGE_BUCKETS_MS

P50 = 0.5
P99 = 0.99
MIN_BUCKET_MS = 0.1
"""Upper bound of the first bucket; lower lags (and negative ones, from clock skew) go there."""
GROWTH = 2 ** (1 / 16)
"""Ratio of consecutive geometric bounds: percentiles are reported at most ``GROWTH - 1`` (4.43 %) high."""
MAX_BUCKET_MS = 3_600_000.0
BUCKETS = math.ceil(math.log(MAX_BUCKET_MS / MIN_BUCKET_MS, GROWTH)) + 1
BOUNDS: tuple[float, ...] = tuple(MIN_BUCKET_MS * GROWTH**i for i in range(BUCKETS))
"""The geometric upper bounds (inclusive); a sketch inserts its exact bounds among them."""

LAG = "lag"
COARSE = "coarse"
STAGE = "stage"
Key = tuple[str, str]
"""``(kind, name)``: ``(LAG, namespace)``, ``(COARSE, namespace)`` or ``(STAGE, stage name)``."""

EXPORT_BOUNDS_MS: tuple[float, ...] = tuple(sorted({*LAG_BUCKETS_MS, *STAGE_BUCKETS_MS}))
"""Exact bounds of every sketch: the Prometheus histograms' bucket bounds (``schemas.metrics``)."""
DEFAULT_WINDOWS_S: tuple[float, ...] = (10.0, 60.0)
"""The windows every reader reports (the SLA adds its evaluation window)."""

Values = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int64]


def rank(q: float, n: int) -> int:
    """The nearest rank of the q-quantile among n samples: ``ceil(q n)``, at least 1.

    Rounded to 9 decimals first, so that ``0.99 * 100`` is 99 and not 100 (binary floating point).
    """
    return max(1, math.ceil(round(q * n, 9)))


def window_name(seconds: float | None) -> str:
    """``last_60s`` (``None``: ``since_start``): the key of a window in the JSON answers."""
    return "since_start" if seconds is None else f"last_{seconds:g}s"


class BucketScheme:
    """The bucket bounds of one sketch: the geometric ones with ``exact`` inserted."""

    def __init__(self, exact_ms: Iterable[float] = ()) -> None:
        exact = sorted({float(b) for b in exact_ms})
        for bound in exact:
            if not (math.isfinite(bound) and 0 < bound <= MAX_BUCKET_MS):
                raise ValueError(f"an exact bound must be in (0, {MAX_BUCKET_MS:g}] ms, not {bound!r}")
        self.exact: tuple[float, ...] = tuple(exact)
        self.bounds: Values = np.unique(np.array((*BOUNDS, *exact), dtype=np.float64))
        self.size = len(self.bounds) + 1
        """Buckets, the overflow bucket included."""

    def index(self, values: Values) -> npt.NDArray[np.intp]:
        """The bucket of each value."""
        return np.searchsorted(self.bounds, values, side="left")

    def position(self, bound: float) -> int:
        """The bucket that ``bound`` closes; a ValueError unless it is one of the bounds."""
        i = int(np.searchsorted(self.bounds, bound, side="left"))
        if i >= len(self.bounds) or self.bounds[i] != bound:
            raise ValueError(f"{bound:g} ms is not an exact bound of this sketch ({self.exact})")
        return i


@dataclass(slots=True)
class _Cells:
    """The samples of one key in one slot (or since start): counts of the buckets ``lo, lo + 1, ...``."""

    lo: int
    counts: Counts
    n: int = 0
    total: float = 0.0
    """Sum of the samples, negative ones counted as 0 (what a Prometheus histogram sums)."""
    max: float = -math.inf

    def add(self, lo: int, counts: Counts, n: int, total: float, top: float) -> None:
        hi, mine = lo + len(counts), self.lo + len(self.counts)
        if lo < self.lo or hi > mine:
            start, end = min(lo, self.lo), max(hi, mine)
            grown = np.zeros(end - start, dtype=np.int64)
            grown[self.lo - start : mine - start] = self.counts
            self.lo, self.counts = start, grown
        self.counts[lo - self.lo : hi - self.lo] += counts
        self.n += n
        self.total += total
        self.max = max(self.max, top)


@dataclass(slots=True)
class _Slot:
    t: int
    cells: dict[Key, _Cells] = field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """The samples of some keys over one window: what every figure is computed from."""

    scheme: BucketScheme
    counts: Counts
    """Dense: one count per bucket of the scheme (overflow last)."""
    n: int
    max: float
    """-inf when there is no sample."""
    total: float
    window_s: float | None
    """None: since start."""
    end: int | None
    """The window is ``[end - ceil(window_s), end)`` (unix s); None: since start, up to now."""

    @classmethod
    def of(
        cls, scheme: BucketScheme, cells: Iterable[_Cells], window_s: float | None, end: int | None
    ) -> Reading:
        counts = np.zeros(scheme.size, dtype=np.int64)
        n, total, top = 0, 0.0, -math.inf
        for c in cells:
            counts[c.lo : c.lo + len(c.counts)] += c.counts
            n, total, top = n + c.n, total + c.total, max(top, c.max)
        return cls(scheme, counts, n, top, total, window_s, end)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank q-quantile as described in the module docstring; None without samples."""
        if self.n == 0:
            return None
        i = int(np.searchsorted(np.cumsum(self.counts), rank(q, self.n), side="left"))
        return min(float(self.scheme.bounds[i]), self.max) if i < len(self.scheme.bounds) else self.max

    def at_most(self, bound: float) -> int:
        """How many samples are ``<= bound``, exactly (``bound`` must be an exact bound of the sketch)."""
        return int(self.counts[: self.scheme.position(bound) + 1].sum())

    def summary(self, quantiles: Mapping[str, float] | None = None) -> dict[str, Any]:
        """``{"window_s", "samples", "p50", "p99", "max"}`` (or the quantiles named); None when empty."""
        result: dict[str, Any] = {"window_s": self.window_s, "samples": self.n}
        for name, q in (quantiles or {"p50": P50, "p99": P99}).items():
            result[name] = self.quantile(q)
        result["max"] = self.max if self.n else None
        return result


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
        self.retention_s = retention_s
        self.windows_s: tuple[float, ...] = ()
        for seconds in windows_s:
            self.add_window(seconds)
        self.clock = clock
        self._lock = threading.Lock()
        self._slots: deque[_Slot] = deque()
        self._totals: dict[Key, _Cells] = {}
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

    def add_window(self, seconds: float) -> None:
        """Report this window too (and keep the slots it needs)."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a window is a positive number of seconds, not {seconds!r}")
        self.windows_s = tuple(sorted({*self.windows_s, float(seconds)}))
        self.retention_s = max(self.retention_s, math.ceil(seconds))

    # -- recording ----------------------------------------------------------------------------------
    def record(self, key: Key, values: Sequence[float] | Values, *, at: float | None = None) -> None:
        """Samples of ``key`` (ms) taken at ``at`` (unix s; default: now). NaN and infinities are dropped."""
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 1:
            v = v.ravel()
        finite = np.isfinite(v)
        if not finite.all():
            v = v[finite]
        if v.size == 0:
            return
        scheme = self.scheme
        idx = scheme.index(v)
        lo = int(idx.min())
        counts = np.bincount(idx - lo).astype(np.int64, copy=False)
        self._add(key, lo, counts, int(v.size), float(np.maximum(v, 0.0).sum()), float(v.max()), at)

    def record_repeated(self, key: Key, value: float, count: int, *, at: float | None = None) -> None:
        """``count`` samples of the same value (a stage the whole batch spent together)."""
        if count <= 0 or not math.isfinite(value):
            return
        lo = int(np.searchsorted(self.scheme.bounds, value, side="left"))
        self._add(key, lo, np.array([count], dtype=np.int64), count, max(value, 0.0) * count, value, at)

    def _add(
        self, key: Key, lo: int, counts: Counts, n: int, total: float, top: float, at: float | None
    ) -> None:
        t = math.floor(self.clock() if at is None else at)
        with self._lock:
            slots = self._slots
            if not slots or t > slots[-1].t:
                slots.append(_Slot(t))
                self._expire(t)
            # A wall clock stepped back adds to the newest slot.
            for cells in (slots[-1].cells, self._totals):
                held = cells.get(key)
                if held is None:
                    cells[key] = _Cells(lo, counts.copy(), n, total, top)
                else:
                    held.add(lo, counts, n, total, top)

    def _expire(self, now_s: int) -> None:
        while self._slots and self._slots[0].t < now_s - self.retention_s:
            self._slots.popleft()

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
        start = end - max(1, math.ceil(seconds - 1e-9))
        with self._lock:
            cells = [
                c
                for slot in self._slots
                if start <= slot.t < end
                for (k, name), c in slot.cells.items()
                if k == kind and (names is None or name in names)
            ]
            return Reading.of(self.scheme, cells, seconds, end)

    def second(self, t: int, kind: str, names: Collection[str] | None = None) -> Reading:
        """The samples of one second (``[t, t + 1)``)."""
        with self._lock:
            cells = [
                c
                for slot in self._slots
                if slot.t == t
                for (k, name), c in slot.cells.items()
                if k == kind and (names is None or name in names)
            ]
            return Reading.of(self.scheme, cells, 1, t + 1)

    def since_start(self, kind: str, names: Collection[str] | None = None) -> Reading:
        """Every sample of ``kind`` (only ``names``; None: every name) since the sketch was built."""
        with self._lock:
            cells = [
                c for (k, name), c in self._totals.items() if k == kind and (names is None or name in names)
            ]
            return Reading.of(self.scheme, cells, None, None)

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
