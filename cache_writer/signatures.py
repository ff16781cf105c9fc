"""The active schema signature of each namespace, in Redis, moving only forward (invariant 7).

One hash per namespace that has a model, in the namespace's slot (README, "Redis layout")::

    <prefix>:{<namespace>}:$signature
        s      the active signature (64 hex digits): entries whose field ``s`` differs are never served
        o      its order (``schemas.model_updates.signature_order``), compared byte by byte
        u      the model update it comes from (JSON, as on the model-update topic)
        cols   the value columns it covers (JSON array)
        t      when it became active, ms since the epoch
        ps po pu pcols pt   the same for a signature being prewarmed (prewarm-then-switch), if any

:func:`set_signature` is a compare-and-set on ``o`` in Lua: a signature is replaced only by one of a
higher order, so a replayed or older model update can never bring an old signature back. A cutover of
any number of entries is this one write; entries built under the old signature stop being served at
once, because the read script (``get_or_lease.lua``) compares every entry's ``s`` with the active one in
the same atomic step. They go by their TTL or ``freshkey model sweep``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from cache_writer.exceptions import TierUnavailableError
from cache_writer.layout import namespace_prefix, signature_key
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from cache_writer.redis.replies import as_text, hash_fields, raise_errors
from schemas.model_updates import (
    decode_model_update,
    moved_signature,
    next_epoch_order,
    signature_order,
)
from schemas.signature import table_signature


@dataclass(frozen=True, slots=True)
class SignatureRecord:
    """One signature of a namespace, with what it was computed from."""

    signature: str
    order: str
    update: bytes
    """The model update (JSON) whose model, tokenizer, schema and weights the signature covers; empty
    for a namespace without a model (its signature covers the value columns only)."""
    value_columns: tuple[str, ...]
    at_ms: int = 0

    @classmethod
    def at(cls, update: bytes, value_columns: Iterable[str], order: str) -> SignatureRecord:
        """The record of entries built under ``update`` (b"": no model) over ``value_columns`` at
        ``order``: the signature is the base signature moved by the order (``moved_signature``)."""
        columns = tuple(sorted(set(value_columns)))
        return cls(moved_signature(base_signature(update, columns), order), order, update, columns)


def base_signature(update: bytes, value_columns: Iterable[str]) -> str:
    """The signature of entries built under a model update (JSON; b"" for none) over these columns,
    before any schema change or fence moved it."""
    if update:
        return decode_model_update(update).signature(tuple(value_columns))
    return table_signature(value_columns)


@dataclass(frozen=True, slots=True)
class NamespaceSignatures:
    namespace: str
    active: SignatureRecord | None
    pending: SignatureRecord | None = None

    @property
    def active_signature(self) -> str:
        """The active signature, '' when the namespace has none (no model: entries carry none)."""
        return self.active.signature if self.active is not None else ""


@dataclass(frozen=True, slots=True)
class SetResult:
    applied: bool
    previous: str
    """applied: the signature that was active before ('' none); refused: the one that is active."""
    active_order: str = ""
    """When refused: the active order that was not exceeded."""


def _record(fields: dict[bytes, bytes], pending: bool) -> SignatureRecord | None:
    p = "p" if pending else ""
    signature = fields.get(f"{p}s".encode())
    order = fields.get(f"{p}o".encode())
    if signature is None or order is None:
        return None
    columns = json.loads(fields.get(f"{p}cols".encode(), b"[]"))
    return SignatureRecord(
        signature=signature.decode(),
        order=order.decode(),
        update=fields.get(f"{p}u".encode(), b""),
        value_columns=tuple(str(c) for c in columns),
        at_ms=int(fields.get(b"pt" if pending else b"t", b"0")),
    )


def parse_signatures(namespace: str, fields: dict[bytes, bytes]) -> NamespaceSignatures:
    """The state of a namespace from the fields of its ``$signature`` hash (empty: no model)."""
    return NamespaceSignatures(namespace, _record(fields, False), _record(fields, True))


async def read_signatures(
    client: RedisClient, prefix: str, namespaces: Iterable[str]
) -> dict[str, NamespaceSignatures]:
    """The signature state of each namespace, read in one pipeline (redirects followed on a cluster)."""
    names = list(dict.fromkeys(namespaces))
    replies = raise_errors(
        await run_pipeline(client, [("HGETALL", signature_key(prefix, ns)) for ns in names])
    )
    return {ns: parse_signatures(ns, hash_fields(reply)) for ns, reply in zip(names, replies, strict=True)}


async def read_active_signatures(client: RedisClient, prefix: str, namespaces: Sequence[str]) -> list[str]:
    """Only the active and pending signatures (fields ``s`` and ``ps``), as ``s/ps``, one per namespace;
    cheap enough to check on every batch whether a namespace's state changed."""
    commands = [("HMGET", signature_key(prefix, ns), "s", "ps") for ns in namespaces]
    replies = raise_errors(await run_pipeline(client, commands))
    return [
        f"{as_text(active) if active else ''}/{as_text(pending) if pending else ''}"
        for active, pending in replies
    ]


@dataclass(frozen=True, slots=True)
class ClientSignatures:
    """The signature reads over a bare client (a :class:`~cache_writer.tier.SignatureReader`), for code
    that holds a redis-py client rather than a tier."""

    redis: RedisClient

    async def read_signatures(self, prefix: str, namespaces: Iterable[str]) -> dict[str, NamespaceSignatures]:
        return await read_signatures(self.redis, prefix, namespaces)

    async def read_active_signatures(self, prefix: str, namespaces: Sequence[str]) -> list[str]:
        return await read_active_signatures(self.redis, prefix, namespaces)


async def set_signature(
    client: RedisClient,
    prefix: str,
    namespace: str,
    record: SignatureRecord,
    *,
    mode: Literal["active", "pending"] = "active",
    channel: str | None = None,
    tier: str = "redis",
) -> SetResult:
    """Compare-and-set the namespace's signature (``set_signature.lua``).

    ``active``: lands only when ``record.order`` is above the active order; it then clears a pending
    signature that is not above it, and is announced on ``channel`` as ``a <signature> <key prefix>``
    (in-process tiers drop the namespace's entries). ``pending``: lands only when ``record.order`` is
    above the active order and not below the pending one (a replay of the same cutover lands again).
    Raises :class:`TierUnavailableError` (naming ``tier``) when Redis does not answer.
    """
    at_ms = record.at_ms or int(time.time() * 1000)
    command = (
        "EVALSHA",
        scripts.SET_SIGNATURE.sha,
        1,
        signature_key(prefix, namespace),
        mode,
        record.order,
        record.signature,
        record.update,
        json.dumps(list(record.value_columns)),
        at_ms,
        channel or "",
        namespace_prefix(prefix, namespace),
    )
    (reply,) = await _run(client, [command], scripts.SET_SIGNATURE.text, tier)
    if int(reply[0]) == 1:
        return SetResult(True, as_text(reply[1]))
    return SetResult(False, as_text(reply[2]), as_text(reply[1]))


async def fence_namespace(
    client: RedisClient,
    prefix: str,
    namespace: str,
    *,
    value_columns: Iterable[str] | None,
    channel: str | None = None,
    attempts: int = 8,
    tier: str = "redis",
) -> SetResult:
    """Move the namespace's active signature to its next epoch: from this write on, no entry built
    before it is served by any tier (an O(1) invalidation of the whole namespace, as a cutover is).

    The model and the value columns stay those of the active record; a namespace without any record
    gets its first one, over ``value_columns`` (which must then be given: the projection of its
    binding). A concurrent move (another fence, a DDL, a cutover) is met by reading again: the fence
    lands on top of whatever is active. Raises :class:`TierUnavailableError` (naming ``tier``) when Redis
    does not answer.
    """
    for _ in range(attempts):
        try:
            state = (await read_signatures(client, prefix, [namespace]))[namespace]
        except redis.RedisError as exc:
            raise TierUnavailableError(tier, exc) from exc
        active = state.active
        if active is not None:
            record = SignatureRecord.at(
                active.update, active.value_columns, next_epoch_order(active.order, floor=_now_us())
            )
        elif value_columns is None:
            raise ValueError(f"namespace {namespace} has no signature yet: its value columns are needed")
        else:
            record = SignatureRecord.at(
                b"", value_columns, next_epoch_order(signature_order(None), floor=_now_us())
            )
        result = await set_signature(client, prefix, namespace, record, channel=channel, tier=tier)
        if result.applied:
            return result
    raise TierUnavailableError(tier, RuntimeError(f"signature of {namespace} kept moving during a fence"))


OUTER_FENCED_FIELD = "fo"
"""Field of a namespace's ``$signature`` hash set (to the ms the fence began) while an outer tier is
fenced: readers must not copy entries inward from an outer tier then (README, "Redis layout")."""


async def mark_outer_fenced(
    client: RedisClient, prefix: str, namespaces: Iterable[str], since_ms: int | None, *, tier: str = "redis"
) -> None:
    """Set (``since_ms``) or clear (None) the outer-tier fence mark of each namespace, in one pipeline."""
    names = list(dict.fromkeys(namespaces))
    commands: list[tuple[Any, ...]]
    if since_ms is None:
        commands = [("HDEL", signature_key(prefix, ns), OUTER_FENCED_FIELD) for ns in names]
    else:
        commands = [("HSET", signature_key(prefix, ns), OUTER_FENCED_FIELD, since_ms) for ns in names]
    await _run(client, commands, None, tier)


async def clear_pending(
    client: RedisClient, prefix: str, namespace: str, signature: str, *, tier: str = "redis"
) -> bool:
    """Drop the namespace's pending signature when it is ``signature`` (a cutover that failed rolls its
    pending signature back); returns whether it was dropped."""
    command = ("EVALSHA", scripts.CLEAR_PENDING.sha, 1, signature_key(prefix, namespace), signature)
    (reply,) = await _run(client, [command], scripts.CLEAR_PENDING.text, tier)
    return int(reply) == 1


async def _run(
    client: RedisClient, commands: list[tuple[Any, ...]], script: str | None, tier: str
) -> list[Any]:
    """The replies of ``commands``; TierUnavailableError (naming ``tier``) when Redis does not answer or
    refuses one of them."""
    try:
        replies = await run_pipeline(client, commands, scripts=(script,) if script else ())
    except redis.RedisError as exc:
        raise TierUnavailableError(tier, exc) from exc
    for reply in replies:
        if isinstance(reply, Exception):
            raise TierUnavailableError(tier, reply)
    return replies


def _now_us() -> int:
    return time.time_ns() // 1000
