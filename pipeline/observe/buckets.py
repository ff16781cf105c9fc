"""Buckets and readings of lag samples: the one percentile definition of the worker.

Buckets. Upper bounds grow by ``2 ** (1 / 16)`` from :data:`MIN_BUCKET_MS` to :data:`MAX_BUCKET_MS`; a
scheme's *exact bounds* (the Prometheus bucket bounds, the SLA thresholds) are inserted among them.
Bucket ``i`` holds ``(bounds[i-1], bounds[i]]``; a value above the last bound goes to an overflow bucket,
one at or below :data:`MIN_BUCKET_MS` (clock skew can make it negative) to the first.

Percentiles. Nearest rank: the q-quantile of n samples is the ``ceil(q n)``-th smallest, reported as the
upper bound of its bucket, capped by the exact maximum. For a true quantile ``x`` above
:data:`MIN_BUCKET_MS` the reported value ``e`` satisfies ``x <= e < x * 1.0443`` (never low, at most
4.43 % high), and for an exact bound ``T``: ``e <= T`` exactly when ``x <= T``, i.e. exactly when at least
``ceil(q n)`` samples are ``<= T``. A decision "p99 <= T" and the p99 printed beside it always agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

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

Values = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int64]


def rank(q: float, n: int) -> int:
    """The nearest rank of the q-quantile among n samples: ``ceil(q n)``, at least 1.

    Rounded to 9 decimals first, so that ``0.99 * 100`` is 99 and not 100 (binary floating point).
    """
    return max(1, math.ceil(round(q * n, 9)))


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
class Cells:
    """The samples of one key in one slot (or since start): counts of the buckets ``lo, lo + 1, ...``.

    Dense (``lo`` 0, every bucket) while samples arrive; a slot that is over keeps only the run of
    buckets its samples touched (:meth:`compacted`)."""

    lo: int
    counts: Counts
    n: int = 0
    total: float = 0.0
    """Sum of the samples, negative ones counted as 0 (what a Prometheus histogram sums)."""
    max: float = -math.inf

    def compacted(self) -> Cells:
        touched = np.flatnonzero(self.counts)
        if len(touched) == 0:
            return Cells(0, np.zeros(0, dtype=np.int64), self.n, self.total, self.max)
        lo, hi = int(touched[0]), int(touched[-1]) + 1
        return Cells(self.lo + lo, self.counts[lo:hi].copy(), self.n, self.total, self.max)


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
        cls, scheme: BucketScheme, cells: Iterable[Cells], window_s: float | None, end: int | None
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
