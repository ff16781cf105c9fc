"""One chunk between its watermarks: the keys that changed, and the rows that survive. Pure: no I/O.

The watermark algorithm of DBLog (Netflix; Debezium's incremental snapshots work the same way), for one
chunk of one table:

1. the connector writes a LOW watermark row into the signal table;
2. it SELECTs the chunk (primary-key order, after the previous chunk's last key);
3. it writes a HIGH watermark row.

The binlog carries both watermark rows at the places where they committed. Between them (the *window*)
:meth:`Chunk.note` records the primary key of every change of the chunk's table. At the high watermark
:func:`close` drops from the chunk every row whose key changed in the window, because its change, which
is in the stream, is at least as new as what the SELECT may have seen, and emits the rest as ``op: "r"``
events with the high watermark's version (:func:`read_event`). Every row kept holds its value as of the
high watermark: a change committed before the low watermark was visible to the SELECT, and a change
between the watermarks dropped it. So, since versions only go forward:

- a snapshot row never overwrites a newer streamed change: the changes before the high watermark that
  it could overwrite are older than what it holds (its value includes them), and a change after the
  high watermark has a larger version and wins, whichever reaches the cache first;
- a dropped row needs no event: its newer change is in the stream.

This rests on the server making a transaction visible in binlog order (MySQL's and MariaDB's ordered
commit: ``binlog_order_commits``), which is how both commit.

A DDL statement on the chunk's database inside the window spoils the chunk (its rows may have the old
columns): nothing is emitted and the chunk is read again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, Source
from schemas.codec import dead_letter

Key = tuple[Any, ...]
"""A primary key in JSON form (``schemas.values``), in key-column order."""


@dataclass
class Chunk:
    """One chunk of one table, from the moment its low watermark is written until its high watermark
    is read back from the binlog.

    The driver (the thread that writes the watermarks and SELECTs) sets :attr:`rows` before it writes
    the high watermark; the binlog reader opens the window at the low watermark (:attr:`opened`), notes
    changes (:meth:`note`) and closes it at the high watermark (:func:`close`).
    """

    id: str
    table_index: int
    db: str
    table: str
    key_columns: tuple[str, ...]
    """The primary key's columns in index order: the order chunks are read in."""
    event_key_columns: tuple[str, ...] = ()
    """The same columns in the table's column order, as the binlog reader keys a row's changes (the
    Kafka key, hence the partition, of a snapshot row is then its changes'); default: ``key_columns``."""
    rows: list[dict[str, Any]] | None = None
    """The SELECTed rows in JSON form, primary-key order; None until the SELECT returned."""
    last_key: list[Any] | None = None
    """Key of the last row SELECTed (where the next chunk starts); None for an empty chunk."""
    exhausted: bool = False
    """The SELECT returned fewer rows than asked: the table ends with this chunk."""
    opened: bool = False
    touched: set[Key] = field(default_factory=set)
    spoiled: str | None = None

    def key_of(self, image: Mapping[str, Any]) -> Key:
        return tuple(image.get(column) for column in self.key_columns)

    def note(self, item: object) -> None:
        """An item of the stream read between the watermarks: keep the keys of the chunk's table that
        changed (both images: a key change moves a row out of one key and into another)."""
        if isinstance(item, ChangeEvent):
            if item.source.table != self.table or item.source.db != self.db:
                return
            images = [image for image in (item.before, item.after) if image is not None]
            if not images:  # an oversize stand-in carries only its key
                images = [item.key]
            for image in images:
                self.touched.add(self.key_of(image))
        elif isinstance(item, DdlEvent) and item.source.db == self.db:
            self.spoiled = f"DDL in {self.db} between the watermarks: {item.query[:120]}"
        elif isinstance(item, FenceEvent) and (item.source.db, item.source.table) == (self.db, self.table):
            # which rows it changed is unknown: none of the chunk's rows can be vouched for
            self.spoiled = f"an unreadable rows event of {self.db}.{self.table} between the watermarks"


@dataclass(frozen=True, slots=True)
class Closed:
    """What a chunk gave at its high watermark."""

    events: list[ChangeEvent | DeadLetter]
    emitted: int
    """Rows sent as ``op: "r"`` (dead letters not counted)."""
    dropped: int
    """Rows left out because their key changed between the watermarks."""


def close(chunk: Chunk, high: ChangeEvent, *, read_ms: int, keep_changed: bool = False) -> Closed:
    """The events of a chunk at its high watermark ``high`` (the watermark row's change event): every
    row whose key did not change in the window, as ``op: "r"`` with the high watermark's version, in
    primary-key order. ``keep_changed`` keeps the changed rows too (tests only: the stale race the
    watermark step prevents)."""
    if chunk.spoiled is not None or chunk.rows is None:
        return Closed([], 0, 0)
    events: list[ChangeEvent | DeadLetter] = []
    emitted = dropped = 0
    for index, row in enumerate(chunk.rows):
        if not keep_changed and chunk.key_of(row) in chunk.touched:
            dropped += 1
            continue
        event = read_event(
            row,
            chunk.db,
            chunk.table,
            chunk.event_key_columns or chunk.key_columns,
            high,
            index,
            read_ms=read_ms,
        )
        events.append(event)
        emitted += isinstance(event, ChangeEvent)
    return Closed(events, emitted, dropped)


def read_event(
    row: dict[str, Any],
    db: str,
    table: str,
    key_columns: Sequence[str],
    high: ChangeEvent,
    index: int,
    *,
    read_ms: int,
) -> ChangeEvent | DeadLetter:
    """A snapshot row as an ``op: "r"`` change: the high watermark's version, source position and commit
    time (the row's value is the row as of that point of the binlog); its ``event_id`` names the high
    watermark's event and the row's place in the chunk. A row that is no valid change (a key value that is
    neither an integer nor a string) is a dead letter, like the same row from the binlog."""
    hw = high.source
    try:
        return ChangeEvent(
            event_id=f"{hw.server_id}:{hw.file}:{hw.pos}:r{index}",
            op="r",
            key={column: row[column] for column in key_columns},
            after=row,
            source=Source(
                server_id=hw.server_id,
                file=hw.file,
                pos=hw.pos,
                row=index,
                gtid=hw.gtid,
                ts_ms=hw.ts_ms,
                db=db,
                table=table,
            ),
            ts_ms=read_ms,
            version=high.version,
            commit_ts_us=high.commit_ts_us,
            commit_ts_coarse=high.commit_ts_coarse,
        )
    except (ValidationError, KeyError) as exc:
        return dead_letter(
            f"snapshot row of {db}.{table} is not a valid change: {exc}",
            json.dumps(row, default=str).encode(),
            stage="snapshot",
        )
