"""Cache key layout (a contract: other languages read these caches; see README "Redis layout").

An entry of namespace ``assets`` for the row whose key columns are ``(42,)`` lives at::

    fk:{assets}:42

``fk`` is the configured prefix; ``{assets}`` is a Redis Cluster hash tag, so every key of a namespace is in
one slot and the scripts run on a cluster; the row part is :func:`schemas.row_key` (values percent-encoded,
joined by ``/``).
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas import row_key
from schemas.events import KeyValue


def entry_key(prefix: str, namespace: str, key_values: Sequence[KeyValue]) -> str:
    return f"{prefix}:{{{namespace}}}:{row_key(key_values)}"


def namespace_pattern(prefix: str, namespace: str) -> str:
    """A SCAN MATCH pattern for every entry of a namespace."""
    return f"{prefix}:{{{namespace}}}:*"
