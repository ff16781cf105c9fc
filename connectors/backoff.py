"""When the connector's loop of sessions tries again (:mod:`connectors.runner`): how long it waits first,
and when it gives up."""

from __future__ import annotations

import random

from connectors.settings import ConnectorSettings

STABLE_AFTER_S = 10.0
"""A session reading this long without failing resets the backoff (the next failure waits the initial
backoff again, and counts as attempt 1)."""


class RetryPolicy:
    """When the loop of sessions tries again, how long it waits first, and when it gives up.

    Counts consecutive failed sessions (:attr:`failures`); a session that read for
    :data:`STABLE_AFTER_S` resets the count (:meth:`stable`).
    """

    def __init__(self, settings: ConnectorSettings) -> None:
        self.settings = settings
        self.failures = 0

    def failed(self) -> None:
        self.failures += 1

    def stable(self) -> None:
        self.failures = 0

    def exhausted(self) -> bool:
        """True once ``retry_max_attempts`` consecutive sessions failed (never when it is 0)."""
        limit = self.settings.retry_max_attempts
        return limit > 0 and self.failures >= limit

    def backoff(self) -> float:
        """Exponential in the consecutive failures, capped, with jitter in its upper half (so that
        connectors restarted together do not all come back at the same instant)."""
        initial, cap = self.settings.retry_initial_backoff_s, self.settings.retry_max_backoff_s
        base = min(cap, initial * 2 ** min(max(0, self.failures - 1), 60))
        return float(base / 2 + random.uniform(0, base / 2))

    def next_attempt(self) -> str:
        """The next attempt's number, with the limit when there is one (``"3 of 5"``)."""
        limit = self.settings.retry_max_attempts
        return f"{self.failures + 1}" + (f" of {limit}" if limit else "")
