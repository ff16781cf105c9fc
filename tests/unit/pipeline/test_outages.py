"""pipeline.outages: what counts as an outage, the retries of a step until it succeeds, and the exit of a
crashed agent."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys

import pymysql
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from cache_writer import TierUnavailableError
from pipeline.models import ModelUnavailableError
from pipeline.outages import OUTAGES, backoff_s, retrying, until_done
from schemas.codec import DecodeError
from schemas.errors import Unavailable


def test_outages_are_the_unavailable_category_and_service_errors_not_bad_input() -> None:
    for error in (
        TierUnavailableError("redis", OSError("down")),
        ModelUnavailableError("weights"),
        RedisConnectionError("refused"),
        pymysql.err.OperationalError(2003, "refused"),
        ConnectionRefusedError(),
    ):
        assert isinstance(error, OUTAGES), error
    assert isinstance(TierUnavailableError("redis", OSError()), Unavailable)
    assert not isinstance(DecodeError("bad"), OUTAGES), "bad input is dead-lettered, never retried"
    assert not isinstance(ValueError("a bug"), OUTAGES), "a bug is not an outage"


def test_a_crashed_agent_ends_the_process_with_status_70_and_says_why() -> None:
    script = (
        "import logging; logging.basicConfig(level='INFO')\n"
        "from pipeline.outages import crash\n"
        "crash('the change agent', RuntimeError('boom'))\n"
        "print('still alive')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 70
    assert "still alive" not in result.stdout
    assert "the change agent crashed" in result.stderr and "boom" in result.stderr
    assert "supervisor restarts it" in result.stderr


class Flaky:
    """A step that fails with ``errors`` (one per call) before it answers ``done``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def _retries(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """(attempt, next wait) of each retry logged."""
    found = [re.search(r"attempt (\d+), next in ([0-9.]+) s", r.getMessage()) for r in caplog.records]
    return [(int(m[1]), m[2]) for m in found if m]


def test_backoff_doubles_from_50_ms_to_at_most_5_s_and_never_overflows() -> None:
    assert [backoff_s(n) for n in range(1, 9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert backoff_s(100_000) == 5.0  # an outage of days: still a number


def test_until_done_makes_one_call_when_the_step_succeeds_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    step = Flaky()
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(until_done("a step", step)) == "done"
    assert step.calls == 1
    assert _retries(caplog) == []


@pytest.mark.parametrize("first_direct", [True, False], ids=["until_done", "retrying (reference)"])
def test_a_step_that_meets_outages_is_retried_with_the_same_log_and_waits_either_way(
    first_direct: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """until_done's first attempt outside tenacity changes nothing a reader sees: the same attempts
    counted, the same waits, as the tenacity loop alone makes."""
    step = Flaky(RedisConnectionError("refused"), TierUnavailableError("redis", OSError("down")))

    async def reference() -> str:
        async for attempt in retrying("a step"):
            with attempt:
                return await step()
        raise AssertionError("unreachable")

    with caplog.at_level(logging.WARNING):
        result = asyncio.run(until_done("a step", step) if first_direct else reference())
    assert result == "done" and step.calls == 3
    assert _retries(caplog) == [(1, "0.05"), (2, "0.10")]
    assert all("a step failed" in r.getMessage() for r in caplog.records if "attempt" in r.getMessage())


def test_until_done_lets_what_is_no_outage_through_at_once() -> None:
    step = Flaky(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(until_done("a step", step))
    assert step.calls == 1
    later = Flaky(OSError("down"), KeyError("bad"))  # an outage, then something that is not one
    with pytest.raises(KeyError):
        asyncio.run(until_done("a step", later))
    assert later.calls == 2
