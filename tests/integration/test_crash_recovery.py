"""kill -9 of the connector or the worker in the middle of a stream loses no change (invariant 4).

The stream runs in three phases on one connection, without pause: (1) every row changes, (2) while the
killed process is down, rows 0-49 get their final change, (3) after its restart, rows 50-149 do. Rows
0-49 are right in Redis only if the restarted process picked up exactly where the dead one left off.
The negative test restarts the connector without its checkpoint (what a connector that never saved
its binlog position does) and shows the same check finding the lost rows.

Each kill is checked to have hit the victim with work in flight (the connector's checkpoint behind the
binlog end, or the worker's group behind the topic's end), and the final cache is compared with what the
driver itself committed, row by row, so the check does not rest on the verifier's own wait.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from connectors.checkpoint import CheckpointStore
from pipeline.demo.catchup import connector_reached
from tests.support.kafka import committed_offsets, end_offsets
from tests.support.pipeline import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 150
RATE = 800.0


class Driver(threading.Thread):
    """Writes changes at RATE per second; ``phase`` selects which rows it touches."""

    def __init__(self, p: Pipeline) -> None:
        super().__init__(daemon=True)
        self.conn = p.mysql.connect(p.database)
        self.phase = 1
        self.stop_after = 0  # changes to make in phase 3 before stopping
        self.count = 0
        self.error: BaseException | None = None
        self.rng = random.Random(3)
        self.live: set[int] = set()
        self.content: dict[int, str] = {}
        """The last content committed per live row: what the cache must end up holding."""

    def rows(self) -> range:
        return {1: range(ROWS), 2: range(50), 3: range(50, ROWS)}[self.phase]

    def run(self) -> None:
        try:
            with self.conn.cursor() as cur:
                start = time.monotonic()
                phase3 = 0
                while True:
                    delay = start + self.count / RATE - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    row = self.rng.choice(self.rows())
                    if row not in self.live:
                        content = f"row {row} born at {self.count}"
                        cur.execute(
                            "INSERT INTO assets VALUES (%s, 'text', %s, %s, UTC_TIMESTAMP(6))",
                            (row, content, self.rng.randbytes(8)),
                        )
                        self.live.add(row)
                        self.content[row] = content
                    elif self.rng.random() < 0.15:
                        cur.execute("DELETE FROM assets WHERE id = %s", (row,))
                        self.live.discard(row)
                        self.content.pop(row, None)
                    else:
                        content = f"row {row} at change {self.count}"
                        cur.execute(
                            "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s",
                            (content, row),
                        )
                        self.content[row] = content
                    self.count += 1
                    if self.phase == 3:
                        phase3 += 1
                        if phase3 >= self.stop_after:
                            return
        except BaseException as exc:
            self.error = exc
        finally:
            self.conn.close()


def _in_flight(p: Pipeline, victim: str) -> bool:
    """Whether the victim holds work it has not made durable: the connector's checkpoint is behind the
    binlog end, or the worker group's committed offsets are behind the topic's end."""
    if victim == "connector":
        saved = CheckpointStore(p.checkpoint_path).load()
        return saved is not None and not connector_reached(saved, p.master_position())
    committed = committed_offsets(p.kafka, p.app_id, p.change_topic)
    ends = end_offsets(p.kafka, p.change_topic)
    return any((committed.get(partition) or 0) < end for partition, end in ends.items())


def _crash_and_restart(p: Pipeline, victim: str, *, keep_checkpoint: bool = True) -> Driver:
    driver = Driver(p)
    driver.start()
    # Phase 1 in full flow: the worker has applied changes and the victim is busy.
    p.wait(lambda: (p.stats() or {}).get("events", {}).get("u", 0) > 50, 60, "the stream in full flow")
    p.wait(lambda: _in_flight(p, victim), 10, f"the {victim} to hold unacknowledged work")
    p.kill9(victim)
    assert _in_flight(p, victim), f"the {victim} was killed with nothing in flight: the test proves nothing"
    if not keep_checkpoint:
        p.checkpoint_path.unlink()
    driver.phase = 2
    changes_before = driver.count
    p.wait(lambda: driver.count >= changes_before + 400, 30, "rows 0-49 to change while the victim is dead")
    driver.phase = 3
    driver.stop_after = 800
    p.start(victim)
    driver.join(timeout=60)
    assert not driver.is_alive() and driver.error is None, driver.error
    assert driver.count > 2000
    return driver


def _differences(p: Pipeline, driver: Driver) -> list[str]:
    """Rows whose entry is not what the driver last committed (live: its content; deleted: no live entry)."""
    wrong = []
    for row in range(ROWS):
        entry = p.entry(row)
        live = entry is not None and not entry.tombstone
        if row in driver.content:
            want = driver.content[row].encode()
            if not live or entry is None or entry.value is None or want not in entry.value:
                wrong.append(f"row {row}: want {want!r}, cached {entry}")
        elif live:
            wrong.append(f"row {row}: deleted, still cached {entry}")
    return wrong


def test_connector_kill9_mid_stream_then_restart_loses_nothing(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    driver = _crash_and_restart(p, "connector")
    p.wait(lambda: not _differences(p, driver), 120, "the cache to hold every committed change")
    assert not _differences(p, driver)
    assert p.verify().versions_checked


def test_worker_kill9_mid_stream_then_restart_loses_nothing(make_pipeline: Callable[..., Pipeline]) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    driver = _crash_and_restart(p, "worker")
    p.wait(lambda: not _differences(p, driver), 120, "the cache to hold every committed change")
    assert p.verify().versions_checked


def test_without_the_checkpoint_the_same_crash_loses_changes(make_pipeline: Callable[..., Pipeline]) -> None:
    """Protection off: the check above is able to fail."""
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    driver = _crash_and_restart(p, "connector", keep_checkpoint=False)
    p.wait_caught_up()
    assert _differences(p, driver), "changes made while the connector was down were not lost?"
