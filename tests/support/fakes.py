"""Service-free stand-ins for the observation tests: a clock the test moves, a tier that acknowledges at
once, change messages as the connector writes them, and the exact percentile the lag sketch is checked
against."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cache_writer import ActionResult, CacheAction, Outcome
from pipeline.observe.sketch import rank
from schemas import ChangeEvent, encode

T0 = 1_800_000_000.0
"""A start time (unix s) on a whole second, far from any real clock."""


class Clock:
    """A clock (unix s, a float like ``time.time()``) that stands still until the test moves it."""

    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def settle(self) -> None:
        """To the start of the next second: the seconds recorded so far are in the windows."""
        self.now = math.floor(self.now) + 1.0

    @property
    def ms(self) -> float:
        """The time in milliseconds (a Kafka timestamp)."""
        return self.now * 1000


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The exact nearest-rank ``q`` percentile of ``values`` (the sketch's definition)."""
    ordered = sorted(values)
    return ordered[rank(q, len(ordered)) - 1]


class InstantTier:
    """A cache tier that acknowledges every action at once: what is left to time or count is the
    processor's own work."""

    name = "redis"

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        return [ActionResult(a, Outcome.APPLIED, None) for a in actions]

    async def close(self) -> None:
        pass


def update_message(row_id: int, *, table: str, commit_us: int, ts_ms: int) -> bytes:
    """The change-topic message of an update of row ``row_id`` of ``shop.<table>`` (columns id and name),
    version ``row_id + 1``, committed at ``commit_us`` (µs precise) and read by the connector at
    ``ts_ms``."""
    row = {"id": row_id, "name": f"n{row_id}"}
    return encode(
        ChangeEvent.model_validate(
            {
                "event_id": f"e{row_id}",
                "op": "u",
                "key": {"id": row_id},
                "before": row,
                "after": row,
                "source": {
                    "server_id": 1,
                    "file": "binlog.000001",
                    "pos": row_id,
                    "ts_ms": 0,
                    "db": "shop",
                    "table": table,
                },
                "ts_ms": ts_ms,
                "version": row_id + 1,
                "commit_ts_us": commit_us,
                "commit_ts_coarse": False,
            }
        )
    )
