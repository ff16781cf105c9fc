"""Every row change the demo wrote, accounted for by the worker.

The worker counts each change it handled exactly once in ``/freshkey/stats`` ``events``: applied in
Redis (``change_applied``), superseded by a newer change of the same key within its batch
(``change_superseded``), refused by Redis as not newer (``change_not_newer``: a replay, or overtaken),
dead-lettered (``dead_lettered``) or of a table no binding names (``unbound``); a change that reached
the tiers is also counted once by its op (``c``/``u``/``d``/``r``). :class:`Accounting` sets those
counts against what the demo wrote (the driver's statements, the heartbeats, the sentinel rows) and
says, in words, where they do not add up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPS = ("c", "u", "d", "r")
"""The op of a change event (create, update, delete, read)."""


@dataclass(frozen=True)
class Written:
    """Row changes the demo committed, by who wrote them (each statement changed exactly one row)."""

    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    heartbeats: int = 0
    """Heartbeat rows written (the prober's beats, or the one warm-up beat without a prober)."""
    sentinels: int = 0
    """Sentinel rows written to decide catch-up (one per partition each time)."""

    @property
    def driven(self) -> int:
        """The driver's changes of the sample table."""
        return self.inserts + self.updates + self.deletes

    @property
    def total(self) -> int:
        return self.driven + self.heartbeats + self.sentinels


@dataclass(frozen=True)
class Accounting:
    """The worker's counts of how it handled the changes, against the changes written."""

    written: Written
    applied: int
    superseded: int
    not_newer: int
    dead_lettered: int
    unbound: int
    by_op: Mapping[str, int]

    @classmethod
    def from_events(cls, written: Written, events: Mapping[str, Any]) -> Accounting:
        """From ``/freshkey/stats`` ``events`` (missing counts are 0)."""

        def count(name: str) -> int:
            return int(events.get(name) or 0)

        return cls(
            written=written,
            applied=count("change_applied"),
            superseded=count("change_superseded"),
            not_newer=count("change_not_newer"),
            dead_lettered=count("dead_lettered"),
            unbound=count("unbound"),
            by_op={op: count(op) for op in OPS},
        )

    @property
    def in_tiers(self) -> int:
        """Changes that reached the tiers: applied, superseded or refused as not newer."""
        return self.applied + self.superseded + self.not_newer

    @property
    def seen(self) -> int:
        """Changes the worker accounted for, one way or another."""
        return self.in_tiers + self.dead_lettered + self.unbound

    @property
    def adds_up(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """Why the counts do not add up, one sentence each; empty when they do."""
        problems: list[str] = []
        gap = self.written.total - self.seen
        if gap > 0:
            problems.append(
                f"{gap:,} of the {self.written.total:,} changes written are not accounted for by the worker "
                "(not yet handled, or lost: see events in /freshkey/stats)"
            )
        elif gap < 0:
            problems.append(
                f"the worker accounted for {-gap:,} more changes than the {self.written.total:,} written "
                "(replayed after a restart, or written by something else)"
            )
        by_op = sum(self.by_op.values())
        if by_op != self.in_tiers:
            problems.append(
                f"the worker's counts by op ({by_op:,}) differ from its applied + superseded + not newer "
                f"({self.in_tiers:,})"
            )
        return problems

    def to_json(self) -> dict[str, Any]:
        return {
            "written": {
                "driven": self.written.driven,
                "inserts": self.written.inserts,
                "updates": self.written.updates,
                "deletes": self.written.deletes,
                "heartbeats": self.written.heartbeats,
                "sentinels": self.written.sentinels,
                "total": self.written.total,
            },
            "applied": self.applied,
            "superseded": self.superseded,
            "not_newer": self.not_newer,
            "dead_lettered": self.dead_lettered,
            "unbound": self.unbound,
            "seen": self.seen,
            "by_op": dict(self.by_op),
            "adds_up": self.adds_up,
            "problems": self.problems(),
        }
