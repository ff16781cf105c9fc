"""What a service outage is, and the one way the worker waits for a service to come back."""

from __future__ import annotations

import logging
import os
from typing import NoReturn

import pymysql
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

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


def retrying(what: str) -> AsyncRetrying:
    """Retry a step that needs Redis, the database or the weights until it succeeds (never skipped):
    every retry is logged with what waits, the error and when the next attempt is."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s failed (%r); attempt %d, next in %.2f s; nothing is acknowledged meanwhile",
            what, error, state.attempt_number, wait,
        )  # fmt: skip

    return AsyncRetrying(
        retry=retry_if_exception_type(OUTAGES),
        wait=wait_exponential(multiplier=0.05, max=5),
        before_sleep=before_sleep,
        reraise=True,
    )


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
