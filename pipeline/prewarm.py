"""Prewarm: rebuild a namespace's hottest entries under a new model before (or right after) it is switched.

A prewarm is an optimization: when it cannot be done (no such loader, rows that do not fit the binding)
the cutover goes on without it. Outages (Redis, the database) are raised, so the cutover is retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cache_writer import CacheAction, CacheTier
from cache_writer.layout import row_entry_key, row_key_values, row_of
from cache_writer.semantic.exceptions import EmbeddingError
from pipeline.loaders import LoaderError, Loaders
from pipeline.models import KeyRequest, ModelState, semantic_keys
from pipeline.plan import BindError, row_commit_time_us, row_value, row_version
from pipeline.settings import ModelSettings
from schemas import Binding, row_key

log = logging.getLogger(__name__)

ColumnsOf = Callable[[Binding], Awaitable[tuple[str, ...]]]
"""The columns of the binding's table now (information_schema), in table order."""
KeyColumnsOf = Callable[[Binding], Awaitable[tuple[str, ...]]]
"""The key columns of the binding (its key_columns, or the table's primary key)."""


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


class Prewarmer:
    """Reloads rows (database or loader hook), keys them with the new weights and writes the entries."""

    def __init__(
        self,
        *,
        prefix: str,
        settings: ModelSettings,
        key_columns_of: KeyColumnsOf,
        loaders: Loaders,
        tiers: list[CacheTier],
    ) -> None:
        self.prefix = prefix
        self.settings = settings
        self.key_columns_of = key_columns_of
        self.loaders = loaders
        self.tiers = tiers

    @property
    def l2(self) -> CacheTier:
        return self.tiers[0]

    async def prewarm_or_note(
        self, binding: Binding, state: ModelState, hot_keys: Sequence[str]
    ) -> PrewarmReport:
        """A prewarm is an optimization: when it cannot be done (no such loader, rows that do not fit
        the binding) the cutover goes on without it. Outages (Redis, the database) are raised, so the
        cutover is retried."""
        try:
            return await self.prewarm(binding, state, hot_keys)
        except (LoaderError, BindError) as exc:
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
            await self._batch(binding, state, hot_keys[start : start + batch], report)
        report.seconds = time.perf_counter() - started
        return report

    async def _batch(
        self, binding: Binding, state: ModelState, keys: Sequence[str], report: PrewarmReport
    ) -> None:
        replies = await self.l2.read_fields(keys, ("v", "k"))
        rows_wanted: dict[str, int] = {}
        for key, (held_field, row_field) in zip(keys, replies, strict=True):
            if binding.semantic is not None:
                row_text = row_field.decode() if row_field else None
            else:
                row_text = row_of(key, self.prefix, binding.namespace)
            if row_text is None or (binding.version_column is None and held_field is None):
                report.skipped += 1  # no row to rebuild it from, or no version to write it with
                continue
            held = int(held_field) if held_field is not None else 0
            rows_wanted[row_text] = max(rows_wanted.get(row_text, 0), held)
        if not rows_wanted:
            return
        key_columns = await self.key_columns_of(binding)
        loader = self.loaders.for_binding(binding)
        wanted = [tuple(row_key_values(text)) for text in rows_wanted]
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
            keyed = [row_entry_key(self.prefix, binding.namespace, text) for _, text, _ in prepared]
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
