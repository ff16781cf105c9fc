"""The binlog checkpoint: where a restarted connector resumes, and the rule that moves it.

Invariant 4: the checkpoint moves only past events Kafka has acknowledged. The connector numbers every
event it produces; at each transaction boundary it records (last event number, position after the
transaction). A delivery callback retires its event number; the checkpoint becomes the position of the
newest boundary whose events, and all events before them, are acknowledged. A restart resumes at a
transaction boundary and may replay part of what Kafka already has: harmless, because versions only go
forward (invariants 1 and 2).
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """A transaction boundary in the source's binlog (and its GTID where the server has them)."""

    file: str
    pos: int
    gtid: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid}


class CheckpointStore:
    """A JSON file, replaced atomically (write to a temporary file, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> BinlogPosition | None:
        try:
            data = json.loads(self.path.read_text())
            gtid = data.get("gtid")
            return BinlogPosition(
                file=str(data["file"]), pos=int(data["pos"]), gtid=str(gtid) if gtid is not None else None
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"checkpoint file {self.path} is unreadable ({exc!r}); move it away to restart "
                "from the current binlog position, or fix it"
            ) from None

    def save(self, position: BinlogPosition) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as fh:
            json.dump(position.to_json(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


class CheckpointTracker:
    """Tracks produced-but-unacknowledged events and the boundary they allow the checkpoint to reach.

    Thread-safe: the binlog thread calls :meth:`produced` and :meth:`boundary`, the Kafka poll thread
    calls :meth:`acknowledged`.
    """

    def __init__(self, start: BinlogPosition) -> None:
        self._lock = threading.Lock()
        self._next_seq = 0
        self._outstanding: set[int] = set()
        self._low = 0  # smallest event number not yet acknowledged
        self._boundaries: deque[tuple[int, BinlogPosition]] = deque()
        self._committed = start
        self._dirty = False

    def produced(self) -> int:
        """Number the next event; it is outstanding until acknowledged."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            self._outstanding.add(seq)
            return seq

    def acknowledged(self, seq: int) -> None:
        with self._lock:
            self._outstanding.discard(seq)
            self._advance()

    def boundary(self, position: BinlogPosition) -> None:
        """Every event numbered so far belongs to transactions that end at or before ``position``."""
        with self._lock:
            self._boundaries.append((self._next_seq, position))
            self._advance()

    def _advance(self) -> None:
        while self._low < self._next_seq and self._low not in self._outstanding:
            self._low += 1
        while self._boundaries and self._boundaries[0][0] <= self._low:
            self._committed = self._boundaries.popleft()[1]
            self._dirty = True

    @property
    def outstanding(self) -> int:
        with self._lock:
            return len(self._outstanding)

    def take_if_moved(self) -> BinlogPosition | None:
        """The checkpoint if it moved since the last call (to save it), else None."""
        with self._lock:
            if not self._dirty:
                return None
            self._dirty = False
            return self._committed

    @property
    def committed(self) -> BinlogPosition:
        with self._lock:
            return self._committed
