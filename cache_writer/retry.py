"""One retry policy for the tiers, and the fence bound that ends waiting on a tier.

A tier that does not answer is retried with exponential backoff (``RetryPolicy``, in the style of
redis-py's ``Retry(ExponentialBackoff(cap, base))``). Waiting is right while the outage is short: nothing
is acknowledged past a change that has not reached every tier, so a replay makes the tier exact again.
Past ``fence_after_s`` waiting itself breaks the promise, because every other tier stalls behind the one
that is down. The :class:`TierGuard` of that tier then *fences* it:

- an outer tier (L3...) is skipped from then on (its changes are counted as ``fenced``), the inner tiers
  go on, and before it is trusted again it is flushed of everything freshkey wrote there (it missed
  invalidations); clients are told not to read it meanwhile (README, "Redis layout", field ``fo``);
- the innermost tier (L2) cannot be skipped: it holds the signatures every reader checks. Its batch is
  retried until it answers, and on its return every namespace's signature is moved (an O(1) fence) before
  anything else is applied, so nothing it held from before the outage is served again.

An outer tier's attempt may take only the time left to the bound (:func:`apply_within`), and a failure
counts from the start of the attempt that failed: a tier that hangs, answering nothing and refusing
nothing, is fenced on time instead of after its socket timeout.

Every failure, fence and recovery is logged at WARNING or above with what happens next.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cache_writer.exceptions import TierUnavailableError
from cache_writer.tier import ActionResult, CacheAction, CacheTier

TierState = Literal["ok", "failing", "fenced"]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n)).

    ``fence_after_s``: how long a tier may fail before it is fenced (None: never; wait forever).
    """

    base_s: float = 0.05
    cap_s: float = 5.0
    fence_after_s: float | None = 1.5

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` + 1 (attempt counts from 0)."""
        return random.uniform(0, min(self.cap_s, self.base_s * 2 ** min(attempt, 30)))


@dataclass
class TierGuard:
    """Health of one tier as the pipeline sees it: ok, failing (since when) or fenced."""

    name: str
    policy: RetryPolicy
    clock: Callable[[], float] = time.monotonic
    state: TierState = "ok"
    failing_since: float | None = None
    fenced_since: float | None = None
    attempts: int = 0
    last_error: str = ""
    fences: int = 0
    recovering: bool = False
    """Fenced and answering again: being flushed before it is trusted."""
    history: list[tuple[float, str]] = field(default_factory=list)

    def succeeded(self) -> None:
        if self.state == "failing":
            self._note("recovered")
        if self.state != "fenced":
            self.state = "ok"
            self.failing_since = None
            self.attempts = 0

    def failed(self, error: BaseException, *, since: float | None = None) -> float:
        """Record a failure; returns how long to wait before the next attempt.

        ``since``: when the failed attempt began (this guard's clock). A tier that hangs fails only when
        the attempt times out, seconds after it stopped answering: counted from the attempt's start, its
        failure is as long as it really is (the fence bound is about how long the others waited)."""
        now = self.clock()
        if self.state == "ok":
            self.state = "failing"
            self.failing_since = now if since is None else since
            self._note(f"failing: {error!r}")
        self.last_error = repr(error)[:300]
        wait = self.policy.backoff(self.attempts)
        self.attempts += 1
        bound, left = self.policy.fence_after_s, self.time_left_s()
        if bound is not None and left is not None and self.state == "failing":
            # Never sleep past the fence bound (the decision comes on time), nor longer than a third of
            # it (a tier that answers again is used again within a fraction of the bound).
            wait = min(wait, bound / 3, left)
        return wait

    def time_left_s(self) -> float | None:
        """How long the next attempt may take before the tier is due to be fenced (None: no bound); at
        least 10 ms, so that an attempt is always made."""
        bound = self.policy.fence_after_s
        if bound is None:
            return None
        return max(0.01, bound - self.failing_for_s)

    @property
    def failing_for_s(self) -> float:
        return 0.0 if self.failing_since is None else self.clock() - self.failing_since

    def due_to_fence(self) -> bool:
        """Failing for longer than the policy's bound (and not fenced yet)."""
        bound = self.policy.fence_after_s
        return self.state == "failing" and bound is not None and self.failing_for_s >= bound

    def fence(self) -> None:
        self.state = "fenced"
        self.fenced_since = self.clock()
        self.fences += 1
        self._note("fenced")

    def unfence(self) -> None:
        self.state = "ok"
        self.failing_since = self.fenced_since = None
        self.attempts = 0
        self.recovering = False
        self._note("trusted again")

    def snapshot(self) -> dict[str, object]:
        return {
            "state": self.state,
            "failing_for_s": round(self.failing_for_s, 3),
            "fenced_for_s": round(self.clock() - self.fenced_since, 3) if self.fenced_since else None,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "fences": self.fences,
            "recovering": self.recovering,
        }

    def _note(self, what: str) -> None:
        self.history.append((time.time(), what))
        del self.history[:-20]


async def apply_within(
    tier: CacheTier, actions: Sequence[CacheAction], within_s: float | None
) -> list[ActionResult]:
    """One apply of ``actions`` to ``tier``, given up after ``within_s`` (None: no bound).

    An outer tier's attempt may take only the time left to the fence bound: one that hangs (a paused
    server, a network that drops packets) answers nothing and refuses nothing, so without a bound the
    others waited for its socket timeout (5 s by default) before it even counted as failing (an L3
    paused for 6 s held L2 back 4.8 s, 1.3 s with the bound: ``test_tier_fencing.py``). Given up, the
    attempt is a failure of the tier like any other (the fence bound is then reached, and the tier
    fenced and later flushed)."""
    if within_s is None:
        return await tier.apply(actions)
    bound = asyncio.timeout(within_s)
    try:
        async with bound:
            return await tier.apply(actions)
    except TimeoutError:
        if not bound.expired():
            raise
        raise TierUnavailableError(
            tier.name, TimeoutError(f"no answer within {within_s:.2f} s (the time left to the fence bound)")
        ) from None
