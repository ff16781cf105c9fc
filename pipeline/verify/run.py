"""Running a verification: read the rows and every tier, judge, and re-check suspects after the window."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from cache_writer import entry_key
from cache_writer.entries import Entry, read_entries, read_namespace
from cache_writer.layout import row_key_values, row_of
from cache_writer.redis.pipeline import RedisClient
from cache_writer.signatures import read_signatures
from connectors.database import (
    binlog_position,
    primary_key,
    read_rows,
    read_table,
    table_columns,
)
from connectors.settings import MySQLSettings
from pipeline.models import KeyRequest, ModelRegistry, semantic_keys
from pipeline.verify.judge import (
    FirstRead,
    Verdict,
    Verification,
    VerifyReport,
    VersionSource,
    judge_after_window,
    judge_or_count,
    version_floor,
)
from schemas import (
    Binding,
    Bindings,
    VersionError,
    row_key,
)


@dataclass
class _Suspect:
    """A wrong entry at the first read, waiting for the window."""

    report: VerifyReport
    binding: Binding
    key_columns: tuple[str, ...]
    redis: RedisClient
    """The tier it was read from."""
    key: str
    ref: str
    """The row key (``schemas.row_key``) of the row it is about."""
    values: list[Any]
    """That row's key values, to read it again."""
    first: FirstRead


def _check_binding(mysql: MySQLSettings, binding: Binding) -> tuple[tuple[str, ...], str | None]:
    """The binding's key columns, or why it cannot be verified (and what to change)."""
    columns = table_columns(mysql, binding.database, binding.table_name)
    if not columns:
        return (), (
            f"table {binding.table} does not exist or this account cannot see it: "
            "fix the binding's table or grant SELECT on it"
        )
    key_columns = binding.key_columns or primary_key(mysql, binding.database, binding.table_name)
    if not key_columns:
        return (), f"{binding.table} has no primary key: name key_columns in its binding"
    named = [*key_columns, *(binding.value_columns or ()), *filter(None, [binding.version_column])]
    absent = [c for c in dict.fromkeys(named) if c not in columns]
    if absent:
        return (), (
            f"{binding.table} has no column {', '.join(absent)}: fix the binding's key_columns, "
            "value_columns or version_column"
        )
    return tuple(key_columns), None


def _first_position(mysql: MySQLSettings, binding: Binding, source: VersionSource) -> tuple[int | None, str]:
    """The floor of the first read (read before the rows) and the name of the rule it gives."""
    if binding.version_column is not None:
        return None, f"version column {binding.version_column}"
    try:
        floor = version_floor(source, binlog_position(mysql))
    except pymysql.err.MySQLError as exc:
        return None, f"value only (binlog position unreadable: {_mysql_message(exc)})"
    if floor is None:
        return None, f"value only (no {source} position on the server)"
    return floor, f"{source} position"


def _mysql_message(exc: BaseException) -> str:
    return str(exc.args[-1]) if exc.args else str(exc)


async def run_verification(
    mysql: MySQLSettings,
    bindings: Sequence[Binding],
    tiers: Sequence[tuple[str, RedisClient]],
    *,
    prefix: str,
    window_ms: float,
    sample: int | None = None,
    seed: int | None = None,
    version_source: VersionSource = "binlog",
) -> Verification:
    """Check every tier against the database (all rows, or a random sample of ``sample`` rows per
    binding); each wrong entry is read again after ``window_ms`` and judged against what its row was at
    the first read (module docstring). ``version_source`` is the connector's
    (``FRESHKEY_CONNECTOR_VERSION_SOURCE``). Never raises for one binding's or one key's problem: those
    are reported unverifiable and the others are checked."""
    rng = random.Random(seed)
    reports: list[VerifyReport] = []
    suspects: list[_Suspect] = []
    signatures = await read_signatures(tiers[0][1], prefix, [b.namespace for b in bindings]) if tiers else {}
    registry = (
        ModelRegistry(Bindings(bindings=tuple(bindings)), prefix=prefix, device="cpu") if bindings else None
    )
    for binding in bindings:
        floor: int | None = None
        rule = ""
        rows: list[dict[str, Any]] = []
        try:
            key_columns, problem = _check_binding(mysql, binding)
            if problem is None:
                # The position is read before the rows: every change the rows show but the position
                # does not was committed after it, so its version is at or above the floor.
                floor, rule = _first_position(mysql, binding, version_source)
                rows = list(read_table(mysql, binding.database, binding.table_name))
        except pymysql.err.MySQLError as exc:
            problem = f"cannot read {binding.table}: {_mysql_message(exc)}"
        if problem is not None:
            report = VerifyReport(binding.namespace, tier="all", unverifiable=problem)
            report.example(f"unverifiable: {problem}")
            reports.append(report)
            continue
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
            if (
                state is not None
                and state.active is not None
                and state.active.update
                and registry is not None
            ):
                model = await registry.state(state.active, binding)
                keys = semantic_keys([KeyRequest(binding, model, r) for r in rows], prefix)
                by_key = {k: r for k, r in zip(keys, rows, strict=True) if isinstance(k, str)}
        for tier_name, client in tiers:
            report = VerifyReport(binding.namespace, tier=tier_name, rows=len(rows), rule=rule)
            report.versions_checked = binding.version_column is not None
            entries = await read_entries(client, list(by_key))
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
                judged = judge_or_count(report, key, binding, row, entry)
                if judged is None:
                    continue
                verdict, _ = judged
                if verdict is Verdict.MISSING:
                    report.missing += 1
                    continue
                report.checked += 1
                if verdict is not Verdict.STALE:
                    continue
                if row is not None:
                    values = [row[c] for c in key_columns]
                    ref = row_key(values)
                else:
                    ref = row_of(key, prefix, binding.namespace) or ""
                    values = row_key_values(ref)
                    if len(values) != len(key_columns):
                        report.checked -= 1
                        report.count_unverifiable(
                            key,
                            f"{len(values)} key parts for {len(key_columns)} key columns "
                            f"({', '.join(key_columns)}): no row can have this key",
                        )
                        continue
                suspects.append(
                    _Suspect(report, binding, key_columns, client, key, ref, values, FirstRead(row, floor))
                )
            reports.append(report)
    if suspects:
        await asyncio.sleep(window_ms / 1000)
        await _recheck(mysql, suspects, tiers[0][1], prefix, window_ms)
    return Verification(window_ms, reports)


async def _recheck(
    mysql: MySQLSettings,
    suspects: Sequence[_Suspect],
    signature_client: RedisClient,
    prefix: str,
    window_ms: float,
) -> None:
    """Read every suspect's entry (one pipeline per tier) and then its row (one query per binding) again.

    Entries first: a row read after its entry is at least as new as any change the entry can hold, so an
    entry newer than the row is wrong, never a race of the two reads. Signatures are read again too: an
    entry of a signature that stopped being active during the window is not served any more.
    """
    by_client: dict[int, tuple[RedisClient, list[str]]] = {}
    for suspect in suspects:
        by_client.setdefault(id(suspect.redis), (suspect.redis, []))[1].append(suspect.key)
    entries_now: dict[tuple[int, str], Entry | None] = {}
    for client_id, (client, keys) in by_client.items():
        for key, entry in (await read_entries(client, keys)).items():
            entries_now[(client_id, key)] = entry
    by_binding: dict[str, list[_Suspect]] = {}
    for suspect in suspects:
        by_binding.setdefault(suspect.binding.namespace, []).append(suspect)
    signatures = await read_signatures(signature_client, prefix, list(by_binding))
    rows_now: dict[str, dict[str, Mapping[str, Any]] | None] = {}
    for namespace, group in by_binding.items():
        binding, key_columns = group[0].binding, group[0].key_columns
        wanted = list({s.ref: s.values for s in group}.values())
        try:
            found = read_rows(mysql, binding.database, binding.table_name, key_columns, wanted)
        except pymysql.err.MySQLError as exc:
            rows_now[namespace] = None
            for suspect in group:
                suspect.report.example(f"unverifiable: {suspect.key}: re-read failed: {_mysql_message(exc)}")
            continue
        # By exact row key: a case-insensitive column returns 'café' for 'CAFÉ', which is another key.
        rows_now[namespace] = {row_key([r[c] for c in key_columns]): r for r in found}
    for suspect in suspects:
        report, binding = suspect.report, suspect.binding
        found_rows = rows_now[binding.namespace]
        if found_rows is None:
            report.checked -= 1
            report.unverifiable_keys += 1
            continue
        entry = entries_now[(id(suspect.redis), suspect.key)]
        state = signatures.get(binding.namespace)
        if entry is not None and (entry.signature or "") != (state.active_signature if state else ""):
            entry = None
        try:
            verdict, reason = judge_after_window(binding, suspect.first, found_rows.get(suspect.ref), entry)
        except VersionError as exc:
            report.checked -= 1
            report.count_unverifiable(suspect.key, str(exc))
            continue
        if verdict is Verdict.STALE:
            report.stale += 1
            report.example(f"stale after {window_ms:.0f} ms: {suspect.key}: {reason}")
        else:
            report.in_flight += 1
