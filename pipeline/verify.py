"""Compare a cache namespace with its table, entry by entry.

An entry is *stale* when its value or version differs from what the row says now, or when it is live
while the row is gone. A row with no entry is *missing* (a lost change when every row went through the
pipeline; a plain miss otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cache_writer import entry_key
from cache_writer.entries import Entry
from schemas import Binding, column_version, encode_value


@dataclass
class VerifyReport:
    namespace: str
    rows: int = 0
    entries: int = 0
    checked: int = 0
    stale: int = 0
    missing: int = 0
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
    """``key_columns`` are the binding's, or the table's primary key when the binding names none."""
    report = VerifyReport(binding.namespace, entries=len(entries))
    report.versions_checked = binding.version_column is not None
    seen: set[str] = set()
    for row in rows:
        report.rows += 1
        key = entry_key(prefix, binding.namespace, [row[c] for c in key_columns])
        seen.add(key)
        entry = entries.get(key)
        if entry is None:
            report.missing += 1
            report._example(f"missing: {key}")
            continue
        report.checked += 1
        projected = row if binding.value_columns is None else {c: row[c] for c in binding.value_columns}
        expected_value = encode_value(projected)
        if entry.value != expected_value:
            report.stale += 1
            report._example(f"stale value: {key}: cache {entry.value!r} != db {expected_value!r}")
        elif binding.version_column is not None and entry.version != column_version(
            row[binding.version_column]
        ):
            report.stale += 1
            report._example(f"stale version: {key}: cache v{entry.version}")
    for key, entry in entries.items():
        if key not in seen:
            report.checked += 1
            if not entry.tombstone:
                report.stale += 1
                report._example(f"live entry for a deleted row: {key} v{entry.version}")
    return report
