"""pipeline.verify's judging rule, on hand-made rows and entries: stale vs in flight, floors, nines."""

from __future__ import annotations

from typing import Any

import pytest

from cache_writer.entries import Entry
from connectors.database import BinlogPosition
from pipeline.verify.judge import (
    EXIT_CLEAN,
    EXIT_STALE,
    EXIT_UNVERIFIABLE,
    MIN_CHECKED_FOR_NINES,
    FirstRead,
    Verdict,
    Verification,
    VerifyReport,
    expected_value,
    judge,
    judge_after_window,
    nines_text,
    stated_nines,
    verify_namespace,
    version_floor,
)
from schemas import Binding, VersionError, binlog_version, gtid_version

PLAIN = Binding(table="db.hb", namespace="hb", value_columns=("beat",))
VERSIONED = Binding(table="db.hb", namespace="hb", value_columns=("beat", "v"), version_column="v")
FLOOR = binlog_version("binlog.000003", 5000, 0)


def row(beat: int, v: int | None = None) -> dict[str, Any]:
    return {"id": 1, "beat": beat} if v is None else {"id": 1, "beat": beat, "v": v}


def entry(
    binding: Binding, source: dict[str, Any] | None, version: int, *, value: bytes | None = None
) -> Entry:
    """A live entry holding ``source`` (or ``value``), or a tombstone when both are None."""
    if value is None and source is not None:
        value = expected_value(binding, source)
    return Entry(key="fk:{hb}:1", version=version, value=value, commit_ts_us=None)


# --- binlog versions: the floor read before the first read --------------------------------------------------


def test_an_entry_between_the_first_read_and_now_is_in_flight_where_the_old_rule_said_stale() -> None:
    """The heartbeat case: the row moved 1 -> 2 -> 3; the cache applied 2 (a change after the first read)."""
    first, now = row(1), row(3)
    applied = entry(PLAIN, row(2), FLOOR + (7 << 16))
    assert judge(PLAIN, now, applied)[0] is Verdict.STALE  # what comparing with the current row says
    assert judge_after_window(PLAIN, FirstRead(first, FLOOR), now, applied)[0] is Verdict.IN_FLIGHT


def test_an_entry_from_before_the_first_read_with_neither_value_is_stale() -> None:
    old = entry(PLAIN, row(0), FLOOR - 1)
    verdict, reason = judge_after_window(PLAIN, FirstRead(row(1), FLOOR), row(3), old)
    assert verdict is Verdict.STALE
    assert "neither the row at the first read nor now" in reason and "before the first read" in reason


def test_an_old_entry_holding_the_first_read_value_is_not_stale() -> None:
    """The row changed after the first read; the entry holds what it was then: fine (or in flight)."""
    held = entry(PLAIN, row(1), FLOOR - 1)
    assert judge_after_window(PLAIN, FirstRead(row(1), FLOOR), row(3), held)[0] is Verdict.IN_FLIGHT


def test_caught_up_or_invalidated_is_in_flight() -> None:
    first = FirstRead(row(1), FLOOR)
    assert judge_after_window(PLAIN, first, row(3), entry(PLAIN, row(3), FLOOR + 1))[0] is Verdict.IN_FLIGHT
    tombstone = entry(PLAIN, None, FLOOR + 1)
    assert judge_after_window(PLAIN, first, None, tombstone)[0] is Verdict.IN_FLIGHT
    assert judge_after_window(PLAIN, first, row(3), None)[0] is Verdict.IN_FLIGHT


def test_a_live_entry_for_a_row_gone_then_and_now() -> None:
    gone = FirstRead(None, FLOOR)
    verdict, reason = judge_after_window(PLAIN, gone, None, entry(PLAIN, row(1), FLOOR - 1))
    assert verdict is Verdict.STALE and "gone at the first read and still gone" in reason
    # Written by a change after the first read (an insert whose delete is still on its way): in flight.
    assert judge_after_window(PLAIN, gone, None, entry(PLAIN, row(1), FLOOR))[0] is Verdict.IN_FLIGHT


def test_without_a_position_only_values_are_compared() -> None:
    unknown = FirstRead(row(1), None)
    assert judge_after_window(PLAIN, unknown, row(3), entry(PLAIN, row(2), 2**60))[0] is Verdict.STALE
    assert judge_after_window(PLAIN, unknown, row(3), entry(PLAIN, row(1), 1))[0] is Verdict.IN_FLIGHT


# --- version column -----------------------------------------------------------------------------------------


def test_version_column_older_than_the_first_read_is_stale() -> None:
    verdict, reason = judge_after_window(
        VERSIONED, FirstRead(row(5, 50)), row(7, 70), entry(VERSIONED, row(4, 40), 40)
    )
    assert verdict is Verdict.STALE and "older than the row at the first read (v50)" in reason


def test_version_column_past_the_first_read_is_in_flight() -> None:
    moved = entry(VERSIONED, row(6, 60), 60)
    assert judge(VERSIONED, row(7, 70), moved)[0] is Verdict.STALE
    assert judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(7, 70), moved)[0] is Verdict.IN_FLIGHT
    # Holding exactly the first-read state is fine too.
    held = entry(VERSIONED, row(5, 50), 50)
    assert judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(7, 70), held)[0] is Verdict.IN_FLIGHT


def test_version_column_same_version_other_value_is_stale() -> None:
    forged = entry(VERSIONED, None, 50, value=b'{"stale":true}')
    assert judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(5, 50), forged)[0] is Verdict.STALE
    assert judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(7, 70), forged)[0] is Verdict.STALE
    now_forged = entry(VERSIONED, None, 70, value=b'{"stale":true}')
    assert judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(7, 70), now_forged)[0] is Verdict.STALE


def test_version_column_newer_than_the_row_is_stale() -> None:
    """No change can bring a newer entry back to the row: the forward-only CAS refuses it."""
    ahead = entry(VERSIONED, row(9, 90), 90)
    verdict, reason = judge_after_window(VERSIONED, FirstRead(row(5, 50)), row(5, 50), ahead)
    assert verdict is Verdict.STALE and "newer than the row" in reason


def test_version_column_gone_then_and_now_is_stale() -> None:
    live = entry(VERSIONED, row(5, 50), 50)
    assert judge_after_window(VERSIONED, FirstRead(None), None, live)[0] is Verdict.STALE


def test_version_column_without_a_version_raises_for_the_caller_to_count() -> None:
    bad = {"id": 1, "beat": 1, "v": "not a version"}
    with pytest.raises(VersionError):
        judge_after_window(VERSIONED, FirstRead(bad), bad, entry(VERSIONED, None, 1, value=b"{}"))


def test_verify_namespace_counts_a_row_without_a_version_as_unverifiable() -> None:
    bad = {"id": 1, "beat": 1, "v": "not a version"}
    report = verify_namespace(
        VERSIONED, [bad], {"p:{hb}:1": entry(VERSIONED, bad, 1)}, prefix="p", key_columns=("id",)
    )
    assert report.unverifiable_keys == 1 and report.stale == 0 and report.checked == 0


# --- floors -------------------------------------------------------------------------------------------------


def test_binlog_floor_splits_changes_before_and_after_the_position() -> None:
    floor = version_floor("binlog", BinlogPosition("binlog.000003", 5000, ""))
    assert floor is not None
    before = [binlog_version("binlog.000003", 5000, 65535), binlog_version("binlog.000002", 2**32 - 1, 7)]
    after = [binlog_version("binlog.000003", 5001, 0), binlog_version("binlog.000004", 4, 0)]
    assert all(v < floor for v in before) and all(v >= floor for v in after)


@pytest.mark.parametrize(
    ("gtid", "next_seq"),
    [
        ("0-1-42", 43),
        ("0-1-42,1-2-7", 43),
        ("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-40:42-45", 46),
        ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,\n4e11fa47-71ca-11e1-9e33-c80aa9429562:1-9", 10),
    ],
)
def test_gtid_floor_is_the_next_transaction(gtid: str, next_seq: int) -> None:
    floor = version_floor("gtid", BinlogPosition("binlog.000001", 4, gtid))
    assert floor == gtid_version(str(next_seq), 0)
    assert gtid_version(str(next_seq - 1), 2**24 - 1) < floor


def test_no_position_no_floor() -> None:
    assert version_floor("binlog", None) is None
    assert version_floor("gtid", BinlogPosition("binlog.000001", 4, "")) is None


# --- figures ------------------------------------------------------------------------------------------------


def test_tiny_samples_state_no_nines() -> None:
    assert (
        nines_text(1, 0)
        == f"0 stale of 1 (too few to state nines: fewer than {MIN_CHECKED_FOR_NINES} checked)"
    )
    assert stated_nines(1, 0) is None
    assert nines_text(30, 0) == "1.48 nines"


def test_exit_codes_and_json() -> None:
    clean = Verification(100, [VerifyReport("a", checked=30)])
    assert clean.exit_code == EXIT_CLEAN and clean.to_json()["nines"] == pytest.approx(1.48)
    unverifiable = Verification(100, [VerifyReport("a", checked=1), VerifyReport("b", unverifiable="no pk")])
    figures = unverifiable.to_json()
    assert unverifiable.exit_code == EXIT_UNVERIFIABLE and figures["status"] == "unverifiable"
    assert figures["unverifiable"] == [{"namespace": "b", "reason": "no pk"}]
    assert figures["nines"] is None and "too few" in figures["nines_text"]
    assert Verification(100, [VerifyReport("a", unverifiable_keys=1)]).exit_code == EXIT_UNVERIFIABLE
    stale = Verification(100, [VerifyReport("a", checked=3, stale=1), VerifyReport("b", unverifiable="x")])
    assert stale.exit_code == EXIT_STALE
