"""connectors.binlog.lost: what a bound table's lost changes become (dead letters and fences)."""

from __future__ import annotations

import base64

from connectors.binlog.lost import fence_event, rows_lost, unreadable_rows
from connectors.binlog.translate import EventOrigin, RowsEvent
from schemas import DeadLetter, FenceEvent, decode, encode
from schemas.codec import dead_letter

FILE = "binlog.000007"
END_POS = 4711
COMMIT_S = 1_700_000_000
READ_MS = 1_700_000_000_500
ORIGIN = EventOrigin(server_id=1, file=FILE, end_pos=END_POS, timestamp_s=COMMIT_S, gtid="0-1-42")


def test_an_unreadable_rows_event_is_a_dead_letter_and_a_fence_of_its_table() -> None:
    error = ValueError("day is out of range for month")
    letter, fence = unreadable_rows(
        ORIGIN, "shop", "assets", error, b"\x00raw event", read_ms=1_700_000_000_777
    )
    assert isinstance(letter, DeadLetter) and isinstance(fence, FenceEvent)
    assert letter.stage == "connector-binlog" and base64.b64decode(letter.original_b64) == b"\x00raw event"
    assert letter.reason == fence.reason
    assert (
        fence.reason
        == "a rows event of shop.assets could not be read: ValueError: day is out of range for month"
    )
    assert (fence.source.db, fence.source.table, fence.source.file, fence.source.pos) == (
        "shop",
        "assets",
        FILE,
        END_POS,
    )
    assert fence.ts_ms == 1_700_000_000_777 and decode(encode(fence)) == fence
    _, long = unreadable_rows(ORIGIN, "shop", "assets", ValueError("x" * 5000), b"", read_ms=1)
    assert len(long.reason) == 1000, "bounded: the message stays small"


def test_a_fence_event_per_table_has_its_own_id() -> None:
    first = fence_event(ORIGIN, "shop", "assets", "lost", read_ms=READ_MS)
    second = fence_event(ORIGIN, "media", "clips", "lost", read_ms=READ_MS)
    assert first.event_id == f"1:{FILE}:{END_POS}:fence:shop.assets" and first.event_id != second.event_id
    assert (second.source.db, second.source.table, second.reason) == ("media", "clips", "lost")


def test_rows_that_became_dead_letters_fence_their_table_and_the_reason_quotes_no_value() -> None:
    rows = RowsEvent(
        kind="update", schema="shop", table="assets", primary_key=(), rows=[], column_types={}, origin=ORIGIN
    )
    letter = dead_letter("no primary key: SECRET", b"{}", stage="connector")
    assert rows_lost(rows, [], read_ms=READ_MS) is None
    fence = rows_lost(rows, [letter, letter], read_ms=READ_MS)
    assert fence is not None and (fence.source.db, fence.source.table) == ("shop", "assets")
    assert fence.reason.startswith("2 row change(s) of shop.assets") and "SECRET" not in fence.reason
