"""The contract every cache tier implements: apply a batch of versioned actions, in order, and every other
read and write the pipeline makes in a tier (:class:`CacheTier`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from cache_writer.entries import Entry
    from cache_writer.signatures import NamespaceSignatures, SetResult, SignatureRecord


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


@runtime_checkable
class SignatureReader(Protocol):
    """What reads the namespaces' signatures (the model registry, on every batch): every tier, or
    :class:`~cache_writer.signatures.ClientSignatures` over a bare client."""

    async def read_signatures(self, prefix: str, namespaces: Iterable[str]) -> dict[str, NamespaceSignatures]:
        """The signature state of each namespace."""
        ...

    async def read_active_signatures(self, prefix: str, namespaces: Sequence[str]) -> list[str]:
        """``<active>/<pending>`` signature of each namespace, in order: cheap, to see what changed."""
        ...


class CacheTier(SignatureReader, Protocol):
    """Everything the pipeline does in a tier, so that no caller needs the client behind it: apply
    versioned actions, read entries back, keep the namespaces' signatures, say whether it answers, and
    empty it (a fenced tier is flushed of everything freshkey wrote before it is trusted again).

    Every method raises :class:`~cache_writer.exceptions.TierUnavailableError` when the tier does not
    answer (a retry may succeed). ``prefix`` is the deployment's key prefix (``FRESHKEY_REDIS_KEY_PREFIX``).
    """

    name: str
    channel: str | None
    """The Pub/Sub channel its applied changes (and signature activations) are announced on, if any."""

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        """Apply every action atomically per entry, in order. Raise TierUnavailableError when the tier
        cannot take the batch now (a retry may succeed); an action refused for good is a FAILED result."""
        ...

    async def read_entries(self, keys: Sequence[str]) -> dict[str, Entry | None]:
        """The entry (or tombstone) at each key; None where there is none."""
        ...

    async def read_fields(self, keys: Sequence[str], fields: Sequence[str]) -> list[list[bytes | None]]:
        """The values of ``fields`` in each key's hash (None where absent), in order."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The string value at ``key`` (a document freshkey keeps next to the entries)."""
        ...

    async def set_signature(
        self,
        prefix: str,
        namespace: str,
        record: SignatureRecord,
        *,
        mode: Literal["active", "pending"] = "active",
    ) -> SetResult:
        """Compare-and-set the namespace's signature (:func:`cache_writer.signatures.set_signature`)."""
        ...

    async def clear_pending(self, prefix: str, namespace: str, signature: str) -> bool:
        """Drop the namespace's pending signature when it is ``signature``; whether it was dropped."""
        ...

    async def fence_namespace(
        self, prefix: str, namespace: str, *, value_columns: Iterable[str] | None
    ) -> SetResult:
        """Move the namespace's signature to its next epoch (``cache_writer.signatures.fence_namespace``)."""
        ...

    async def mark_outer_fenced(self, prefix: str, namespaces: Iterable[str], since_ms: int | None) -> None:
        """Set (``since_ms``) or clear (None) the mark that tells readers an outer tier is fenced."""
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


class HitSource(Protocol):
    """Where the clients' hit counts are read from (``cache_writer.hotness``), in a consumer group."""

    async def read_hits(
        self, prefix: str, group: str, consumer: str, *, count: int = 100
    ) -> list[tuple[bytes, dict[str, tuple[int, int]]]]:
        """Up to ``count`` new messages for ``consumer`` of ``group``: (message id, counts by entry key)."""
        ...

    async def ack_hits(self, prefix: str, group: str, ids: Sequence[bytes]) -> None:
        """Acknowledge messages once their counts are safe elsewhere."""
        ...
