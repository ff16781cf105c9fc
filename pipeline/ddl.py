"""Schema changes: a DDL statement of a bound table moves its namespace's signature (invariant 7)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence

from cache_writer import CacheTier
from cache_writer.signatures import SignatureRecord
from schemas import Binding, DdlEvent, VersionError, binlog_version
from schemas.model_updates import (
    decode_model_update,
    signature_order,
)

log = logging.getLogger(__name__)


Projection = Callable[[Binding], Awaitable[tuple[str, ...]]]
"""The value columns of a binding now (its ``value_columns``, or the table's columns, sorted)."""


async def move_signatures(
    event: DdlEvent,
    bindings: Sequence[Binding],
    tiers: Sequence[CacheTier],
    prefix: str,
    *,
    projection: Projection,
) -> list[str]:
    """Move the signature of every namespace the DDL may concern (:func:`ddl_concerns`); returns the
    namespaces whose signature moved.

    Every namespace has a signature, model or not: the new one covers the table's columns now and
    is ordered by the DDL's binlog version, so a replay of the DDL moves nothing and entries built
    under the old column set (or the old column types) are never served again. An O(1) switch: the
    entries go by TTL or sweep. Outages (Redis, the database) are raised, so the caller retries.
    """
    concerned = [b for b in bindings if ddl_concerns(event, b)]
    if not concerned:
        return []
    states = await tiers[0].read_signatures(prefix, [b.namespace for b in concerned])
    try:
        sequence = binlog_version(event.source.file, event.source.pos, 0)
    except VersionError:  # a file name without a number: order by the time the DDL was read
        sequence = event.ts_ms * 1000
    moved: list[str] = []
    for binding in concerned:
        active = states[binding.namespace].active
        update = active.update if active is not None else b""
        version = decode_model_update(update).semver if update else None
        order = signature_order(version, sequence)
        if active is not None and order <= active.order:
            continue  # a replay of this DDL, or an older one
        columns = await projection(binding)
        record = SignatureRecord.at(update, columns, order)
        for tier in reversed(tiers[1:]):  # outermost first: L2, which the clients read, decides
            await tier.set_signature(prefix, binding.namespace, record)
        result = await tiers[0].set_signature(prefix, binding.namespace, record)
        if result.applied:
            moved.append(binding.namespace)
            log.info(
                "DDL on %s (%s): value columns %s; signature of %s %s -> %s",
                binding.table, event.query[:120], json.dumps(list(record.value_columns)),
                binding.namespace, (active.signature[:12] if active else "-"), record.signature[:12],
            )  # fmt: skip
    return moved


_IDENTIFIER = r"[`\"]?{name}[`\"]?"


def ddl_concerns(event: DdlEvent, binding: Binding) -> bool:
    """Whether a DDL statement may change the rows or columns of the binding's table: its query names
    the table (as a word, quoted or not, case-insensitive) and either runs in the table's database or
    names that database too. Errs towards yes: a needless move costs a cold namespace, a missed one
    stale entries."""
    query = event.query
    table = re.compile(
        r"(?<![\w$])" + _IDENTIFIER.format(name=re.escape(binding.table_name)) + r"(?![\w$])", re.I
    )
    if not table.search(query):
        return False
    if event.source.db.lower() == binding.database.lower():
        return True
    database = re.compile(
        r"(?<![\w$])" + _IDENTIFIER.format(name=re.escape(binding.database)) + r"\s*\.", re.I
    )
    return database.search(query) is not None
