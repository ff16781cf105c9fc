"""How :meth:`~cache_writer.redis.tier.RedisTier.apply` turns actions into script calls: the batch
script, the grouping by hash slot, and the single-key fallback (TRYAGAIN mid-migration, a batch call
that failed as a whole, values that are not text).

The actions of one hash slot (one namespace) go as calls of ``apply_batch.lua`` of up to
``script_batch`` actions each: one script call applies each action exactly as the single-key scripts do
(it is built from their functions), and its arguments and answer are one JSON array each. Measured here,
20,000 writes from one process: pipelined single-key EVALSHA 28-48 µs of client CPU per write (redis-py
packs seven arguments and parses a reply array per call), the batch script 4-13 µs; Redis itself spends
about the same per action either way. A group of fewer than :data:`BATCH_MIN_ACTIONS`, or one whose
values are not UTF-8 (they travel as JSON strings), goes as single-key calls.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

import orjson
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from cache_writer.exceptions import TierUnavailableError
from cache_writer.layout import signature_key_of
from cache_writer.redis import scripts
from cache_writer.tier import ActionResult, CacheAction, Outcome

SINGLE_CALL_MARK = "-- @single"
"""Where a single-key script's call of its function begins: the batch script takes what is above it."""

BATCH_MIN_ACTIONS = 4
"""Fewer actions of one slot go as single-key calls: the JSON round trip buys nothing for one or two."""

MIGRATING_HOLD_S = 5.0
"""How long a cluster slot whose batch call was refused with TRYAGAIN (a migration) goes as single-key
calls."""

DEFAULT_SCRIPT_BATCH = 100
"""Actions per batch-script call: Redis runs a call as one command, about 5-10 µs per action here, so 100
keep any one call near a millisecond for the readers waiting behind it."""


def _functions_of(name: str) -> str:
    text = resources.files("cache_writer").joinpath("lua", name).read_text()
    head, mark, _ = text.partition(SINGLE_CALL_MARK)
    if not mark:
        raise RuntimeError(f"cache_writer/lua/{name} lacks its {SINGLE_CALL_MARK!r} line")
    return head


def _batch_script() -> scripts.Script:
    """``apply_batch.lua`` behind the prelude and the functions of the two single-key scripts."""
    loop = resources.files("cache_writer").joinpath("lua", "apply_batch.lua").read_text()
    parts = [
        scripts.PRELUDE,
        _functions_of("write_if_newer.lua"),
        _functions_of("invalidate_if_not_newer.lua"),
    ]
    text = "\n".join([*parts, loop])
    return scripts.Script("apply_batch.lua", text, hashlib.sha1(text.encode()).hexdigest())


BATCH = _batch_script()
TIER_SCRIPTS = (BATCH.text, scripts.WRITE.text, scripts.INVALIDATE.text)
"""What a NOSCRIPT answer to :meth:`~cache_writer.redis.tier.RedisTier.apply` reloads."""

Command = tuple[Any, ...]
Run = Callable[[list[Command]], Awaitable[list[Any]]]
"""Sends commands as one pipeline and answers one reply per command (errors as exception instances)."""


class ScriptCalls:
    """The script calls that apply a tier's actions, and what their replies mean (one per tier: it
    remembers the cluster slots that are mid-migration)."""

    def __init__(
        self,
        *,
        name: str,
        cluster: bool,
        script_batch: int,
        tombstone_ttl_ms: int,
        entry_ttl_ms: int | None,
        channel: str | None,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.script_batch = script_batch
        """Most actions per batch-script call on a single server (1: every action is a single-key call)."""
        self.migrating: dict[int, float] = {}
        """Cluster slots sent as single-key calls until the time (monotonic) given: see :meth:`plan`."""
        self._channel = channel or ""
        self._tombstone_ttl = str(tombstone_ttl_ms)
        self._entry_ttl = str(entry_ttl_ms or 0)

    def command(self, action: CacheAction) -> Command:
        """The single-key EVALSHA command (arguments) that applies ``action`` in this tier."""
        if action.kind == "invalidate":
            args: Command = (action.version, action.commit_ts_us, self._tombstone_ttl, self._channel)
            return ("EVALSHA", scripts.INVALIDATE.sha, 1, action.key, *args)
        args = (action.version, action.value, action.commit_ts_us, self._entry_ttl, self._channel)
        if action.signature is None and action.row is None:
            return ("EVALSHA", scripts.WRITE.sha, 1, action.key, *args)
        keys = (action.key, signature_key_of(action.key))
        return ("EVALSHA", scripts.WRITE.sha, 2, *keys, *args, action.signature or "", action.row or "")

    def batch_command(self, actions: Sequence[CacheAction]) -> Command | None:
        """One ``apply_batch.lua`` call applying ``actions`` (all in one hash slot) in order; None when a
        value is not UTF-8 (JSON carries text only), so the actions go as single-key calls."""
        keys: list[str] = []
        items: list[tuple[str, ...]] = []
        for action in actions:
            keys.append(action.key)
            if action.kind == "invalidate":
                items.append(("i", str(action.version), str(action.commit_ts_us)))
                continue
            try:
                value = (action.value or b"").decode()
            except UnicodeDecodeError:
                return None
            taken = "1"
            if action.signature is not None or action.row is not None:
                keys.append(signature_key_of(action.key))
                taken = "2"
            items.append(
                (
                    "w",
                    str(action.version),
                    value,
                    str(action.commit_ts_us),
                    action.signature or "",
                    action.row or "",
                    taken,
                )
            )
        args = (orjson.dumps(items), self._entry_ttl, self._tombstone_ttl, self._channel)
        return ("EVALSHA", BATCH.sha, len(keys), *keys, *args)

    def plan(self, actions: Sequence[CacheAction]) -> list[tuple[Command, list[int]]]:
        """The commands for ``actions``, each with the positions of the actions it applies. Actions keep
        their order within a hash slot, which is all the order a key can see.

        On a single server the actions go as batch calls of up to ``script_batch`` actions. On a cluster
        each slot's actions go as one batch call (or all as single-key calls): during a slot migration a
        batch call whose keys are split between the two nodes is refused with TRYAGAIN, and its actions
        are then sent as single-key calls (:meth:`apply`); with two calls for one slot the second could
        apply before the refused first. A slot refused that way goes as single-key calls for
        :data:`MIGRATING_HOLD_S`, so that a migration costs the TRYAGAIN rounds once, not per batch."""
        slots: dict[int, list[int]] = {}
        if self.cluster:
            for position, action in enumerate(actions):
                slots.setdefault(key_slot(action.key.encode()), []).append(position)
            step = len(actions)
            now = time.monotonic()
            for slot, until in list(self.migrating.items()):
                if until <= now:
                    del self.migrating[slot]
        else:
            slots[0] = list(range(len(actions)))
            step = self.script_batch
        planned: list[tuple[Command, list[int]]] = []
        for slot, positions in slots.items():
            batched = self.script_batch > 1 and len(positions) >= BATCH_MIN_ACTIONS
            if batched and slot not in self.migrating:
                chunks = [positions[i : i + step] for i in range(0, len(positions), step)]
                commands = [self.batch_command([actions[p] for p in chunk]) for chunk in chunks]
                if all(command is not None for command in commands):
                    planned += [(c, chunk) for c, chunk in zip(commands, chunks, strict=True) if c]
                    continue
            planned += [(self.command(actions[p]), [p]) for p in positions]
        return planned

    async def apply(self, actions: Sequence[CacheAction], run: Run) -> list[ActionResult]:
        """Apply ``actions`` through ``run``: one result per action, in order; TierUnavailableError when
        a reply says the tier cannot take writes now (see :func:`is_transient`)."""
        planned = self.plan(actions)
        replies = await run([command for command, _ in planned])
        results: list[ActionResult | None] = [None] * len(actions)
        again: list[int] = []  # the actions of refused batch calls, in order: sent as single-key calls
        for (command, positions), reply in zip(planned, replies, strict=True):
            batch = command[1] == BATCH.sha
            if isinstance(reply, TryAgainError) and batch:
                # A slot mid-migration with the call's keys on both nodes: nothing of it ran.
                self.migrating[key_slot(actions[positions[0]].key.encode())] = (
                    time.monotonic() + MIGRATING_HOLD_S
                )
                again += positions
            elif isinstance(reply, Exception):
                if is_transient(reply):
                    raise TierUnavailableError(self.name, reply)
                if batch:
                    # The call failed as a whole (not one action: those are answered inside), so each
                    # action is tried alone for its own answer; the version checks make a repeat harmless.
                    again += positions
                    continue
                for p in positions:
                    results[p] = action_result(actions[p], reply)
            elif batch:
                answers = orjson.loads(reply)
                for p, answer in zip(positions, answers, strict=True):
                    results[p] = self._batch_result(actions[p], answer)
            else:
                results[positions[0]] = action_result(actions[positions[0]], reply)
        if again:
            replies = await run([self.command(actions[p]) for p in again])
            for p, reply in zip(again, replies, strict=True):
                if isinstance(reply, Exception) and is_transient(reply):
                    raise TierUnavailableError(self.name, reply)
                results[p] = action_result(actions[p], reply)
        return [r for r in results if r is not None]

    def _batch_result(self, action: CacheAction, answer: list[Any]) -> ActionResult:
        flag, detail = answer
        if flag == -1:
            error = ResponseError(detail)
            if is_transient(error):
                raise TierUnavailableError(self.name, error)
            return action_result(action, error)
        return action_result(action, (flag, detail))


TRANSIENT_ERROR_PREFIXES = (
    "OOM",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "READONLY",
    "NOREPLICAS",
    "MISCONF",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "MOVED",
    "ASK",
)
"""Error replies that say the server cannot take writes now (memory, loading, fail-over, redirects not
settled, credentials): the whole batch is retried. Any other error reply concerns one action."""


TRANSIENT_ERROR_CLASSES = (
    TryAgainError,
    ClusterDownError,
    MovedError,
    AskError,
    BusyLoadingError,
    ReadOnlyError,
    OutOfMemoryError,
    AuthenticationError,
    NoPermissionError,
    MasterDownError,
)
"""The classes redis-py raises for the codes of TRANSIENT_ERROR_PREFIXES (its parser strips the code)."""


def is_transient(reply: Exception) -> bool:
    """An error reply of one command that a retry of the batch may cure (see TRANSIENT_ERROR_PREFIXES).

    redis-py turns most of those codes into exception classes and strips the code from the message
    (``TRYAGAIN Multiple keys request during rehashing of slot`` -> ``TryAgainError("Multiple keys ...")``),
    so the code it keeps (``status_code``) is read first; the message is for errors raised inside a
    script and answered as text by the batch script."""
    if isinstance(reply, NoScriptError) or not isinstance(reply, RedisError):
        return True  # scripts still missing after a reload, or not an error reply at all
    code = getattr(reply, "status_code", None)
    if isinstance(code, str) and code.startswith(TRANSIENT_ERROR_PREFIXES):
        return True
    if isinstance(reply, TRANSIENT_ERROR_CLASSES):
        return True
    text = str(reply).lstrip()
    return text.startswith(TRANSIENT_ERROR_PREFIXES) or "Redis is loading" in text


def action_result(action: CacheAction, reply: Any) -> ActionResult:
    """The result of ``action`` from its script's reply (``(applied, previous version)``) or error."""
    if isinstance(reply, Exception):
        return ActionResult(action, Outcome.FAILED, None, error=f"{type(reply).__name__}: {reply}"[:500])
    applied, previous = reply
    previous_version = int(previous) if previous not in (b"", "", None) else None
    return ActionResult(action, Outcome.APPLIED if applied == 1 else Outcome.NOT_NEWER, previous_version)
