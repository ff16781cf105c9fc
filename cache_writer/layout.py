"""Cache key layout: every key freshkey builds, and the parsing of them back (a contract: other languages
read these caches; see README "Redis layout"). No other module builds or takes apart a key by hand.

An entry of namespace ``assets`` for the row whose key columns are ``(42,)`` lives at::

    fk:{assets}:42

``fk`` is the configured prefix; ``{assets}`` is a Redis Cluster hash tag, so every key of a namespace is in
one slot and the scripts run on a cluster; the row part is :func:`schemas.row_key` (values percent-encoded,
joined by ``/``). Every namespace also has ``fk:{assets}:$signature`` (its active schema signature,
:mod:`cache_writer.signatures`).

Parsing rests on two facts of the encoding: the prefix ends at the first ``:{``, and a row part never
contains ``}``, ``:`` or ``$`` (they are percent-encoded). So the namespace ends at the *last* ``}:`` of a
key, whatever characters the namespace itself holds, and no entry key is ever a signature key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple
from urllib.parse import unquote

from schemas import row_key
from schemas.events import KeyValue

SIGNATURE_SUFFIX = "$signature"
"""The row part of a namespace's signature key (``$`` never occurs in an encoded row part)."""

_OPEN = ":{"
_CLOSE = "}:"


class EntryKey(NamedTuple):
    """A key taken apart: ``<prefix>:{<namespace>}:<row>``."""

    prefix: str
    namespace: str
    row: str
    """The row part: :func:`schemas.row_key` of the key values, a semantic key, or ``$signature``."""


def entry_key(prefix: str, namespace: str, key_values: Sequence[KeyValue]) -> str:
    """The key of the entry of the row whose key columns hold ``key_values`` (in key column order)."""
    return row_entry_key(prefix, namespace, row_key(key_values))


def row_entry_key(prefix: str, namespace: str, row: str) -> str:
    """The key of an entry from its row part as already encoded (:func:`schemas.row_key`, a semantic key)."""
    return namespace_prefix(prefix, namespace) + row


def namespace_prefix(prefix: str, namespace: str) -> str:
    """``<prefix>:{<namespace>}:``, which every key of the namespace starts with."""
    return f"{prefix}{_OPEN}{namespace}{_CLOSE}"


def namespace_pattern(prefix: str, namespace: str) -> str:
    """A SCAN MATCH pattern for every key of a namespace (its signature key included)."""
    return _glob_escape(namespace_prefix(prefix, namespace)) + "*"


def prefix_pattern(prefix: str) -> str:
    """A SCAN MATCH pattern for every key of every namespace under ``prefix``."""
    return f"{_glob_escape(prefix)}{_OPEN}*{_CLOSE}*"


def signature_key(prefix: str, namespace: str) -> str:
    """The key of a namespace's active signature: ``<prefix>:{<namespace>}:$signature`` (same slot)."""
    return namespace_prefix(prefix, namespace) + SIGNATURE_SUFFIX


def split_entry_key(key: str) -> EntryKey:
    """``(prefix, namespace, row part)`` of a key ``<prefix>:{<namespace>}:<row part>``; ValueError when
    ``key`` is not one."""
    start = key.find(_OPEN)
    end = key.rfind(_CLOSE)
    if start < 0 or end < start + 1:
        raise ValueError(f"{key!r} is not a freshkey entry key")
    return EntryKey(key[:start], key[start + len(_OPEN) : end], key[end + len(_CLOSE) :])


def parse_entry_key(key: str) -> EntryKey | None:
    """:func:`split_entry_key`, or None when ``key`` is not a freshkey key."""
    try:
        return split_entry_key(key)
    except ValueError:
        return None


def namespace_of(key: str) -> str | None:
    """The namespace a key belongs to; None when ``key`` is not a freshkey key."""
    parsed = parse_entry_key(key)
    return parsed.namespace if parsed is not None else None


def namespace_prefix_of(key: str) -> str:
    """``<prefix>:{<namespace>}:`` of a key; '' when ``key`` is not a freshkey key."""
    parsed = parse_entry_key(key)
    return namespace_prefix(parsed.prefix, parsed.namespace) if parsed is not None else ""


def signature_key_of(key: str) -> str:
    """The signature key of the namespace a key belongs to (ValueError when it is not a freshkey key)."""
    parsed = split_entry_key(key)
    return signature_key(parsed.prefix, parsed.namespace)


def is_signature_key(key: str | bytes) -> bool:
    """Whether ``key`` is a namespace's signature key (and not an entry)."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    return text.endswith(_CLOSE + SIGNATURE_SUFFIX) and _OPEN in text


def row_of(key: str, prefix: str, namespace: str) -> str | None:
    """The row part of ``key`` when it is an entry key of ``namespace`` under ``prefix``, else None."""
    parsed = parse_entry_key(key)
    if parsed is None or (parsed.prefix, parsed.namespace) != (prefix, namespace):
        return None
    return parsed.row if parsed.row != SIGNATURE_SUFFIX else None


def row_key_values(row: str) -> list[str]:
    """The key column values of a row part (:func:`schemas.row_key` undone), as strings, in order."""
    return [unquote(part) for part in row.split("/")]


def invalidation_channel(prefix: str) -> str:
    """The Pub/Sub channel on which every applied write and tombstone is announced (README layout)."""
    return f"{prefix}:invalidations"


def hits_stream(prefix: str) -> str:
    """The stream clients append their hit counts to, for the pipeline's prewarm (README layout)."""
    return f"{prefix}:hits"


def incarnation_key(prefix: str) -> str:
    """The server identity L2's data set was last seen under (``RedisTier.incarnation``): a data set
    restored from another (a snapshot loaded at a restart, a replica promoted) is found by it."""
    return f"{prefix}:incarnation"


def latest_verification_key(prefix: str) -> str:
    """Where ``freshkey verify`` keeps its latest result (JSON) for the worker's ``/freshkey/verify``."""
    return f"{prefix}:verify:latest"


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (SCAN MATCH): ``* ? [ ] \\`` escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
