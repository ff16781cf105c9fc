"""Signature changes of a namespace: model updates (check, prewarm, switch) and schema changes (DDL).

A model update for a namespace ends in ONE write: the compare-and-set of the namespace's signature key
(``cache_writer.signatures``). From that instant no entry built under another signature is served, by
any tier: the read script compares every entry's ``s`` with the active signature atomically, in-process
tiers drop the namespace on the broadcast and refuse entries read under another signature, and an outer
tier's entry is only copied inward under the active signature. Nothing is scanned.

Prewarm (``FRESHKEY_MODEL_CUTOVER``):

- ``prewarm-then-switch`` (default): the new signature is first recorded as *pending*; from the next
  batch on every worker builds each change's entries under both the active and the pending model
  (invalidating both before-keys, writing both after-keys). Then the hottest entries' rows are reloaded
  (database or loader hook), keyed with the new weights and written under the pending signature, and
  only then is the signature switched. A change committed after the prewarm read its row is planned by
  a worker that already saw the pending state (it reads the state after receiving the change), so its
  invalidation reaches the prewarmed key; a change committed before is in what the prewarm read.
- ``switch-then-prewarm``: switch at once, then rebuild the hot entries under the new signature.

Namespaces keyed by row (no ``semantic`` binding) keep their entry keys across models, so a prewarm
before the switch would only turn served entries into misses: they always switch first.

A schema change of a bound table (a ``DdlEvent`` for its database) re-resolves the table's columns;
when the value projection of a namespace with a model changes, its signature moves to the signature of
the same update over the new columns, ordered after the model version by the DDL's binlog version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from cache_writer import CacheAction, RedisTier
from cache_writer.exceptions import TierUnavailableError
from cache_writer.keys import namespace_prefix
from cache_writer.redis_cluster import run_pipeline
from cache_writer.semantic import KeyHashWeights, load_update_weights
from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.signatures import SignatureRecord, clear_pending, read_signatures, set_signature
from pipeline.apply import BindError, row_commit_time_us, row_value, row_version
from pipeline.loaders import LoaderError, Loaders
from pipeline.models import KeyRequest, ModelRegistry, ModelState, semantic_keys
from pipeline.settings import ModelSettings
from schemas import Binding, Bindings, DdlEvent, VersionError, binlog_version, row_key
from schemas.codec import DecodeError
from schemas.model_updates import (
    ModelUpdate,
    ModelUpdateRejected,
    check_update,
    decode_model_update,
    signature_order,
)

log = logging.getLogger(__name__)

ColumnsOf = Callable[[Binding], Awaitable[tuple[str, ...]]]
"""The columns of the binding's table now (information_schema), in table order."""
KeyColumnsOf = Callable[[Binding], Awaitable[tuple[str, ...]]]
"""The key columns of the binding (its key_columns, or the table's primary key)."""


class CutoverRejected(ValueError):
    """A model update or cutover command that is not applied; ``reason`` goes to the dead letter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class PrewarmReport:
    namespace: str
    hot: int = 0
    rows: int = 0
    written: int = 0
    stale: int = 0
    skipped: int = 0
    seconds: float = 0.0
    error: str | None = None
    """Why the prewarm was not done (the cutover went on without it)."""


@dataclass
class CutoverReport:
    namespace: str
    signature: str
    previous: str
    mode: str
    prewarm: PrewarmReport
    switch_ms: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckedUpdate:
    """A model update that passed every check, with its verified weights; ``namespaces`` are the ones
    it still has to be applied to (those where it is already active are done)."""

    update: ModelUpdate
    weights: KeyHashWeights
    namespaces: tuple[str, ...]
    raw: bytes


class Cutovers:
    """Model updates and DDL for one worker (module docstring). ``tiers`` are set once connected."""

    def __init__(
        self,
        bindings: Bindings,
        registry: ModelRegistry,
        *,
        prefix: str,
        settings: ModelSettings,
        columns_of: ColumnsOf,
        key_columns_of: KeyColumnsOf,
        loaders: Loaders,
    ) -> None:
        self.bindings = {b.namespace: b for b in bindings.bindings}
        self.registry = registry
        self.prefix = prefix
        self.settings = settings
        self.columns_of = columns_of
        self.key_columns_of = key_columns_of
        self.loaders = loaders
        self.tiers: list[RedisTier] = []

    @property
    def l2(self) -> RedisTier:
        if not self.tiers:
            raise RuntimeError("cache tiers are not connected yet")
        return self.tiers[0]

    # -- model updates ----------------------------------------------------------------------------------

    async def check(self, raw: bytes) -> CheckedUpdate | None:
        """Decode and check a model-update message against the active state in Redis.

        Returns None for a duplicate (already active on every namespace it serves); raises
        :class:`CutoverRejected` with the reason (``<code>: <why>``) when it must not be applied.
        """
        try:
            update = decode_model_update(raw)
        except DecodeError as exc:
            raise CutoverRejected(f"invalid: {exc.reason}") from None
        try:
            known = [ns for ns in update.namespaces if ns in self.bindings]
            states = await read_signatures(self.l2.client, self.prefix, known)
            todo: list[str] = []
            active: ModelUpdate | None = None
            for namespace in known:
                record = states[namespace].active
                current = decode_model_update(record.update) if record is not None and record.update else None
                if current == update:
                    continue  # a replay of the update that is active there: done
                todo.append(namespace)
                if current is not None and (active is None or current.semver > active.semver):
                    active = current
            check_update(update, active, self.bindings)
            if not todo:
                return None
            weights = await asyncio.to_thread(load_update_weights, update, base_dir=self.registry.weights_dir)
            for namespace in todo:
                spec = self.bindings[namespace].semantic
                if spec is not None and spec.modality not in weights.modalities:
                    raise ModelUpdateRejected(
                        "weights-invalid",
                        f"model {update.model} {update.model_version}: namespace {namespace} keys "
                        f"{spec.modality} but the weights have {', '.join(weights.modalities)}",
                    )
        except ModelUpdateRejected as exc:
            raise CutoverRejected(f"{exc.code}: {exc.reason}") from None
        return CheckedUpdate(update, weights, tuple(todo), raw)

    async def record_for(self, binding: Binding, update: ModelUpdate, sequence: int = 0) -> SignatureRecord:
        columns = await self._projection(binding)
        return SignatureRecord(
            signature=update.signature(columns),
            order=signature_order(update.semver, sequence),
            update=update.model_dump_json().encode(),
            value_columns=columns,
        )

    async def _projection(self, binding: Binding) -> tuple[str, ...]:
        if binding.value_columns is not None:
            return binding.value_columns
        return tuple(sorted(await self.columns_of(binding)))

    async def cutover(
        self,
        namespace: str,
        update: ModelUpdate,
        weights: KeyHashWeights | None,
        hot_keys: Sequence[str],
    ) -> CutoverReport:
        """Apply ``update`` to one namespace: pending + prewarm + switch, or switch + prewarm.

        Raises :class:`CutoverRejected` when the signature compare-and-set refuses (not newer).
        """
        binding = self.bindings.get(namespace)
        if binding is None:
            raise CutoverRejected(f"unknown-namespace: {namespace}")
        if binding.semantic is not None:
            await self.registry.keyer(update, weights)
        record = await self.record_for(binding, update)
        state = await self.registry.state(record, binding)
        prewarm_first = self.settings.cutover == "prewarm-then-switch" and binding.semantic is not None
        mode = "prewarm-then-switch" if prewarm_first else "switch-then-prewarm"
        label = f"model {update.model} {update.model_version}"
        if prewarm_first:
            pending = await set_signature(self.l2.client, self.prefix, namespace, record, mode="pending")
            if not pending.applied:
                raise CutoverRejected(
                    f"not-newer: {label} is not newer than the active signature of {namespace}"
                )
            try:
                report = await self._prewarm_or_note(binding, state, hot_keys)
                previous, switch_ms = await self._activate(binding, record, label)
            except BaseException:
                await self._roll_back(namespace, record)
                raise
        else:
            previous, switch_ms = await self._activate(binding, record, label)
            report = await self._prewarm_or_note(binding, state, hot_keys)
        log.info(
            "cutover of %s to %s (%s): signature %s -> %s switched in %.2f ms; prewarmed %d/%d hot entries",
            namespace, label, mode, previous[:12] or "-", record.signature[:12], switch_ms,
            report.written, report.hot,
        )  # fmt: skip
        return CutoverReport(namespace, record.signature, previous, mode, report, switch_ms)

    async def _roll_back(self, namespace: str, record: SignatureRecord) -> None:
        """A cutover that failed after writing its pending signature drops it again, so workers stop
        building entries under it (a retry of the cutover writes it anew)."""
        try:
            dropped = await asyncio.shield(
                clear_pending(self.l2.client, self.prefix, namespace, record.signature)
            )
        except (TierUnavailableError, asyncio.CancelledError) as exc:
            log.warning(
                "cutover of %s failed; its pending signature could not be dropped now (%r)", namespace, exc
            )
            return
        if dropped:
            log.warning(
                "cutover of %s failed: pending signature %s rolled back", namespace, record.signature[:12]
            )

    async def _activate(self, binding: Binding, record: SignatureRecord, label: str) -> tuple[str, float]:
        """Switch every tier, outermost first; L2 (read by the clients) decides. Returns (previous
        signature, ms the L2 switch took)."""
        if binding.value_columns is None:  # re-resolve: a DDL may have come while prewarming
            update = decode_model_update(record.update)
            fresh = await self.record_for(binding, update)
            record = SignatureRecord(fresh.signature, record.order, record.update, fresh.value_columns)
        for tier in reversed(self.tiers[1:]):
            await set_signature(tier.client, self.prefix, binding.namespace, record, channel=tier.channel)
        started = time.perf_counter()
        result = await set_signature(
            self.l2.client, self.prefix, binding.namespace, record, channel=self.l2.channel
        )
        switch_ms = (time.perf_counter() - started) * 1000
        if not result.applied:
            raise CutoverRejected(
                f"not-newer: {label} is not newer than the active signature of {binding.namespace} "
                f"({result.previous[:12]})"
            )
        return result.previous, switch_ms

    # -- prewarm ----------------------------------------------------------------------------------------

    async def _prewarm_or_note(
        self, binding: Binding, state: ModelState, hot_keys: Sequence[str]
    ) -> PrewarmReport:
        """A prewarm is an optimization: when it cannot be done (no such loader, rows that do not fit
        the binding) the cutover goes on without it. Outages (Redis, the database) are raised, so the
        cutover is retried."""
        try:
            return await self.prewarm(binding, state, hot_keys)
        except (LoaderError, BindError, KeyError, TypeError, ValueError) as exc:
            log.warning("prewarm of %s skipped: %s", binding.namespace, exc)
            return PrewarmReport(binding.namespace, hot=len(hot_keys), error=str(exc))

    async def prewarm(self, binding: Binding, state: ModelState, hot_keys: Sequence[str]) -> PrewarmReport:
        """Rebuild the entries of ``hot_keys`` (hottest first) under ``state``: find their rows (the
        entry's ``k`` field, or the key itself for row-keyed namespaces), reload them, key them with the
        new weights and write them with the new signature, in batches."""
        report = PrewarmReport(binding.namespace, hot=len(hot_keys))
        started = time.perf_counter()
        batch = self.settings.prewarm_batch
        for start in range(0, len(hot_keys), batch):
            await self._prewarm_batch(binding, state, hot_keys[start : start + batch], report)
        report.seconds = time.perf_counter() - started
        return report

    async def _prewarm_batch(
        self, binding: Binding, state: ModelState, keys: Sequence[str], report: PrewarmReport
    ) -> None:
        replies = await run_pipeline(self.l2.client, [("HMGET", key, "v", "k") for key in keys])
        rows_wanted: dict[str, int] = {}
        base = namespace_prefix(self.prefix, binding.namespace)
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            version, row = reply
            if binding.semantic is not None:
                row_text = row.decode() if row else None
            else:
                row_text = key[len(base) :] if key.startswith(base) else None
            if row_text is None or (binding.version_column is None and version is None):
                report.skipped += 1  # no row to rebuild it from, or no version to write it with
                continue
            held = int(version) if version is not None else 0
            rows_wanted[row_text] = max(rows_wanted.get(row_text, 0), held)
        if not rows_wanted:
            return
        key_columns = await self.key_columns_of(binding)
        loader = self.loaders.for_binding(binding)
        wanted = [tuple(unquote(part) for part in text.split("/")) for text in rows_wanted]
        rows = list(await asyncio.to_thread(lambda: list(loader(binding, key_columns, wanted))))
        report.rows += len(rows)
        requests: list[KeyRequest] = []
        prepared: list[tuple[dict[str, Any], str, int]] = []
        for row in rows:
            try:
                text = row_key([row[c] for c in key_columns])
            except KeyError:
                report.skipped += 1
                continue
            try:
                version = row_version(binding, row)
            except BindError:
                report.skipped += 1
                continue
            if version is None:
                version = rows_wanted.get(text)
            if version is None:
                report.skipped += 1
                continue
            prepared.append((dict(row), text, version))
            if binding.semantic is not None:
                requests.append(KeyRequest(binding, state, row))
        keyed: list[str | EmbeddingError]
        if binding.semantic is not None:
            keyed = await asyncio.to_thread(semantic_keys, requests, self.prefix)
        else:
            keyed = [base + text for _, text, _ in prepared]  # entry_key of the row's key values
        now_us = int(time.time() * 1_000_000)
        actions: list[CacheAction] = []
        for (row, text, version), new_key in zip(prepared, keyed, strict=True):
            if isinstance(new_key, EmbeddingError):
                report.skipped += 1
                continue
            try:
                value = row_value(binding, row)
            except BindError:
                report.skipped += 1
                continue
            actions.append(
                CacheAction(
                    "write",
                    new_key,
                    version,
                    row_commit_time_us(binding, row) or now_us,
                    value,
                    signature=state.signature_for(binding, row),
                    row=text if binding.semantic is not None else None,
                )
            )
        if not actions:
            return
        results = await self.l2.apply(actions)  # writes go innermost first, like the pipeline's
        for tier in self.tiers[1:]:
            await tier.apply(actions)
        report.written += sum(1 for r in results if r.outcome.value == "applied")
        report.stale += sum(1 for r in results if r.outcome.value != "applied")

    # -- DDL --------------------------------------------------------------------------------------------

    async def on_ddl(self, event: DdlEvent) -> list[str]:
        """Move the signature of every namespace the DDL may concern (:func:`ddl_concerns`); returns the
        namespaces whose signature moved.

        Every namespace has a signature, model or not: the new one covers the table's columns now and
        is ordered by the DDL's binlog version, so a replay of the DDL moves nothing and entries built
        under the old column set (or the old column types) are never served again. An O(1) switch: the
        entries go by TTL or sweep. Outages (Redis, the database) are raised, so the caller retries.
        """
        concerned = [b for b in self.bindings.values() if ddl_concerns(event, b)]
        if not concerned:
            return []
        states = await read_signatures(self.l2.client, self.prefix, [b.namespace for b in concerned])
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
            columns = await self._projection(binding)
            record = SignatureRecord.at(update, columns, order)
            for tier in reversed(self.tiers[1:]):
                await set_signature(tier.client, self.prefix, binding.namespace, record, channel=tier.channel)
            result = await set_signature(
                self.l2.client, self.prefix, binding.namespace, record, channel=self.l2.channel
            )
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
