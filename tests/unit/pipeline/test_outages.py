"""pipeline.outages: what counts as an outage, and the exit of a crashed agent."""

from __future__ import annotations

import subprocess
import sys

import pymysql
from redis.exceptions import ConnectionError as RedisConnectionError

from cache_writer import TierUnavailableError
from pipeline.models import ModelUnavailableError
from pipeline.outages import OUTAGES
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
