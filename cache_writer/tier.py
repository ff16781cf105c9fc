"""The contract every cache tier implements: apply a batch of versioned actions, in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol


class Outcome(StrEnum):
    APPLIED = "applied"
    """The write landed, or the tombstone was laid."""
    NOT_NEWER = "not_newer"
    """Refused: the tier already holds this version or a newer one (entry or tombstone); a replay, or
    a change that a newer one overtook. Not an error, and nothing stale: the newer state stays."""
    FAILED = "failed"
    """The tier refused this one action for a reason a retry cannot cure (e.g. the key holds another
    type); ``ActionResult.error`` says why. The rest of the batch was applied."""


@dataclass(frozen=True, slots=True)
class CacheAction:
    """One compare-and-set on one entry: write the value, or replace the entry with a tombstone."""

    kind: Literal["write", "invalidate"]
    key: str
    version: int
    commit_ts_us: int
    value: bytes | None = None
    signature: str | None = None
    """Writes: the schema signature the value was built under (hash field ``s``); None: the namespace
    has no model and the entry carries none. With a signature the tier also reads the namespace's
    ``$signature`` key in the same script (an equal version built under the active signature replaces
    an entry built under another one)."""
    row: str | None = None
    """Writes of semantic entries: the row key of the row the value was built from (field ``k``)."""

    def __post_init__(self) -> None:
        if (self.kind == "write") != (self.value is not None):
            raise ValueError("a write carries a value; an invalidation does not")


@dataclass(frozen=True, slots=True)
class ActionResult:
    action: CacheAction
    outcome: Outcome
    previous_version: int | None
    """The version the tier held before (None when the key was absent)."""
    error: str | None = None
    """Why a FAILED action failed."""


class CacheTier(Protocol):
    """What the pipeline needs of a tier: apply versioned actions, say whether it answers, and empty it
    (a fenced tier is flushed of everything freshkey wrote before it is trusted again)."""

    name: str
    channel: str | None
    """The Pub/Sub channel its applied changes are announced on (in-process tiers listen), if any."""

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        """Apply every action atomically per entry, in order. Raise TierUnavailableError when the tier
        cannot take the batch now (a retry may succeed); an action refused for good is a FAILED result."""
        ...

    async def load_scripts(self) -> None:
        """Prepare the tier (load its scripts); raise TierUnavailableError when it does not answer."""
        ...

    async def ping(self) -> None:
        """Raise TierUnavailableError unless the tier answers now."""
        ...

    async def flush(self, prefix: str, *, flushdb: bool = False) -> int:
        """Remove every entry under ``prefix``; returns how many (-1: the whole database was flushed)."""
        ...

    async def close(self) -> None: ...
