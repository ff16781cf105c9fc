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
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from connectors.exceptions import ConfigurationError


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """A transaction boundary in the source's binlog (and its GTID where the server has them)."""

    file: str
    pos: int
    gtid: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid}


class CheckpointError(ConfigurationError, ValueError):
    """The checkpoint file cannot be read; the message names the file and what to do."""


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """Everything the checkpoint file records.

    ``topic_ends``: for ``change_topic``, partition -> the offset after the newest event Kafka
    acknowledged there. A later session that finds a partition's end *below* it knows the topic lost
    acknowledged events (a broker that lost its data, a topic deleted and recreated), even when someone
    else recreated the topic meanwhile. ``pending_gap``: a gap was found and the fence hook has not yet
    returned; until it does, every session calls it again before producing anything.
    """

    position: BinlogPosition
    change_topic: str | None = None
    topic_ends: Mapping[int, int] = field(default_factory=dict)
    pending_gap: str | None = None


class CheckpointStore:
    """A JSON file, replaced atomically (write to a temporary file, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> BinlogPosition | None:
        """The saved position, or None when there is no checkpoint yet."""
        state = self.load_state()
        return state.position if state is not None else None

    def load_state(self) -> CheckpointState | None:
        """The saved state, or None when there is no checkpoint yet; CheckpointError when unreadable."""
        try:
            data = json.loads(self.path.read_text())
            gtid = data.get("gtid")
            position = BinlogPosition(
                file=str(data["file"]), pos=int(data["pos"]), gtid=str(gtid) if gtid is not None else None
            )
            topic = data.get("change_topic")
            ends = {int(p): int(o) for p, o in (data.get("topic_ends") or {}).items()}
            gap = data.get("pending_gap")
            return CheckpointState(
                position=position,
                change_topic=str(topic) if topic is not None else None,
                topic_ends=ends,
                pending_gap=str(gap) if gap is not None else None,
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint file {self.path} is unreadable ({exc!r}); move it away to restart "
                "from the current binlog position (changes since the lost checkpoint are then not "
                "replayed: prefer `freshkey connector --accept-gap`, which fences the caches), or fix it"
            ) from None

    def save(
        self,
        position: BinlogPosition,
        *,
        change_topic: str | None = None,
        topic_ends: Mapping[int, int] | None = None,
        pending_gap: str | None = None,
    ) -> None:
        """Replace the checkpoint; the optional fields are written only when given."""
        data = position.to_json()
        if change_topic is not None:
            data["change_topic"] = change_topic
            data["topic_ends"] = {str(p): o for p, o in sorted((topic_ends or {}).items())}
        if pending_gap is not None:
            data["pending_gap"] = pending_gap
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as fh:
            json.dump(data, fh)
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


class CheckpointSaver:
    """Saves a session's checkpoint whenever it moves, from a background thread.

    Each save records the tracker's committed position with, for ``change_topic``, partition -> the
    offset after the newest event Kafka acknowledged (``acked_ends()``, merged into the ends the session
    started with: an end never goes down). :meth:`stop` saves a last time, so that a session that ends
    leaves the newest acknowledged position on disk.
    """

    SAVE_EVERY_S = 0.1

    def __init__(
        self,
        store: CheckpointStore,
        tracker: CheckpointTracker,
        *,
        change_topic: str,
        topic_ends: Mapping[int, int],
        acked_ends: Callable[[], Mapping[int, int]],
    ) -> None:
        self._store = store
        self._tracker = tracker
        self._topic = change_topic
        self._ends = dict(topic_ends)
        self._acked_ends = acked_ends
        self._saved = (time.monotonic(), tracker.committed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-saver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.SAVE_EVERY_S):
            moved = self._tracker.take_if_moved()
            if moved is not None:
                self._save(moved)

    def _save(self, position: BinlogPosition) -> None:
        self._ends.update({p: end for p, end in self._acked_ends().items() if end > self._ends.get(p, 0)})
        self._store.save(position, change_topic=self._topic, topic_ends=self._ends)
        self._saved = (time.monotonic(), position)

    def age(self) -> float:
        """Seconds since the saved checkpoint last moved; 0 while no read event waits for it."""
        saved_at, position = self._saved
        if self._tracker.outstanding == 0 and position == self._tracker.committed:
            return 0.0
        return time.monotonic() - saved_at

    def stop(self) -> None:
        """Stop the thread, then save once more if the checkpoint moved or Kafka acknowledged events."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=2)
        moved = self._tracker.take_if_moved()
        if moved is not None or self._acked_ends():
            self._save(moved if moved is not None else self._tracker.committed)
