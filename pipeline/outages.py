"""What a service outage is, and the one way the worker waits for a service to come back."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import pymysql
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from cache_writer import (
    TierUnavailableError,
)
from pipeline.models import (
    ModelUnavailableError,
)

log = logging.getLogger(__name__)


OUTAGES: tuple[type[BaseException], ...] = (
    TierUnavailableError,
    RedisError,
    OSError,
    ModelUnavailableError,
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
)
"""Errors that say a service is out of reach (Redis, the database, the weights): the step is retried
with backoff until it succeeds, never skipped and never acknowledged past."""


T = TypeVar("T")

BACKOFF_FIRST_S = 0.05
"""The wait after a step's first failed attempt; it doubles with each failure, up to :data:`BACKOFF_MAX_S`."""
BACKOFF_MAX_S = 5.0


def backoff_s(attempts: int) -> float:
    """The wait after ``attempts`` failed attempts in a row: 0.05, 0.1, 0.2 ... s, at most 5 s."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(attempts - 1, 16))  # no overflow after hours


def _log_retry(what: str, error: BaseException | None, attempts: int, wait: float) -> None:
    log.warning(
        "%s failed (%r); attempt %d, next in %.2f s; nothing is acknowledged meanwhile",
        what, error, attempts, wait,
    )  # fmt: skip


def retrying(what: str, *, failed: int = 0) -> AsyncRetrying:
    """Retry a step that needs Redis, the database or the weights until it succeeds (never skipped):
    every retry is logged with what waits, the error and when the next attempt is (:func:`backoff_s`).
    ``failed``: attempts that already failed before this loop began (their count goes on from there)."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        _log_retry(what, error, failed + state.attempt_number, wait)

    return AsyncRetrying(
        retry=retry_if_exception_type(OUTAGES),
        wait=lambda state: backoff_s(failed + state.attempt_number),
        before_sleep=before_sleep,
        reraise=True,
    )


async def until_done(what: str, step: Callable[[], Awaitable[T]]) -> T:
    """``await step()`` until it succeeds, retried on outages exactly as :func:`retrying` retries it: how
    every step of the worker that needs Redis, the database or the weights waits for them to come back.

    The first attempt is made without tenacity: its loop costs 40-43 µs per step that succeeds at once
    (``async for attempt in retrying(...)``, measured here), and the change agent makes two such steps per
    batch, about a hundred batches a second while it follows a steady stream. Only a step that failed
    enters the loop, counting on from its first attempt (same log lines, same waits)."""
    try:
        return await step()
    except OUTAGES as exc:
        wait = backoff_s(1)
        _log_retry(what, exc, 1, wait)
    await asyncio.sleep(wait)
    async for attempt in retrying(what, failed=1):
        with attempt:
            return await step()
    raise AssertionError("tenacity's loop ended without a result")  # pragma: no cover: it retries forever


def crash(what: str, exc: BaseException) -> NoReturn:
    """End the process with a non-zero status, so that its supervisor restarts it: a worker that lives on
    without consuming breaks the promise worse than a restart (nothing unacknowledged is lost)."""
    log.critical(
        "%s crashed (%r): the worker exits with status 70 so that its supervisor restarts it",
        what, exc, exc_info=exc,
    )  # fmt: skip
    logging.shutdown()
    os._exit(70)


def restart(reason: str) -> NoReturn:
    """End the process with status 70 for ``reason`` (a change it cannot make while running): its
    supervisor starts it again, and nothing unacknowledged is lost."""
    log.critical("%s: the worker exits with status 70 so that its supervisor starts it again", reason)
    logging.shutdown()
    os._exit(70)
