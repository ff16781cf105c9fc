"""Cache key layout (a contract: other languages read these caches; see README "Redis layout").

An entry of namespace ``assets`` for the row whose key columns are ``(42,)`` lives at::

    fk:{assets}:42

``fk`` is the configured prefix; ``{assets}`` is a Redis Cluster hash tag, so every key of a namespace is in
one slot and the scripts run on a cluster; the row part is :func:`schemas.row_key` (values percent-encoded,
joined by ``/``). A namespace with a model also has ``fk:{assets}:$signature`` (its active schema
signature, :mod:`cache_writer.signatures`); ``$`` is percent-encoded in every row part, so no entry key
can be it.
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


SIGNATURE_SUFFIX = "$signature"


def namespace_prefix(prefix: str, namespace: str) -> str:
    """``<prefix>:{<namespace>}:``, which every key of the namespace starts with."""
    return f"{prefix}:{{{namespace}}}:"


def signature_key(prefix: str, namespace: str) -> str:
    """The key of a namespace's active signature: ``<prefix>:{<namespace>}:$signature`` (same slot)."""
    return namespace_prefix(prefix, namespace) + SIGNATURE_SUFFIX


def signature_key_of(key: str) -> str:
    """The signature key of the namespace an entry key belongs to."""
    end = key.find("}:")
    if end < 0 or ":{" not in key[:end]:
        raise ValueError(f"{key!r} is not a freshkey entry key")
    return key[: end + 2] + SIGNATURE_SUFFIX
