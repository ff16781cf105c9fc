"""kill -9 of the connector or the worker in the middle of a stream loses no change (invariant 4).

The stream runs in three phases on one connection, without pause: (1) every row changes, (2) while the
killed process is down, rows 0-49 get their final change, (3) after its restart, rows 50-149 do. Rows
0-49 are right in Redis only if the restarted process picked up exactly where the dead one left off.
The negative test restarts the connector without its checkpoint (what a connector that never saved
its binlog position does) and shows the same check finding the lost rows.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

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
                        cur.execute(
                            "INSERT INTO assets VALUES (%s, 'text', %s, %s, UTC_TIMESTAMP(6))",
                            (row, f"row {row} born at {self.count}", self.rng.randbytes(8)),
                        )
                        self.live.add(row)
                    elif self.rng.random() < 0.15:
                        cur.execute("DELETE FROM assets WHERE id = %s", (row,))
                        self.live.discard(row)
                    else:
                        cur.execute(
                            "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s",
                            (f"row {row} at change {self.count}", row),
                        )
                    self.count += 1
                    if self.phase == 3:
                        phase3 += 1
                        if phase3 >= self.stop_after:
                            return
        except BaseException as exc:
            self.error = exc
        finally:
            self.conn.close()


def _crash_and_restart(p: Pipeline, victim: str, *, keep_checkpoint: bool = True) -> Driver:
    driver = Driver(p)
    driver.start()
    time.sleep(1.5)  # phase 1 in full flow
    p.kill9(victim)
    if not keep_checkpoint:
        p.checkpoint_path.unlink()
    driver.phase = 2
    time.sleep(1.5)  # rows 0-49 change for the last time while the victim is dead
    driver.phase = 3
    driver.stop_after = 800
    p.start(victim)
    driver.join(timeout=60)
    assert not driver.is_alive() and driver.error is None, driver.error
    assert driver.count > 2000
    return driver


def test_connector_kill9_mid_stream_then_restart_loses_nothing(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    _crash_and_restart(p, "connector")
    report = p.wait_consistent(timeout=120)
    assert report.stale == 0 and report.missing == 0
    assert report.versions_checked
    assert report.checked >= ROWS - 30


def test_worker_kill9_mid_stream_then_restart_loses_nothing(make_pipeline: Callable[..., Pipeline]) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    _crash_and_restart(p, "worker")
    report = p.wait_consistent(timeout=120)
    assert report.stale == 0 and report.missing == 0
    assert report.versions_checked


def test_without_the_checkpoint_the_same_crash_loses_changes(make_pipeline: Callable[..., Pipeline]) -> None:
    """Protection off: the check above is able to fail."""
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    _crash_and_restart(p, "connector", keep_checkpoint=False)
    p.wait_caught_up()
    report = p.verify()
    assert report.stale + report.missing > 0, "changes made while the connector was down were not lost?"
