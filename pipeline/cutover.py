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
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cache_writer import CacheTier
from cache_writer.exceptions import TierUnavailableError
from cache_writer.signatures import SignatureRecord
from pipeline.ddl import move_signatures
from pipeline.loaders import Loaders
from pipeline.models import ModelRegistry
from pipeline.prewarm import ColumnsOf, KeyColumnsOf, Prewarmer, PrewarmReport
from pipeline.settings import ModelSettings
from schemas import Binding, Bindings, DdlEvent
from schemas.codec import DecodeError
from schemas.errors import InvalidInput
from schemas.model_updates import (
    ModelUpdate,
    ModelUpdateRejected,
    check_update,
    decode_model_update,
    signature_order,
)

if TYPE_CHECKING:  # torch is imported when a model update is checked, not before
    from cache_writer.semantic import KeyHashWeights

log = logging.getLogger(__name__)


class CutoverRejected(InvalidInput):
    """A model update or cutover command that is not applied; ``reason`` goes to the dead letter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
        self.tiers: list[CacheTier] = []
        self.prewarmer = Prewarmer(
            prefix=prefix, settings=settings, key_columns_of=key_columns_of, loaders=loaders, tiers=self.tiers
        )

    @property
    def l2(self) -> CacheTier:
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
            states = await self.l2.read_signatures(self.prefix, known)
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
            from cache_writer.semantic import load_update_weights

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
        columns = await self.projection(binding)
        return SignatureRecord(
            signature=update.signature(columns),
            order=signature_order(update.semver, sequence),
            update=update.model_dump_json().encode(),
            value_columns=columns,
        )

    async def projection(self, binding: Binding) -> tuple[str, ...]:
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
            pending = await self.l2.set_signature(self.prefix, namespace, record, mode="pending")
            if not pending.applied:
                raise CutoverRejected(
                    f"not-newer: {label} is not newer than the active signature of {namespace}"
                )
            try:
                report = await self.prewarmer.prewarm_or_note(binding, state, hot_keys)
                previous, switch_ms = await self._activate(binding, record, label)
            except BaseException:
                await self._roll_back(namespace, record)
                raise
        else:
            previous, switch_ms = await self._activate(binding, record, label)
            report = await self.prewarmer.prewarm_or_note(binding, state, hot_keys)
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
            dropped = await asyncio.shield(self.l2.clear_pending(self.prefix, namespace, record.signature))
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
            await tier.set_signature(self.prefix, binding.namespace, record)
        started = time.perf_counter()
        result = await self.l2.set_signature(self.prefix, binding.namespace, record)
        switch_ms = (time.perf_counter() - started) * 1000
        if not result.applied:
            raise CutoverRejected(
                f"not-newer: {label} is not newer than the active signature of {binding.namespace} "
                f"({result.previous[:12]})"
            )
        return result.previous, switch_ms

    # -- DDL --------------------------------------------------------------------------------------------

    async def on_ddl(self, event: DdlEvent) -> list[str]:
        """Move the signatures the DDL concerns (``pipeline.ddl``); returns the namespaces moved."""
        return await move_signatures(
            event, list(self.bindings.values()), self.tiers, self.prefix, projection=self.projection
        )
