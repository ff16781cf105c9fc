"""What is known of each partition of the change topic: the figures :class:`~pipeline.observe.progress.
ConsumerProgress` keeps, and the rows and snapshots it answers with."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PartitionState = Literal["caught_up", "behind", "stalled", "unknown"]
OBSERVATIONS_PER_PARTITION = 256
"""Bound on the (high watermark, time) observations kept per partition (see :class:`ConsumerProgress`)."""


class PartitionProgress(BaseModel):
    """One partition of the change topic as this worker sees it: a value of ``/freshkey/consumer-lag``.

    ``state``: ``caught_up`` (nothing waits), ``behind`` (changes wait, the oldest for at most the
    consistency window), ``stalled`` (the oldest waits longer than the window) or ``unknown`` (this worker
    has no figure: not assigned to it, or no acknowledged position or high watermark yet). ``lag`` and
    ``age_ms`` are this worker's figures and are null whenever the state is unknown; for a partition not
    assigned here, ``group_lag`` and ``group_age_ms`` say what the worker group's committed offset shows.
    """

    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int | None = Field(description="None only while the topic's partitions are not known at all.")
    state: PartitionState
    assigned: bool = Field(description="Assigned to this worker now.")
    lag: int | None = Field(
        description="Messages not yet acknowledged here: highwater - acked_offset - 1; null: unknown."
    )
    age_ms: float | None = Field(
        description="How long the oldest of them has been waiting, at least (0: caught up; null: unknown)."
    )
    acked_offset: int | None = Field(
        description="Every offset up to this one is applied (acknowledged here, or committed by the group)."
    )
    highwater: int | None = Field(description="Offset of the next message to be written, as last seen.")
    committed_offset: int | None = Field(
        description="The worker group's committed offset (the next one to consume), as last read."
    )
    group_lag: int | None = Field(
        None, description="Not assigned here: highwater - committed_offset (not committed by the group)."
    )
    group_age_ms: float | None = Field(
        None,
        description="Not assigned here: how long the oldest message above the group's committed offset had "
        "been waiting, at least, when that offset was read.",
    )
    unknown_ms: float | None = Field(
        None, description="Assigned here but unknown: for how long (it counts against the SLA after a grace)."
    )
    reason: str | None = Field(None, description="Why the state is unknown.")

    @property
    def key(self) -> str:
        """``topic/partition``, the key of this row in ``/freshkey/consumer-lag``."""
        return f"{self.topic}/{'?' if self.partition is None else self.partition}"


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """What :meth:`ConsumerProgress.snapshot` saw at ``at_ms``.

    ``partitions``: the partitions of the change topic assigned to this worker, or, while none is, every
    partition of the topic it knows of (all ``unknown``); never empty. ``unassigned_ms``: how long no
    partition of the topic has been assigned here (None while one is).
    """

    at_ms: float
    topic: str
    window_ms: float
    grace_ms: float
    partitions: tuple[PartitionProgress, ...]
    unassigned_ms: float | None

    @property
    def unknown(self) -> int:
        """How many of ``partitions`` have no figure."""
        return sum(p.state == "unknown" for p in self.partitions)

    @property
    def oldest_ms(self) -> float | None:
        """The age of the oldest waiting change on the assigned partitions whose age is known."""
        ages = [p.age_ms for p in self.partitions if p.assigned and p.age_ms is not None]
        return max(ages) if ages else None


@dataclass(slots=True)
class PartitionFigures:
    """What is known of one partition. Offsets follow Kafka: a position or high watermark is the next
    offset (to acknowledge, to be written)."""

    position: int | None = None
    """Every offset below it is applied: acknowledged here or committed by the group. None: unknown."""
    high: int | None = None
    """The highest known end of the log: a broker's figure, or past a message received or acknowledged."""
    high_seen: bool = False
    """A broker's high watermark arrived (``high`` from messages alone says nothing of what follows them)."""
    committed: int | None = None
    committed_at_ms: float | None = None
    assigned_since_ms: float | None = None
    fresh: bool = True
    """Nothing received since the (re)assignment: the first message received is where the consumer started."""
    floor: int | None = None
    """Assigned with no position: the high watermark then; offsets from here on came later, unacknowledged."""
    seen: list[tuple[int, float]] = field(default_factory=list)
    """(high watermark, ms): every offset below ``high`` existed at that time. Both strictly increasing
    (a Pareto frontier: an observation another one beats on both counts is dropped)."""

    def observe(self, high: int, at_ms: float) -> None:
        seen = self.seen
        i = bisect.bisect_left(seen, high, key=lambda o: o[0])
        if i < len(seen) and seen[i][1] <= at_ms:
            return  # already known: at least these offsets existed earlier
        j = i + 1 if i < len(seen) and seen[i][0] == high else i
        k = bisect.bisect_left(seen, at_ms, lo=0, hi=i, key=lambda o: o[1])
        seen[k:j] = [(high, at_ms)]
        if len(seen) > OBSERVATIONS_PER_PARTITION:
            # Dropping the second newest makes the offsets it covered look younger (the next observation
            # is later): ages stay lower bounds, never inflated.
            del seen[-2]

    def existed_at(self, offset: int) -> float | None:
        """The earliest time ``offset`` is known to have existed (been written), or None."""
        i = bisect.bisect_right(self.seen, offset, key=lambda o: o[0])
        return self.seen[i][1] if i < len(self.seen) else None

    def restart(self, position: int) -> None:
        """The log moved back under the acknowledged position (a topic recreated after a broker lost it,
        or a partition handed back at an earlier committed offset): forget what was known of the old log,
        keep only what this acknowledgement says; the next broker figures fill in the rest."""
        self.position = position
        self.high = position
        self.high_seen = False
        self.committed = None
        self.committed_at_ms = None
        self.floor = None
        self.seen.clear()

    def advance(self, position: int) -> None:
        if self.position is None or position > self.position:
            self.position = position
        if self.high is None or self.position > self.high:
            self.high = self.position  # offsets below a position exist: the log's end is at least there
        del self.seen[: bisect.bisect_right(self.seen, self.position, key=lambda o: o[0])]
