"""connectors.snapshot without servers: the watermark window (which rows a chunk keeps), the ``op: "r"``
events and their versions, the acknowledgement ledger, requests and resumes, the rate limit, the
signal rows, and the coordinator driven with the binlog items a session would hand it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connectors.checkpoint import BinlogPosition
from connectors.settings import ConnectorSettings, MySQLSettings
from connectors.snapshot.coordinator import SnapshotCoordinator
from connectors.snapshot.model import (
    ChunkDone,
    Ledger,
    Pacer,
    SnapshotRequest,
    SnapshotState,
    SnapshotStatus,
    SnapshotTable,
    TableProgress,
    apply_chunks,
    position_order,
    take_request,
    void_progress,
)
from connectors.snapshot.reader import keyset_condition, keyset_params
from connectors.snapshot.signals import SignalTable, parse_signal
from connectors.snapshot.store import SnapshotStore
from connectors.snapshot.window import Chunk, close, read_event
from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, Source, binlog_version, decode, encode

SERVER_ID = 4242


def source(db: str, table: str, *, file: str = "binlog.000003", pos: int = 1000, row: int = 0) -> Source:
    return Source(server_id=1, file=file, pos=pos, row=row, ts_ms=1_700_000_000_000, db=db, table=table)


def change(
    op: str,
    key: int,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    db: str = "shop",
    table: str = "assets",
    pos: int = 1000,
    oversize: bool = False,
) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"1:binlog.000003:{pos}:0",
        op=op,  # type: ignore[arg-type]
        key={"id": key},
        before=before,
        after=after,
        source=source(db, table, pos=pos),
        ts_ms=1_700_000_000_100,
        version=binlog_version("binlog.000003", pos, 0),
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
        oversize=oversize,
    )


def signal_row(
    kind: str, name: str, body: dict[str, Any], *, pos: int, server_id: int = SERVER_ID
) -> ChangeEvent:
    """The change event of a signal-table row, as the binlog source gives it."""
    row_id = f"snapshot/{server_id}/{'watermark' if kind in ('low', 'high') else kind}" + (
        f"/{name}" if name else ""
    )
    after = {"id": row_id, "kind": kind, "body": json.dumps(body), "updated_at": "2026-01-01T00:00:00.000000"}
    return ChangeEvent(
        event_id=f"1:binlog.000003:{pos}:0",
        op="c",
        key={"id": row_id},
        after=after,
        source=source("freshkey", "signal", pos=pos),
        ts_ms=1_700_000_000_100,
        version=binlog_version("binlog.000003", pos, 0),
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
    )


def rows(*ids: int) -> list[dict[str, Any]]:
    return [{"id": i, "content": f"row {i}", "updated_at": "2026-01-01T00:00:00.000000"} for i in ids]


def chunk_of(ids: list[int], **kwargs: Any) -> Chunk:
    return Chunk(
        id="c1", table_index=0, db="shop", table="assets", key_columns=("id",), rows=rows(*ids), **kwargs
    )


# -- the window ----------------------------------------------------------------------------------------


def test_rows_changed_between_the_watermarks_are_dropped_the_rest_sent_with_the_high_version() -> None:
    chunk = chunk_of([1, 2, 3, 4, 5], last_key=[5])
    chunk.opened = True
    chunk.note(change("u", 2, before={"id": 2}, after={"id": 2}))
    chunk.note(change("d", 4, before={"id": 4}))
    chunk.note(change("c", 9, after={"id": 9}))  # outside the chunk: nothing to drop
    chunk.note(change("u", 3, before={"id": 3}, after={"id": 3}, table="other"))  # another table
    high = signal_row("high", "", {"chunk": "c1"}, pos=5000)
    closed = close(chunk, high, read_ms=1_700_000_000_200)
    assert closed.dropped == 2 and closed.emitted == 3
    events = [e for e in closed.events if isinstance(e, ChangeEvent)]
    assert [e.key["id"] for e in events] == [1, 3, 5], "primary-key order, changed rows left out"
    for event in events:
        assert event.op == "r" and event.before is None and event.after is not None
        assert event.version == high.version == binlog_version("binlog.000003", 5000, 0)
        assert (event.source.file, event.source.pos) == ("binlog.000003", 5000)
        assert (event.source.db, event.source.table) == ("shop", "assets")
        assert event.commit_ts_us == high.commit_ts_us
        assert decode(encode(event)) == event, "a snapshot row is a valid change on the wire"
    assert len({e.event_id for e in events}) == 3


def test_a_key_change_in_the_window_drops_both_keys() -> None:
    chunk = chunk_of([1, 2, 3])
    # The binlog source turns a key change into a delete of the old key and a create of the new one.
    chunk.note(change("d", 1, before={"id": 1}))
    chunk.note(change("c", 3, after={"id": 3}))
    assert chunk.touched == {(1,), (3,)}
    assert [e.key["id"] for e in close(chunk, signal_row("high", "", {}, pos=9), read_ms=0).events] == [2]  # type: ignore[union-attr]


def test_an_oversize_change_in_the_window_drops_its_row_by_its_key() -> None:
    chunk = chunk_of([1, 2])
    chunk.note(change("u", 2, oversize=True))
    assert chunk.touched == {(2,)}


def test_without_the_watermark_step_changed_rows_are_sent_too() -> None:
    """The negative control's switch: the same chunk keeps every row."""
    chunk = chunk_of([1, 2, 3])
    chunk.note(change("u", 2, before={"id": 2}, after={"id": 2}))
    closed = close(chunk, signal_row("high", "", {}, pos=9), read_ms=0, keep_changed=True)
    assert closed.emitted == 3 and closed.dropped == 0


def test_a_ddl_in_the_window_spoils_the_chunk() -> None:
    chunk = chunk_of([1, 2])
    ddl = DdlEvent(event_id="x", source=source("shop", "*"), query="ALTER TABLE assets DROP content", ts_ms=1)
    chunk.note(ddl)
    assert chunk.spoiled and "ALTER TABLE" in chunk.spoiled
    assert close(chunk, signal_row("high", "", {}, pos=9), read_ms=0).events == []
    other = chunk_of([1])
    other.note(
        DdlEvent(event_id="y", source=source("elsewhere", "*"), query="CREATE TABLE t (a int)", ts_ms=1)
    )
    assert other.spoiled is None


def test_an_unreadable_rows_event_of_the_table_in_the_window_spoils_the_chunk() -> None:
    def fence(table: str) -> FenceEvent:
        return FenceEvent(event_id="f", source=source("shop", table), reason="ValueError: x", ts_ms=1)

    chunk = chunk_of([1, 2])
    chunk.note(fence("other"))
    assert chunk.spoiled is None, "another table's lost rows say nothing of this chunk"
    chunk.note(fence("assets"))
    assert chunk.spoiled and "unreadable rows event" in chunk.spoiled
    assert close(chunk, signal_row("high", "", {}, pos=9), read_ms=0).events == []


def test_the_event_key_follows_the_binlog_readers_column_order() -> None:
    """PRIMARY KEY (b, a) on columns (a, b): chunks go in index order, the Kafka key in column order."""
    high = signal_row("high", "", {}, pos=9)
    row = {"a": 1, "b": "x", "v": 2}
    event = read_event(row, "shop", "pairs", ("a", "b"), high, 0, read_ms=0)
    assert isinstance(event, ChangeEvent) and list(event.key) == ["a", "b"]


def test_a_row_whose_key_is_no_valid_key_is_a_dead_letter() -> None:
    high = signal_row("high", "", {}, pos=9)
    letter = read_event({"id": 1.5, "v": 1}, "shop", "assets", ("id",), high, 0, read_ms=0)
    assert isinstance(letter, DeadLetter) and letter.stage == "snapshot"
    assert "shop.assets" in letter.reason


# -- acknowledgements, progress, requests ------------------------------------------------------------------


def test_the_ledger_counts_a_chunk_once_the_checkpoint_passed_its_high_watermark() -> None:
    ledger = Ledger()
    done = ChunkDone(table=0, last_key=[10], emitted=10, dropped=0, exhausted=False)
    later = ChunkDone(table=0, last_key=[20], emitted=9, dropped=1, exhausted=True)
    ledger.add(BinlogPosition("binlog.000009", 500), done)
    ledger.add(BinlogPosition("binlog.000010", 100), later)
    assert ledger.settle(BinlogPosition("binlog.000009", 499)) == []
    assert ledger.settle(BinlogPosition("binlog.000009", 900)) == [done]
    assert len(ledger) == 1
    assert ledger.settle(BinlogPosition("binlog.000010", 4)) == []  # file order, not text order
    assert ledger.settle(BinlogPosition("binlog.000011", 4)) == [later]
    assert position_order(BinlogPosition("mysql-bin.000100", 4)) > position_order(
        BinlogPosition("mysql-bin.000099", 9)
    )


def state_of(*names: str, status: str = "running") -> SnapshotState:
    return SnapshotState(
        request="r1",
        status=status,  # type: ignore[arg-type]
        tables=[TableProgress(db="shop", table=n, label=f"ns_{n}") for n in names],
        chunk_rows=10,
        started_at=100.0,
        handled=["r1"],
    )


def test_acknowledged_chunks_move_the_progress_and_finish_the_snapshot() -> None:
    state = state_of("a", "b")
    state.tables[1].skipped = "table shop.b has no primary key"
    chunks = [
        ChunkDone(table=0, last_key=[10], emitted=9, dropped=1, exhausted=False),
        ChunkDone(table=0, last_key=None, emitted=0, dropped=0, exhausted=True),
    ]
    assert apply_chunks(state, chunks[:1], now=101) is False
    assert state.tables[0].last_key == [10] and state.rows == 9 and state.dropped == 1
    assert apply_chunks(state, chunks[1:], now=103) is True
    assert state.status == "done" and state.finished_at == 103
    assert state.tables[0].last_key == [10], "an empty last chunk keeps the last key"
    assert state.rows_per_s() == pytest.approx(9 / 3)


def request(name: str, *tables: str, restart: bool = False) -> SnapshotRequest:
    return SnapshotRequest(
        request=name,
        tables=tuple(SnapshotTable(db="shop", table=t, label=f"ns_{t}") for t in tables),
        chunk_rows=10,
        restart=restart,
    )


def test_a_request_resumes_an_unfinished_snapshot_and_a_replay_is_ignored() -> None:
    first = take_request(None, request("r1", "a", "b"), now=1)
    assert first is not None and [t.name for t in first.tables] == ["shop.a", "shop.b"]
    first.tables[0].last_key, first.tables[0].rows = [40], 40
    first.status = "cancelled"
    assert take_request(first, request("r1", "a", "b"), now=2) is None, "a replayed request is taken once"
    resumed = take_request(first, request("r2", "a", "c"), now=3)
    assert resumed is not None
    assert [t.name for t in resumed.tables] == ["shop.a", "shop.c"]
    assert resumed.tables[0].last_key == [40] and resumed.resumed_rows == 40
    assert resumed.tables[1].last_key is None
    assert resumed.status == "running" and resumed.handled == ["r1", "r2"]
    over = take_request(first, request("r3", "a", restart=True), now=4)
    assert over is not None and over.tables[0].last_key is None and over.resumed_rows == 0


def test_after_a_finished_snapshot_a_request_starts_over() -> None:
    state = state_of("a", status="done")
    state.tables[0].last_key, state.tables[0].done = [99], True
    again = take_request(state, request("r2", "a"), now=5)
    assert again is not None and again.tables[0].last_key is None and not again.tables[0].done


def test_a_gap_voids_the_progress() -> None:
    state = state_of("a")
    state.tables[0].last_key, state.tables[0].rows = [5], 5
    voided = void_progress(state, "binlog purged")
    assert voided.status == "cancelled" and voided.tables[0].last_key is None and voided.tables[0].rows == 0
    assert voided.handled == ["r1"]


def test_the_pacer_keeps_to_the_rate_without_bursts() -> None:
    pacer = Pacer(1000)
    assert pacer.wait_s(0.0) == 0
    pacer.read(500, 0.0)
    assert pacer.wait_s(0.1) == pytest.approx(0.4)
    pacer.read(500, 0.5)
    assert pacer.wait_s(0.5) == pytest.approx(0.5)
    pacer.read(500, 10.0)  # after a long pause: no budget saved up
    assert pacer.wait_s(10.0) == pytest.approx(0.5)
    assert Pacer(0).wait_s(0) == 0


def test_keyset_pagination_for_composite_keys() -> None:
    assert keyset_condition(["id"]) == "(`id` > %s)"
    assert keyset_condition(["a", "b"]) == "(`a` > %s) OR (`a` = %s AND `b` > %s)"
    assert keyset_params([1, "x"]) == [1, 1, "x"]


# -- signal rows -----------------------------------------------------------------------------------------


def test_signal_rows_are_read_for_this_connector_only() -> None:
    mine = parse_signal(signal_row("request", "r9", {"request": "r9"}, pos=1), SERVER_ID)
    assert (
        mine is not None and mine.kind == "request" and mine.name == "r9" and mine.body == {"request": "r9"}
    )
    assert parse_signal(signal_row("request", "r9", {}, pos=1, server_id=7), SERVER_ID) is None
    high = parse_signal(signal_row("high", "", {"chunk": "c"}, pos=1), SERVER_ID)
    assert high is not None and high.kind == "high" and high.body == {"chunk": "c"}
    gone = signal_row("request", "r9", {}, pos=1)
    deleted = gone.model_copy(update={"op": "d", "before": gone.after, "after": None})
    assert parse_signal(deleted, SERVER_ID) is None
    broken = gone.model_copy(update={"after": {**gone.after, "body": "{not json"}})  # type: ignore[dict-item]
    assert parse_signal(broken, SERVER_ID) is None


def test_signal_table_names_and_grant() -> None:
    table = SignalTable("freshkey.signal", SERVER_ID)
    assert table.sql_name == "`freshkey`.`signal`" and table.key == ("freshkey", "signal")
    assert table.row_id("request", "abc") == f"snapshot/{SERVER_ID}/request/abc"
    assert "GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON `freshkey`.*" in table.grant("connector")


def test_settings_name_the_signal_table_and_the_progress_file(tmp_path: Path) -> None:
    settings = ConnectorSettings(checkpoint_path=tmp_path / "cp.json")
    assert settings.signal_table == "freshkey.signal"
    assert settings.snapshot_state_path == tmp_path / "cp.snapshot.json"
    with pytest.raises(ValueError, match="signal_table"):
        ConnectorSettings(signal_table="no_database")


def test_the_progress_file_round_trips_and_an_unreadable_one_is_set_aside(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "s.json")
    assert store.load() is None
    store.save(state_of("a"))
    assert store.load() == state_of("a")
    (tmp_path / "s.json").write_text("{broken")
    assert store.load() is None
    assert (tmp_path / "s.json.unreadable").exists()


# -- the coordinator, driven like a session ------------------------------------------------------------


@pytest.fixture
def coordinator(tmp_path: Path) -> SnapshotCoordinator:
    return SnapshotCoordinator(
        MySQLSettings(server_id=SERVER_ID), ConnectorSettings(checkpoint_path=tmp_path / "checkpoint.json")
    )


def test_a_chunk_from_request_to_acknowledgement(coordinator: SnapshotCoordinator) -> None:
    committed = [BinlogPosition("binlog.000003", 4)]
    coordinator._committed = lambda: committed[0]
    body = request("r1", "assets").model_dump(mode="json")
    assert coordinator.on_signal(signal_row("request", "r1", body, pos=100)) == []
    assert coordinator.state is not None and coordinator.state.status == "running"
    assert coordinator._next_job() == ("r1", 0, None)
    # What the driver does: the chunk is registered before its low watermark is written ...
    chunk = Chunk(id="c1", table_index=0, db="shop", table="assets", key_columns=("id",))
    coordinator.chunk = chunk
    assert coordinator._next_job() is None, "one chunk at a time"
    coordinator.observe(change("u", 1, before={"id": 1}, after={"id": 1}, pos=150))  # before the low one
    coordinator.on_signal(signal_row("low", "", {"chunk": "c1"}, pos=200))
    assert chunk.opened
    coordinator.observe(change("u", 2, before={"id": 2}, after={"id": 2}, pos=250))
    chunk.rows, chunk.last_key, chunk.exhausted = rows(1, 2, 3), [3], True  # ... and read before the high one
    assert coordinator.on_signal(signal_row("high", "", {"chunk": "other"}, pos=290)) == []
    sent = coordinator.on_signal(signal_row("high", "", {"chunk": "c1"}, pos=300))
    assert [e.key["id"] for e in sent if isinstance(e, ChangeEvent)] == [1, 3]
    assert coordinator.chunk is None
    coordinator.read_to(BinlogPosition("binlog.000003", 320))
    assert coordinator.state.tables[0].rows == 0, "not yet acknowledged by Kafka"
    committed[0] = BinlogPosition("binlog.000003", 320)
    coordinator.read_to(None)
    assert (
        coordinator.state.status == "done" and coordinator.state.rows == 2 and coordinator.state.dropped == 1
    )
    saved = coordinator.store.load()
    assert saved is not None and saved.status == "done" and saved.tables[0].last_key == [3]
    status = coordinator.status_body()
    assert status is not None and SnapshotStatus.model_validate(status).rows == 2


def test_a_cancel_stops_new_chunks_and_a_new_request_resumes(coordinator: SnapshotCoordinator) -> None:
    coordinator.on_signal(signal_row("request", "r1", request("r1", "assets").model_dump(mode="json"), pos=1))
    assert coordinator.state is not None
    coordinator.state.tables[0].last_key = [50]
    coordinator.on_signal(signal_row("cancel", "r1", {"request": "other"}, pos=2))
    assert coordinator.state.status == "running", "a cancel of another request is not ours"
    coordinator.on_signal(signal_row("cancel", "r1", {"request": "r1"}, pos=3))
    assert coordinator.state.status == "cancelled" and coordinator._next_job() is None
    coordinator.on_signal(signal_row("request", "r2", request("r2", "assets").model_dump(mode="json"), pos=4))
    assert coordinator._next_job() == ("r2", 0, [50])


def test_a_gap_voids_the_progress_and_asks_for_a_refill_before_the_fence(tmp_path: Path) -> None:
    coordinator = SnapshotCoordinator(
        MySQLSettings(server_id=SERVER_ID),
        ConnectorSettings(checkpoint_path=tmp_path / "checkpoint.json", snapshot_chunk_rows=77),
        after_gap=[SnapshotTable(db="shop", table="assets", label="assets")],
    )
    seen: list[SnapshotState | None] = []

    def fence(reason: str) -> None:
        seen.append(coordinator.store.load())

    hook = coordinator.gap_hook(fence)
    assert hook is not None
    hook("binlog.000001 has been purged")
    saved = seen[0]
    assert saved is not None, "the refill was on disk before the fence ran"
    assert saved.status == "running" and saved.chunk_rows == 77 and "purged" in saved.reason
    assert coordinator.gap_hook(None) is None, "without a fence hook a gap stays a configuration error"


def test_invalid_requests_are_ignored(coordinator: SnapshotCoordinator) -> None:
    coordinator.on_signal(signal_row("request", "bad", {"request": "bad", "tables": []}, pos=1))
    assert coordinator.state is None
