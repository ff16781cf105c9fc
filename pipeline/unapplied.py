"""Changes the worker cannot apply as rows, and what it does instead (pure: no I/O).

- An oversized change (``oversize``: the connector left its images out): invalidate the row's entry when
  its key and version are known from the event alone, else fence the namespace (:func:`oversize_plan`).
- A :class:`~schemas.FenceEvent` (changes of a table lost to the connector): fence the table's namespace
  (:func:`lost_changes`). Each partition brings one; see the event's docstring for why the last of those
  fences comes after every change read before the loss.

The processor (``pipeline.processor``) collects the fences in ``Prepared.fences``; the change agent fences
before it applies the batch (the batch's writes carry the signatures read before, so it covers them).
"""

from __future__ import annotations

import logging

from cache_writer import CacheAction, entry_key
from pipeline.prepared import Fence
from schemas import Binding, Change, FenceEvent

log = logging.getLogger(__name__)


def oversize_plan(event: Change, binding: Binding, prefix: str) -> list[CacheAction] | Fence:
    """A row too large for a message: the invalidation of its entry when its key and version are known
    from the event alone (row-keyed by the primary key, binlog/GTID versions); else the namespace's fence."""
    key_columns = binding.key_columns or tuple(event.key)
    if binding.semantic is None and binding.version_column is None and set(key_columns) <= set(event.key):
        key = entry_key(prefix, binding.namespace, [event.key[c] for c in key_columns])
        log.warning("oversized row of %s (key %s): its entry is invalidated", binding.table, event.key)
        return [CacheAction("invalidate", key, event.version, event.commit_ts_us)]
    return Fence(
        f"an oversized row of {binding.table} whose entry key or version needs the row itself "
        "(raise FRESHKEY_KAFKA_MAX_MESSAGE_BYTES and the broker's limit to cache such rows)",
        "oversize",
    )


def lost_changes(event: FenceEvent, binding: Binding) -> Fence:
    """The fence of ``binding``'s namespace for the changes the connector lost (``event``), said loudly."""
    source = event.source
    log.error(
        "the connector lost changes of %s.%s at %s:%d (%s): fencing namespace %s",
        source.db, source.table, source.file, source.pos, event.reason, binding.namespace,
    )  # fmt: skip
    return Fence(
        f"changes of {binding.table} were lost to the connector at {source.file}:{source.pos}: "
        f"{event.reason}",
        "unreadable-binlog",
    )
