"""The lag sketch: a fixed-bucket log histogram of lag samples, the one aggregator the SLA, the stats
page, the dashboard and the OpenTelemetry figures read their percentiles from.

Bucket bounds grow by ``2 ** (1 / 16)``: for a nearest-rank percentile ``x`` above :data:`MIN_BUCKET_MS`,
the reported value ``e`` satisfies ``x <= e < x * 1.0443`` (at most 4.43 % high, never low); it is also
capped by the exact maximum.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

P99 = 0.99
MIN_BUCKET_MS = 0.1
"""Upper bound of the first histogram bucket; lower lags (and negative ones, from clock skew) go there."""
GROWTH = 2 ** (1 / 16)
"""Ratio of consecutive bucket bounds: the reported percentiles are at most ``GROWTH - 1`` (4.43 %) high."""
MAX_BUCKET_MS = 3_600_000.0
BUCKETS = math.ceil(math.log(MAX_BUCKET_MS / MIN_BUCKET_MS, GROWTH)) + 1
BOUNDS: tuple[float, ...] = tuple(MIN_BUCKET_MS * GROWTH**i for i in range(BUCKETS))
"""Upper bounds (inclusive) of the buckets; a lag above the last bound goes to an overflow bucket."""


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
