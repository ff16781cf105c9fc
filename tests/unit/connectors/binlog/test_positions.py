"""connectors.binlog.positions without servers: a checkpoint the server's binlog list cannot serve, the
message that says what to do, and the error for a server that refuses to send the binlog (1236)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.binlog.positions import BinaryLogs, gap_message, position_problem, refusal_error
from connectors.checkpoint import BinlogPosition
from connectors.exceptions import BinlogGapError, ConfigurationError, DatabaseUnavailableError

LOGS = [("binlog.000005", 1200), ("binlog.000006", 380), ("binlog.000007", 9000)]


@pytest.mark.parametrize(
    ("position", "problem"),
    [
        (BinlogPosition("binlog.000005", 4), None),
        (BinlogPosition("binlog.000007", 9000), None),
        (
            BinlogPosition("binlog.000003", 1077),
            "binlog.000003 has been purged; the oldest binlog the server still has is binlog.000005",
        ),
        (
            BinlogPosition("binlog.000009", 4),
            "binlog.000009 is not on the server, whose binlogs are binlog.000005 to binlog.000007",
        ),
        (BinlogPosition("binlog.000006", 381), "position 381 is past the end of binlog.000006 (380 bytes)"),
    ],
)
def test_position_problem(position: BinlogPosition, problem: str | None) -> None:
    found = position_problem(position, LOGS)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


def test_no_binlogs_at_all() -> None:
    assert "log_bin" in (position_problem(BinlogPosition("binlog.000001", 4), []) or "")


def test_gap_message_names_the_files_and_the_ways_on() -> None:
    position = BinlogPosition("binlog.000003", 1077)
    problem = position_problem(position, LOGS)
    assert problem is not None
    message = gap_message(position, problem, checkpoint=Path("/var/lib/freshkey/checkpoint.json"))
    assert "binlog.000003:1077" in message and "binlog.000005" in message
    assert "/var/lib/freshkey/checkpoint.json" in message
    assert "freshkey connector --accept-gap" in message and "freshkey snapshot" in message
    assert "binlog_expire_logs_seconds" in message


# --- a server that refuses to send the binlog mid-stream (error 1236) ------------------------------------

AT = BinlogPosition("binlog.000004", 900)


def refused(said: str, logs: BinaryLogs = LOGS) -> ConfigurationError:
    return refusal_error(AT, said, server_id=777, list_logs=lambda: logs, checkpoint=Path("/cp.json"))


def test_1236_for_a_purged_file_is_a_gap_naming_the_way_on() -> None:
    error = refused("Could not find first log file name in binary log index file")
    assert isinstance(error, BinlogGapError)
    text = str(error)
    assert "binlog.000004:900" in text and "/cp.json" in text and "--accept-gap" in text
    assert "Could not find first log file name" in text, "the server's own words"
    assert "binlog.000004 has been purged; the oldest binlog the server still has is binlog.000005" in text


def test_1236_when_the_listing_fails_still_is_a_gap_in_the_servers_words() -> None:
    def unavailable() -> BinaryLogs:
        raise DatabaseUnavailableError("MySQL at 127.0.0.1:1 is unavailable")

    error = refusal_error(AT, "Could not find first log file", server_id=777, list_logs=unavailable)
    assert isinstance(error, BinlogGapError)
    assert "the server cannot send the binlog from there" in str(error)
    assert "Could not find first log file" in str(error)


def test_1236_listing_errors_other_than_the_server_are_not_swallowed() -> None:
    """A bug in the listing must show, not turn into a vaguer gap message."""

    def broken() -> BinaryLogs:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        refusal_error(AT, "Could not find first log file", server_id=777, list_logs=broken)


def test_1236_for_a_duplicate_server_id_names_the_setting() -> None:
    error = refused("A slave with the same server_uuid/server_id as this slave has connected to the master")
    assert not isinstance(error, BinlogGapError)
    assert "FRESHKEY_MYSQL_SERVER_ID" in str(error) and "777" in str(error)


def test_1236_for_a_too_large_event_names_max_allowed_packet() -> None:
    error = refused("log event entry exceeded max_allowed_packet; Increase max_allowed_packet on master")
    assert not isinstance(error, BinlogGapError) and "SET GLOBAL max_allowed_packet" in str(error)
