"""Errors of the cache tiers, under one root."""

from __future__ import annotations

from schemas.errors import FreshkeyError, Unavailable


class CacheWriterError(FreshkeyError):
    """Root of every error raised by ``cache_writer``."""


class TierUnavailableError(CacheWriterError, Unavailable):
    """A tier could not be reached or answered with an error; the batch may be retried as a whole
    (every action is a compare-and-set on the version, so a retry cannot move an entry backwards)."""

    def __init__(self, tier: str, cause: BaseException) -> None:
        super().__init__(f"cache tier {tier!r} failed: {cause!r}")
        self.tier = tier
        self.cause = cause
