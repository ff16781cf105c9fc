"""Cache key layout: every key freshkey builds, and the parsing of them back (a contract: other languages
read these caches; see README "Redis layout").

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
from urllib.parse import unquote

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


def split_entry_key(key: str) -> tuple[str, str, str]:
    """``(prefix, namespace, row part)`` of an entry key ``<prefix>:{<namespace>}:<row part>``."""
    end = key.find("}:")
    start = key.find(":{")
    if end < 0 or start < 0 or start > end:
        raise ValueError(f"{key!r} is not a freshkey entry key")
    return key[:start], key[start + 2 : end], key[end + 2 :]


def namespace_of(key: str) -> str | None:
    """The namespace an entry key belongs to; None when ``key`` is not an entry key."""
    try:
        return split_entry_key(key)[1]
    except ValueError:
        return None


def namespace_prefix_of(key: str) -> str:
    """``<prefix>:{<namespace>}:`` of an entry key; '' when ``key`` is not an entry key."""
    end = key.find("}:")
    return key[: end + 2] if end >= 0 else ""


def row_key_values(row_part: str) -> list[str]:
    """The key column values of a row part (:func:`schemas.row_key` undone), as strings."""
    return [unquote(part) for part in row_part.split("/")]


def invalidation_channel(prefix: str) -> str:
    """The Pub/Sub channel on which every applied write and tombstone is announced (README layout)."""
    return f"{prefix}:invalidations"


def hits_stream(prefix: str) -> str:
    """The stream clients append their hit counts to, for the pipeline's prewarm (README layout)."""
    return f"{prefix}:hits"


def latest_verification_key(prefix: str) -> str:
    """Where ``freshkey verify`` keeps its latest result (JSON) for the worker's ``/freshkey/verify``."""
    return f"{prefix}:verify:latest"
