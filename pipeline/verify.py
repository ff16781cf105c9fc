"""Compare cache tiers with the database, entry by entry, and tell stale from still in flight.

An entry is *stale* when it is live and its value (or, with a version column, its version) differs
from the row, or when it is live while the row is gone. A row without a live entry is *missing*: a
plain miss for the application (never served stale), a lost change when every row went through the
pipeline in write mode. A mismatch seen once may be a change still in flight; :func:`run_verification`
re-checks each one after the SLA window and only then calls it stale.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import unquote

from cache_writer import entry_key
from cache_writer.entries import Entry, parse_entry, read_namespace
from cache_writer.redis_cluster import RedisClient, run_pipeline
from cache_writer.signatures import read_signatures
from connectors.database import primary_key, read_rows, read_table
from connectors.settings import MySQLSettings
from pipeline.models import KeyRequest, ModelRegistry, semantic_keys
from schemas import Binding, Bindings, column_version, encode_value


class Verdict(StrEnum):
    OK = "ok"
    STALE = "stale"
    MISSING = "missing"


def judge(binding: Binding, row: Mapping[str, Any] | None, entry: Entry | None) -> tuple[Verdict, str]:
    """One row (None: it does not exist) against one entry (None: absent)."""
    live = entry is not None and not entry.tombstone
    if row is None:
        if live:
            assert entry is not None
            return Verdict.STALE, f"live entry v{entry.version} for a row that does not exist"
        return Verdict.OK, ""
    if not live:
        return Verdict.MISSING, "no live entry"
    assert entry is not None
    projected = row if binding.value_columns is None else {c: row[c] for c in binding.value_columns}
    expected = encode_value(projected)
    if entry.value != expected:
        return Verdict.STALE, f"value {entry.value!r} != database {expected!r}"
    if binding.version_column is not None:
        want = column_version(row[binding.version_column])
        if entry.version != want:
            return Verdict.STALE, f"version {entry.version} != database {want}"
    return Verdict.OK, ""


@dataclass
class VerifyReport:
    namespace: str
    tier: str = "redis"
    rows: int = 0
    entries: int = 0
    checked: int = 0
    stale: int = 0
    missing: int = 0
    in_flight: int = 0
    versions_checked: bool = False
    examples: list[str] = field(default_factory=list)

    def _example(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)


def verify_namespace(
    binding: Binding,
    rows: Iterable[Mapping[str, Any]],
    entries: Mapping[str, Entry],
    *,
    prefix: str,
    key_columns: tuple[str, ...],
) -> VerifyReport:
    """Every row against the namespace's entries, and every entry without a row (one pass, no re-check).

    ``key_columns`` are the binding's, or the table's primary key when the binding names none.
    """
    report = VerifyReport(binding.namespace, entries=len(entries))
    report.versions_checked = binding.version_column is not None
    seen: set[str] = set()
    for row in rows:
        report.rows += 1
        key = entry_key(prefix, binding.namespace, [row[c] for c in key_columns])
        seen.add(key)
        _count(report, key, *judge(binding, row, entries.get(key)))
    for key, entry in entries.items():
        if key not in seen:
            _count(report, key, *judge(binding, None, entry))
    return report


def _count(report: VerifyReport, key: str, verdict: Verdict, reason: str) -> None:
    if verdict is Verdict.MISSING:
        report.missing += 1
        report._example(f"missing: {key}")
        return
    report.checked += 1
    if verdict is Verdict.STALE:
        report.stale += 1
        report._example(f"stale: {key}: {reason}")


def nines(checked: int, stale: int) -> float:
    """-log10 of the stale fraction, capped at what the sample size can show (log10(checked))."""
    if checked <= 0:
        return 0.0
    cap = math.log10(checked)
    if stale == 0:
        return round(cap, 2)
    return round(min(-math.log10(stale / checked), cap), 2)


# -- the live verifier ------------------------------------------------------------------------------------


@dataclass
class Verification:
    window_ms: float
    reports: list[VerifyReport]

    @property
    def checked(self) -> int:
        return sum(r.checked for r in self.reports)

    @property
    def stale(self) -> int:
        return sum(r.stale for r in self.reports)

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.reports)

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "stale": self.stale,
            "in_flight": self.in_flight,
            "nines": nines(self.checked, self.stale),
            "window_ms": self.window_ms,
            "ts_ms": int(time.time() * 1000),
            "reports": [
                {
                    "namespace": r.namespace,
                    "tier": r.tier,
                    "rows": r.rows,
                    "checked": r.checked,
                    "stale": r.stale,
                    "in_flight": r.in_flight,
                    "missing": r.missing,
                    "versions_checked": r.versions_checked,
                    "examples": r.examples,
                }
                for r in self.reports
            ],
        }


async def _entries(client: RedisClient, keys: Sequence[str]) -> dict[str, Entry | None]:
    replies = await run_pipeline(client, [("HGETALL", key) for key in keys])
    entries: dict[str, Entry | None] = {}
    for key, fields in zip(keys, replies, strict=True):
        if isinstance(fields, Exception):
            raise fields
        entries[key] = parse_entry(key, _as_dict(fields))
    return entries


def _as_dict(fields: Any) -> dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    items = list(fields or [])
    return dict(zip(items[::2], items[1::2], strict=True))


async def run_verification(
    mysql: MySQLSettings,
    bindings: Sequence[Binding],
    tiers: Sequence[tuple[str, RedisClient]],
    *,
    prefix: str,
    window_ms: float,
    sample: int | None = None,
    seed: int | None = None,
) -> Verification:
    """Check every tier against the database (all rows, or a random sample of ``sample`` rows per
    binding); each mismatch is checked again after ``window_ms``: still wrong -> stale, else in flight."""
    rng = random.Random(seed)
    reports: list[VerifyReport] = []
    suspects: list[tuple[VerifyReport, Binding, tuple[str, ...], RedisClient, str, list[Any]]] = []
    signatures = await read_signatures(tiers[0][1], prefix, [b.namespace for b in bindings]) if tiers else {}
    registry = (
        ModelRegistry(Bindings(bindings=tuple(bindings)), prefix=prefix, device="cpu") if bindings else None
    )
    for binding in bindings:
        key_columns = binding.key_columns or primary_key(mysql, binding.database, binding.table_name)
        if not key_columns:
            raise ValueError(f"{binding.table} has no primary key: name key_columns in its binding")
        rows = list(read_table(mysql, binding.database, binding.table_name))
        if sample is not None and len(rows) > sample:
            rows = rng.sample(rows, sample)
            full = False
        else:
            full = True
        state = signatures.get(binding.namespace)
        active = state.active_signature if state is not None else ""
        if binding.semantic is None:
            by_key = {entry_key(prefix, binding.namespace, [r[c] for c in key_columns]): r for r in rows}
        else:
            # Entries are addressed by the rows' semantic keys under the active model; entries of rows
            # that are gone cannot be told from other rows' entries, so there is no full scan.
            full = False
            by_key = {}
            if state is not None and state.active is not None and registry is not None:
                model = await registry.state(state.active, binding)
                keys = semantic_keys([KeyRequest(binding, model, r) for r in rows], prefix)
                by_key = {k: r for k, r in zip(keys, rows, strict=True) if isinstance(k, str)}
        for tier_name, client in tiers:
            report = VerifyReport(binding.namespace, tier=tier_name, rows=len(rows))
            report.versions_checked = binding.version_column is not None
            entries = await _entries(client, list(by_key))
            if full:
                extra = await read_namespace(client, prefix, binding.namespace)
                for key, found in extra.items():
                    entries.setdefault(key, found)
            # An entry built under another signature than the active one is never served: absent.
            entries = {
                k: e if e is None or (e.signature or "") == active else None for k, e in entries.items()
            }
            report.entries = sum(e is not None for e in entries.values())
            for key, entry in entries.items():
                row = by_key.get(key)
                verdict, reason = judge(binding, row, entry)
                if verdict is Verdict.MISSING:
                    report.missing += 1
                    continue
                report.checked += 1
                if verdict is Verdict.STALE:
                    values = [row[c] for c in key_columns] if row else _key_values(key)
                    suspects.append((report, binding, key_columns, client, key, values))
            reports.append(report)
    if suspects:
        await asyncio.sleep(window_ms / 1000)
    for report, binding, key_columns, client, key, values in suspects:
        rows_now = (
            read_rows(mysql, binding.database, binding.table_name, key_columns, [values]) if values else []
        )
        entry_now = (await _entries(client, [key]))[key]
        state = signatures.get(binding.namespace)
        if entry_now is not None and (entry_now.signature or "") != (state.active_signature if state else ""):
            entry_now = None
        verdict, reason = judge(binding, rows_now[0] if rows_now else None, entry_now)
        if verdict is Verdict.STALE:
            report.stale += 1
            report._example(f"stale after {window_ms:.0f} ms: {key}: {reason}")
        else:
            report.in_flight += 1
    return Verification(window_ms, reports)


def _key_values(key: str) -> list[Any]:
    """Row key values from an entry key (for re-reading a row an entry claims exists)."""
    row_part = key.split("}:", 1)[1]
    return [unquote(part) for part in row_part.split("/")]
