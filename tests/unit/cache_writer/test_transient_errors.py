"""Which error replies make a batch wait and retry (the tier is busy) instead of refusing a write.

A write refused for good is invalidated and dead-lettered; one refused for now must be retried. redis-py
parses most transient codes into exception classes and drops the code from the message, so the check
must work on what redis-py really hands back: every case goes through redis-py's own reply parser.
"""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from cache_writer.redis.batch import is_transient

TRANSIENT = [
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN The cluster is down",
    "MOVED 3999 127.0.0.1:6381",
    "ASK 3999 127.0.0.1:6381",
    "LOADING Redis is loading the dataset in memory",
    "READONLY You can't write against a read only replica.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "NOAUTH Authentication required.",
    "WRONGPASS invalid username-password pair or user is disabled.",
    "NOPERM this user has no permissions to run the 'evalsha' command",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
    "NOREPLICAS Not enough good replicas to write.",
]
PERMANENT = [
    "ERR value is not an integer or out of range",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "ERR Error running script (call to f_1234): @user_script:12: bad argument",
    "CROSSSLOT Keys in request don't hash to the same slot",
]


@pytest.mark.parametrize("reply", TRANSIENT)
def test_a_transient_reply_is_retried(reply: str) -> None:
    error = BaseParser.parse_error(reply)
    assert is_transient(error), f"{type(error).__name__}({str(error)!r}) read as a refusal for good"


@pytest.mark.parametrize("reply", TRANSIENT)
def test_the_same_reply_as_text_from_the_batch_script_is_retried(reply: str) -> None:
    assert is_transient(ResponseError(reply))


@pytest.mark.parametrize("reply", PERMANENT)
def test_a_permanent_reply_is_a_refusal(reply: str) -> None:
    assert not is_transient(BaseParser.parse_error(reply))
