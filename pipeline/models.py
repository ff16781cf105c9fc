"""The models a worker builds entries under: per namespace, the active and the pending signature.

Redis holds the truth (``cache_writer.signatures``); every worker reads the namespaces of a batch before
planning it (one pipelined ``HMGET`` of ``s`` and ``ps``), and loads a changed state in full. Reading it
*after* the batch was received is what makes a cutover safe without stopping the workers: any change
committed after a prewarm read the database is planned under the state that the prewarm had already set
(``pipeline.cutover``).

For a namespace with a semantic binding, the worker also needs the key-hash weights of each signature:
they are read from the update's ``weights_ref`` and checked against its digest, once per digest, and the
keys are computed in batches on the configured device (``FRESHKEY_WORKER_DEVICE``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cache_writer.redis.pipeline import RedisClient
from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.signatures import ClientSignatures, NamespaceSignatures, SignatureRecord
from cache_writer.tier import SignatureReader
from pipeline.plan import value_columns_of
from schemas import Binding, Bindings
from schemas.errors import Unavailable
from schemas.model_updates import ModelUpdate, ModelUpdateRejected, decode_model_update

if TYPE_CHECKING:  # torch is imported when a semantic binding needs a keyer, not before
    from cache_writer.semantic import KeyHashWeights, SemanticKeyer

log = logging.getLogger(__name__)


class ModelUnavailableError(Unavailable):
    """A namespace's active or pending model cannot be used on this worker (its weights cannot be read);
    the batch is retried, never skipped: without the keys its invalidations could not be made."""


@dataclass
class ModelState:
    """One signature of a namespace, with its update (None: a namespace without a model, whose
    signature covers its value columns only) and, for semantic bindings, its keyer."""

    record: SignatureRecord
    update: ModelUpdate | None
    keyer: SemanticKeyer | None = None
    _by_columns: dict[tuple[str, ...], str] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        return self.record.signature

    def signature_for(self, binding: Binding, image: Mapping[str, Any]) -> str:
        """The signature of an entry built from ``image``: the record's when the image's value columns
        are the ones it covers, else the signature of the same update at the same order over the
        image's columns.

        A binding without ``value_columns`` caches every column, so a row read before an ALTER TABLE
        (fewer or other columns) gets another signature than the active one and is never served.
        """
        columns = value_columns_of(binding, image)
        if binding.value_columns is not None or tuple(sorted(columns)) == tuple(
            sorted(self.record.value_columns)
        ):
            return self.record.signature
        key = tuple(sorted(columns))
        signature = self._by_columns.get(key)
        if signature is None:
            signature = self._by_columns[key] = SignatureRecord.at(
                self.record.update, key, self.record.order
            ).signature
        return signature


@dataclass(frozen=True)
class NamespaceModels:
    active: ModelState | None = None
    pending: ModelState | None = None

    @property
    def states(self) -> list[ModelState]:
        """The states to build entries under: the pending one first, then the active one."""
        return [s for s in (self.pending, self.active) if s is not None]

    @property
    def keyed_states(self) -> list[ModelState]:
        """The states with a model (the only ones a semantic key can be computed under)."""
        return [s for s in self.states if s.update is not None]


NO_MODEL = NamespaceModels()


class ModelRegistry:
    """Per-namespace model states of one worker, refreshed from Redis (module docstring)."""

    def __init__(
        self,
        bindings: Bindings,
        *,
        prefix: str,
        device: str = "auto",
        weights_dir: Path | None = None,
    ) -> None:
        self.bindings = {b.namespace: b for b in bindings.bindings}
        self.prefix = prefix
        self.device = device
        self.weights_dir = weights_dir
        self._versions: dict[str, str] = {}
        self._states: dict[str, NamespaceModels] = {}
        self._keyers: dict[str, SemanticKeyer] = {}

    def cached(self, namespace: str) -> NamespaceModels:
        return self._states.get(namespace, NO_MODEL)

    async def refresh(
        self, tier: SignatureReader | RedisClient, namespaces: Iterable[str]
    ) -> dict[str, NamespaceModels]:
        """The current states of ``namespaces`` (read from the primary tier now; loaded in full when they
        changed). ``tier``: the primary tier (a bare Redis client is still taken, for callers that have
        not moved to the tier yet)."""
        names = sorted(set(namespaces))
        if not names:
            return {}
        reader = tier if isinstance(tier, SignatureReader) else ClientSignatures(tier)
        versions = await reader.read_active_signatures(self.prefix, names)
        changed = [ns for ns, v in zip(names, versions, strict=True) if self._versions.get(ns) != v]
        if changed:
            full = await reader.read_signatures(self.prefix, changed)
            for namespace in changed:
                self._states[namespace] = await self._load(full[namespace])
            for namespace, version in zip(names, versions, strict=True):
                if namespace in full:
                    self._versions[namespace] = version
        return {ns: self.cached(ns) for ns in names}

    async def _load(self, signatures: NamespaceSignatures) -> NamespaceModels:
        binding = self.bindings.get(signatures.namespace)
        states = []
        for record in (signatures.active, signatures.pending):
            states.append(None if record is None else await self.state(record, binding))
        if states[0] is not None or states[1] is not None:
            log.info(
                "namespace %s: active signature %s, pending %s",
                signatures.namespace,
                states[0].signature[:12] if states[0] else "-",
                states[1].signature[:12] if states[1] else "-",
            )
        return NamespaceModels(states[0], states[1])

    async def state(self, record: SignatureRecord, binding: Binding | None) -> ModelState:
        """The state of one signature record; its keyer is loaded when the binding is semantic."""
        if not record.update:  # no model: the signature covers the value columns only
            return ModelState(record, None)
        try:
            update = decode_model_update(record.update)
        except ValueError as exc:
            raise ModelUnavailableError(
                f"signature {record.signature[:12]}: unreadable update: {exc}"
            ) from None
        keyer = None
        if binding is not None and binding.semantic is not None:
            keyer = await self.keyer(update)
        return ModelState(record, update, keyer)

    async def keyer(self, update: ModelUpdate, weights: KeyHashWeights | None = None) -> SemanticKeyer:
        """The keyer of the update's weights (loaded and digest-checked once per digest)."""
        keyer = self._keyers.get(update.weights_sha256)
        if keyer is None:
            from cache_writer.semantic import SemanticKeyer, load_update_weights

            if weights is None:
                try:
                    weights = await asyncio.to_thread(load_update_weights, update, base_dir=self.weights_dir)
                except ModelUpdateRejected as exc:
                    raise ModelUnavailableError(exc.reason) from None
            keyer = await asyncio.to_thread(SemanticKeyer, weights, self.device)
            self._keyers[update.weights_sha256] = keyer
        return keyer


@dataclass(frozen=True, slots=True)
class KeyRequest:
    """One image to key under one model state."""

    binding: Binding
    state: ModelState
    image: Mapping[str, Any]


def semantic_keys(requests: Sequence[KeyRequest], prefix: str) -> list[str | EmbeddingError]:
    """The entry key of each request under its state's keyer (``cache_writer.semantic.rows``)."""
    from cache_writer.semantic.rows import RowKeyRequest, row_keys

    return row_keys(
        [RowKeyRequest(r.binding, _keyer(r.state), r.image) for r in requests],
        prefix,
    )


def _keyer(state: ModelState) -> SemanticKeyer:
    if state.keyer is None:
        raise ValueError(f"signature {state.signature[:12]} has no keyer (no model, or not semantic)")
    return state.keyer
