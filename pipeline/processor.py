"""The change processor: a batch of raw change messages -> planned cache actions -> every tier.

Independent of Faust's types, so it is tested and benchmarked without a broker. The Faust agent
(``pipeline.agents.changes``) feeds it batches and acknowledges them once it returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from cache_writer import (
    ActionResult,
    CacheAction,
    CacheTier,
    Outcome,
    TierUnavailableError,
)
from cache_writer.retry import RetryPolicy, TierGuard, apply_within
from cache_writer.semantic.exceptions import EmbeddingError
from pipeline.models import (
    NO_MODEL,
    KeyRequest,
    ModelRegistry,
    NamespaceModels,
    semantic_keys,
)
from pipeline.observe import BatchBuilder, Observers
from pipeline.observe.stats import WorkerStats
from pipeline.outages import OUTAGES
from pipeline.plan import BindError, commit_time_coarse, plan
from pipeline.prepared import Fence, Planned, Prepared, Reject, describe
from pipeline.unapplied import lost_changes, oversize_plan
from schemas import Binding, Bindings, Change, DdlEvent, DecodeError, FenceEvent, decode_change
from schemas.debezium import Skip

log = logging.getLogger(__name__)

__all__ = ["ChangeProcessor", "Decoder", "Planned", "Prepared", "Reject", "describe"]


Decoder = Callable[[str, bytes | None, bytes | None], Change | DdlEvent | FenceEvent | Skip]


def _freshkey_decoder(topic: str, key: bytes | None, value: bytes | None) -> Change | DdlEvent | FenceEvent:
    return decode_change(value if value is not None else b"")


class ChangeProcessor:
    """Turns a batch of raw messages into tier writes and reports to its observers.

    Independent of Faust's types, so it is tested and benchmarked without a broker. Per-message failures
    of any kind (decode, bind, keys, a value a tier refuses) become :class:`Reject`s; only outages are
    raised (:data:`OUTAGES`), so the caller retries the batch.
    """

    def __init__(
        self,
        bindings: Bindings,
        tiers: Sequence[CacheTier],
        *,
        key_prefix: str,
        stats: WorkerStats | None = None,
        models: ModelRegistry | None = None,
        policy: RetryPolicy | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        self.bindings = bindings
        self.tiers = list(tiers)
        self.key_prefix = key_prefix
        self.stats = stats or WorkerStats()
        self.observers = Observers([self.stats])
        self.models = models
        self.policy = policy or RetryPolicy()
        self.guards: dict[str, TierGuard] = {}
        self.on_outer_fenced: Callable[[CacheTier], Awaitable[None]] | None = None
        """Called once when an outer tier is fenced (mark it for readers, start its recovery)."""
        self.decoder: Decoder = decoder or _freshkey_decoder
        """Turns one message (topic, key, value) into an event, or a Skip (``schemas.debezium.decode_any``
        for Debezium input); raises DecodeError for a message that is no valid event."""
        self.on_primary_back: Callable[[], Awaitable[None]] | None = None
        """Called when L2 answers again after an outage past the fence bound, before anything else is
        applied (fences every namespace there)."""

    def guard(self, tier: CacheTier) -> TierGuard:
        guard = self.guards.get(tier.name)
        if guard is None:
            guard = self.guards[tier.name] = TierGuard(tier.name, self.policy)
        return guard

    async def prepare(
        self, messages: Sequence[tuple[bytes | None, bytes | None]], *, topics: Sequence[str] = ()
    ) -> Prepared:
        """Decode, read the namespaces' model state, key and plan (see the class docstring).

        ``topics``: the topic of each message (the decoder of Debezium input needs it). A message that
        carries no change for the cache (a Debezium tombstone or heartbeat) is counted as ``skipped``. A
        change of a semantic binding whose after image cannot be keyed is planned without that write (its
        before image's key is still invalidated) and also rejected (stage ``semantic-key``).
        """
        bound: list[tuple[int, Change, Binding]] = []
        prepared = Prepared([], [], [], {})
        for index, (key, value) in enumerate(messages):
            try:
                decoded = self.decoder(topics[index] if topics else "", key, value)
            except DecodeError as exc:
                prepared.rejects.append(Reject(index, "decode", exc.reason))
                continue
            except Exception as exc:  # the decoder itself failed on this input: still bad input
                prepared.rejects.append(Reject(index, "decode", describe(exc)))
                continue
            if isinstance(decoded, Skip):
                self.observers.on_event("skipped")
                continue
            event = decoded
            if event.kind == "fence":
                self._fence_event(event, prepared)
                continue
            if event.kind == "ddl":
                self.observers.on_event("ddl")
                log.info("DDL on %s: %s", event.source.db, event.query[:200])
                prepared.ddl.append(event)
                continue
            binding = self.bindings.for_table(event.source.db, event.source.table)
            if binding is None:
                self.observers.on_event("unbound")
                continue
            bound.append((index, event, binding))
        models: dict[str, NamespaceModels] = {}
        if self.models is not None and bound and self.tiers:
            models = await self.models.refresh(
                self.tiers[0],
                {binding.namespace for _, _, binding in bound},
            )
        keys = await self._semantic_keys(bound, models)
        for index, event, binding in bound:
            actions: list[CacheAction] | tuple[list[CacheAction], str]
            try:
                if event.oversize:
                    actions = self._plan_oversize(event, binding, prepared)
                else:
                    actions = self._plan(index, event, binding, models.get(binding.namespace, NO_MODEL), keys)
            except BindError as exc:
                prepared.rejects.append(Reject(index, "bind", str(exc)))
                continue
            except OUTAGES:
                raise
            except Exception as exc:  # any other failure of this one change: dead letter, with its class
                log.exception("planning %s failed", event.event_id)
                prepared.rejects.append(Reject(index, "plan", describe(exc)))
                continue
            if isinstance(actions, tuple):
                actions, reason = actions
                prepared.rejects.append(Reject(index, "semantic-key", reason))
            prepared.planned.append(Planned(index, event, binding, actions))
        return prepared

    def _plan_oversize(self, event: Change, binding: Binding, prepared: Prepared) -> list[CacheAction]:
        self.observers.on_event("oversize")
        planned = oversize_plan(event, binding, self.key_prefix)
        if isinstance(planned, Fence):
            prepared.fences.setdefault(binding.namespace, planned)
            return []
        return planned

    def _fence_event(self, event: FenceEvent, prepared: Prepared) -> None:
        self.observers.on_event("fence_event")
        binding = self.bindings.for_table(event.source.db, event.source.table)
        if binding is not None:
            prepared.fences[binding.namespace] = lost_changes(event, binding)

    async def _semantic_keys(
        self, bound: Sequence[tuple[int, Change, Binding]], models: dict[str, NamespaceModels]
    ) -> dict[tuple[int, int, str], str | EmbeddingError]:
        """Every image's key under every model state of its namespace, computed in one batch per keyer
        and modality: before and after images of an update are keyed together (invariant 6 makes the
        batch composition irrelevant to the keys). When the batch fails on something other than an
        outage, each request is keyed alone, so one bad row cannot fail the others."""
        requests: list[KeyRequest] = []
        where: list[tuple[int, int, str]] = []
        for index, event, binding in bound:
            if binding.semantic is None or event.oversize:
                continue
            for position, state in enumerate(models.get(binding.namespace, NO_MODEL).keyed_states):
                for role, image in (("before", event.before), ("after", event.after)):
                    if image is not None:
                        requests.append(KeyRequest(binding, state, image))
                        where.append((index, position, role))
        if not requests:
            return {}
        try:
            keys = await asyncio.to_thread(semantic_keys, requests, self.key_prefix)
        except OUTAGES:
            raise
        except Exception as exc:
            log.warning("semantic keys of the batch failed (%r): keying each row alone", exc)
            keys = []
            for request in requests:
                try:
                    keys.extend(await asyncio.to_thread(semantic_keys, [request], self.key_prefix))
                except OUTAGES:
                    raise
                except Exception as one:
                    keys.append(EmbeddingError(describe(one)))
        return dict(zip(where, keys, strict=True))

    def _plan(
        self,
        index: int,
        event: Change,
        binding: Binding,
        models: NamespaceModels,
        keys: dict[tuple[int, int, str], str | EmbeddingError],
    ) -> list[CacheAction] | tuple[list[CacheAction], str]:
        if binding.semantic is None:
            active = models.active
            if active is None:  # no signature yet: entries carry none
                return plan(binding, event, prefix=self.key_prefix)
            return plan(
                binding,
                event,
                prefix=self.key_prefix,
                signature_of=lambda image: active.signature_for(binding, image),
            )
        if not models.keyed_states:
            self.observers.on_event("unkeyed")  # no model yet: no key can be computed, nothing cached
            return []
        actions: list[CacheAction] = []
        failures: list[str] = []
        roles = {id(event.before): "before", id(event.after): "after"}
        for position, state in enumerate(models.keyed_states):

            def key_of(image: Any, position: int = position) -> str | None:
                key = keys[(index, position, roles[id(image)])]
                if isinstance(key, EmbeddingError):
                    if roles[id(image)] == "after" and binding.on_change == "write":
                        failures.append(f"no semantic key for the new row: {key}")
                    return None
                return key

            actions += plan(
                binding,
                event,
                prefix=self.key_prefix,
                key_of=key_of,
                signature_of=lambda image, state=state: state.signature_for(binding, image),  # type: ignore[misc]
            )
        if failures:
            return actions, failures[0]
        return actions

    async def apply(
        self, planned: Sequence[Planned], *, received_ms: float, planned_ms: float
    ) -> list[Reject]:
        """Apply to every tier, then report the batch (one ``BatchReport``); returns the changes a tier
        refused for good.

        ``tiers`` are ordered inner (L2) to outer (L3...). Invalidations go outermost first, so no reader
        can refill an inner tier from an outer one that still holds the old entry; writes go innermost
        first. Within a tier the actions keep their order; across the two groups, the version checks
        make the order irrelevant for the final state. A tier that does not answer is retried until it
        does or until it is fenced (``cache_writer.retry``).
        """
        indexed = [(a, p) for p in planned for a in p.actions]
        if not indexed:
            return []
        # Per key only the newest action of the batch is sent (a later one wins a tie): under
        # compare-and-set the older ones would be refused anyway, whatever the order they arrive in.
        newest: dict[str, int] = {}
        for i, (action, _) in enumerate(indexed):
            j = newest.get(action.key)
            if j is None or action.version >= indexed[j][0].version:
                newest[action.key] = i
        kept = [indexed[i] for i in sorted(newest.values())]
        invalidations = [(a, p) for a, p in kept if a.kind == "invalidate"]
        writes = [(a, p) for a, p in kept if a.kind == "write"]
        steps = [(tier, invalidations) for tier in reversed(self.tiers)]
        steps += [(tier, writes) for tier in self.tiers]
        batch = BatchBuilder()
        refused: dict[int, Reject] = {}
        in_l2: set[int] = set()  # the changes L2 answered an action of
        applied_in_l2: set[int] = set()  # ... and applied at least one
        applied, failed = Outcome.APPLIED, Outcome.FAILED
        for tier, group in steps:
            if not group:
                continue
            results = await self._apply_to(tier, [a for a, _ in group])
            if results is None:  # fenced: it will be flushed before it is trusted again
                for _, p in group:
                    batch.skipped(tier.name, p.binding.namespace)
                continue
            batch.tier_done(tier.name)
            primary = tier is self.tiers[0]
            names: list[str] = []
            for result, (_, p) in zip(results, group, strict=True):
                outcome = result.outcome
                if outcome is applied:
                    names.append("tombstoned" if result.action.kind == "invalidate" else "applied")
                    if primary:
                        applied_in_l2.add(p.index)
                else:
                    names.append(outcome.value)
                    if outcome is failed:
                        refused.setdefault(
                            p.index, Reject(p.index, f"apply:{tier.name}", result.error or "failed")
                        )
                if primary:
                    in_l2.add(p.index)
            batch.outcomes_of(tier.name, [p.binding.namespace for _, p in group], names)
        for p in planned:
            if p.index in refused or not p.actions:
                continue
            # Every change is accounted for once: applied in L2, superseded in its batch, or refused by
            # L2 as not newer (a replay, or overtaken); the refused ones go to the dead-letter topic.
            if p.index not in in_l2:
                accounted = "change_superseded"
            elif p.index in applied_in_l2:
                accounted = "change_applied"
            else:
                accounted = "change_not_newer"
            # Every action of a change carries its commit time (plan, _plan_oversize): not parsed again.
            commit_us = p.actions[0].commit_ts_us
            coarse = commit_time_coarse(p.binding, p.event)
            batch.change(
                p.binding.namespace, p.event.op, accounted, p.event.ts_ms, commit_us / 1000, coarse=coarse
            )
        self.observers.on_batch(batch.report(received_ms=received_ms, planned_ms=planned_ms))
        return list(refused.values())

    async def _apply_to(self, tier: CacheTier, actions: list[CacheAction]) -> list[ActionResult] | None:
        """The tier's results, or None when the tier is fenced (skipped). A write the tier refuses for
        good is replaced by an invalidation of its key, so the entry cannot stay at an older value."""
        guard = self.guard(tier)
        primary = tier is self.tiers[0]
        if guard.state == "fenced" and not primary:
            return None
        while True:
            started = guard.clock()
            try:
                results = await apply_within(tier, actions, None if primary else guard.time_left_s())
                break
            except TierUnavailableError as exc:
                wait = guard.failed(exc, since=started)
                if guard.attempts == 1 or guard.attempts % 10 == 0:
                    log.warning(
                        "tier %s failing for %.1f s (%s); attempt %d, next in %.2f s; "
                        "nothing is acknowledged",
                        tier.name, guard.failing_for_s, exc.cause, guard.attempts, wait,
                    )  # fmt: skip
                if guard.due_to_fence():
                    guard.fence()
                    if not primary:
                        log.error(
                            "tier %s fenced after %.1f s of failures: the pipeline goes on without it; "
                            "it is flushed before it is trusted again",
                            tier.name, guard.failing_for_s,
                        )  # fmt: skip
                        if self.on_outer_fenced is not None:
                            await self.on_outer_fenced(tier)
                        return None
                    log.error(
                        "tier %s out of reach for %.1f s: changes wait for it (nothing is acknowledged); "
                        "when it answers, every namespace is fenced there before anything else is applied",
                        tier.name, guard.failing_for_s,
                    )  # fmt: skip
                await asyncio.sleep(wait)
        if primary and guard.state == "fenced":
            if self.on_primary_back is not None:
                await self.on_primary_back()
            guard.unfence()
            log.warning("tier %s answers again; its namespaces were fenced", tier.name)
        guard.succeeded()
        failed = [r for r in results if r.outcome is Outcome.FAILED and r.action.kind == "write"]
        if failed:
            fallback = [
                CacheAction("invalidate", r.action.key, r.action.version, r.action.commit_ts_us)
                for r in failed
            ]
            log.warning(
                "tier %s refused %d write(s) (%s): invalidating them", tier.name, len(failed), failed[0].error
            )
            try:
                await tier.apply(fallback)
            except TierUnavailableError as exc:
                log.warning("invalidating refused writes in %s failed (%r); batch retried", tier.name, exc)
                raise
        return results
