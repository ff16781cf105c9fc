"""connectors.binlog.source: a rows event it cannot read becomes a dead letter and a fence of its table,
here MySQL's partial JSON update (which MariaDB, the servers of the integration tests, never writes; the
same path with a real server's event is tests/integration/test_connector_faults.py)."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

from pymysqlreplication.event import XidEvent
from pymysqlreplication.row_event import PartialUpdateRowsEvent

from connectors.binlog.source import BinlogSource, Boundary
from connectors.checkpoint import BinlogPosition
from connectors.settings import MySQLSettings
from schemas import DeadLetter, FenceEvent


def event(kind: type, schema: str, table: str, log_pos: int) -> Any:
    """An event of exactly ``kind`` (what the reader's exact-class filter sees), without parsing bytes."""
    made = object.__new__(kind)
    made.schema, made.table, made.timestamp = schema, table, 1_700_000_000
    made.packet = SimpleNamespace(server_id=1, log_pos=log_pos, packet=SimpleNamespace(_data=b"\x00raw"))
    return made


class Stream:
    log_file = "binlog.000009"
    log_pos = 4

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def __iter__(self) -> Any:
        for item in self.events:
            self.log_pos = item.packet.log_pos
            yield item


def test_a_partial_json_update_of_a_bound_table_is_a_dead_letter_and_a_fence() -> None:
    source = BinlogSource(MySQLSettings(), [("shop", "assets")], start=BinlogPosition("binlog.000009", 4))
    stream = Stream(
        [
            event(PartialUpdateRowsEvent, "shop", "other", 100),  # not bound: nothing
            event(PartialUpdateRowsEvent, "shop", "assets", 200),
            event(XidEvent, "", "", 300),
        ]
    )
    items = list(source._read(stream))  # type: ignore[arg-type]
    letter, fence, boundary = items
    assert isinstance(letter, DeadLetter) and letter.stage == "connector-binlog"
    assert "PARTIAL_JSON" in letter.reason and base64.b64decode(letter.original_b64) == b"\x00raw"
    assert isinstance(fence, FenceEvent) and fence.reason == letter.reason
    assert (fence.source.db, fence.source.table, fence.source.file, fence.source.pos) == (
        "shop",
        "assets",
        "binlog.000009",
        200,
    )
    assert boundary == Boundary(BinlogPosition("binlog.000009", 300, None)), "the stream goes on"
