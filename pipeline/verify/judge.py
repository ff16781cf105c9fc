"""Compare cache tiers with the database, entry by entry, and tell stale from still in flight.

One look (:func:`judge`, :func:`verify_namespace`): an entry is *wrong* when it is live and its value
(or, with a version column, its version) differs from the row, or when it is live while the row is gone.
A row without a live entry is *missing*: a plain miss for the application (never served stale), a lost
change when every row went through the pipeline in write mode.

A wrong entry seen once may be a change still in flight, so :func:`run_verification` works in two reads:

1. **First read.** Per binding it records the state of the source *before* reading the rows: with a
   ``version_column`` the rows carry their own versions; otherwise the server's binlog position
   (``SHOW MASTER STATUS``) or executed GTIDs (``@@gtid_current_pos`` on MariaDB, ``@@gtid_executed`` on
   MySQL), turned into a *floor*: the smallest version (``schemas.versions``, the connector's
   ``FRESHKEY_CONNECTOR_VERSION_SOURCE``) that a change committed after that moment can have. Then it
   reads the rows and every tier's entries; each wrong entry is a *suspect*, and the row as read then
   (or its absence) is its *first-read state*.
2. **After the window** (``window_ms``, the SLA window) it reads each suspect's row and entry again and
   calls the entry **stale only when it is still older than the first-read state**
   (:func:`judge_after_window`):

   - it now matches the row, or it was invalidated since: in flight;
   - with a version column: stale when ``entry.version`` < the row's version at the first read, or when
     the entry carries a version the row had (at the first read or now) with another value, or a version
     newer than the row's now (no change in flight can be that new, and the forward-only CAS keeps it);
     a live entry for a row gone at the first read and still gone is stale;
   - with binlog/GTID versions: stale when the entry's version is below the floor (it comes from a
     change committed before the first read) *and* its value is neither the first-read value nor the
     current value; a live entry for a row gone at the first read and still gone, below the floor, is
     stale;
   - anything that moved past the first-read state (a version at or above the floor, or above the
     first-read version) is in flight: the pipeline has had the window to apply the first-read state
     and it did, or something newer.

   Without a binlog position (binlog off, or no privilege to read it) versions cannot be compared and
   only values are: stale when the value is neither the first-read nor the current value.

Nothing about one binding stops the others: a binding whose table is missing, has no primary key and no
``key_columns``, or lacks a column the binding names is reported *unverifiable* with what to change, and
so are single entry keys that cannot be read back (a key with the wrong number of parts, a version column
that holds no version). A key that a key column cannot hold (an emoji against a latin1 column) is no row
of the table: its live entry is judged as an entry for a row that does not exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from cache_writer import entry_key
from cache_writer.entries import Entry
from connectors.database import (
    BinlogPosition,
)
from schemas import (
    Binding,
    VersionError,
    binlog_version,
    column_version,
    encode_value,
    gtid_version,
)
from schemas.versions import gtid_sequence

VersionSource = Literal["binlog", "gtid"]

MIN_CHECKED_FOR_NINES = 10
"""Below this many checked entries no nines are stated: 0 stale of n can show at most log10(n) nines."""

EXIT_CLEAN, EXIT_STALE, EXIT_UNVERIFIABLE = 0, 1, 3
"""``freshkey verify`` exit codes: 2 stays click's usage error. Stale wins over unverifiable."""


class Verdict(StrEnum):
    OK = "ok"
    STALE = "stale"
    MISSING = "missing"
    IN_FLIGHT = "in flight"


def expected_value(binding: Binding, row: Mapping[str, Any]) -> bytes:
    """The cache value (``d``) the pipeline writes for ``row`` under ``binding``."""
    projected = row if binding.value_columns is None else {c: row[c] for c in binding.value_columns}
    return encode_value(projected)


def judge(binding: Binding, row: Mapping[str, Any] | None, entry: Entry | None) -> tuple[Verdict, str]:
    """One row (None: it does not exist) against one entry (None: absent), in one look.

    Raises :class:`schemas.VersionError` when the row's version column holds no usable version.
    """
    live = entry is not None and not entry.tombstone
    if row is None:
        if live:
            assert entry is not None
            return Verdict.STALE, f"live entry v{entry.version} for a row that does not exist"
        return Verdict.OK, ""
    if not live:
        return Verdict.MISSING, "no live entry"
    assert entry is not None
    expected = expected_value(binding, row)
    if entry.value != expected:
        return Verdict.STALE, f"value {entry.value!r} != database {expected!r}"
    if binding.version_column is not None:
        want = column_version(row[binding.version_column])
        if entry.version != want:
            return Verdict.STALE, f"version {entry.version} != database {want}"
    return Verdict.OK, ""


@dataclass(frozen=True, slots=True)
class FirstRead:
    """What a suspect's row was at the first read, and where the source stood just before it."""

    row: Mapping[str, Any] | None
    """The row as first read; None: it did not exist."""
    floor: int | None = None
    """Binlog/GTID versions: the smallest version a change committed after the first read can have
    (:func:`version_floor`); None with a version column, or when the position could not be read."""


def judge_after_window(
    binding: Binding, first: FirstRead, row: Mapping[str, Any] | None, entry: Entry | None
) -> tuple[Verdict, str]:
    """A suspect after the window: STALE only when the entry is still older than its first-read state.

    ``row`` and ``entry`` are as read after the window. Returns STALE or IN_FLIGHT (see the module
    docstring for the rule). Raises :class:`schemas.VersionError` when a version column holds no version.
    """
    verdict, _ = judge(binding, row, entry)
    if verdict is Verdict.OK:
        return Verdict.IN_FLIGHT, "caught up with the row"
    if verdict is Verdict.MISSING:
        return Verdict.IN_FLIGHT, "invalidated since the first read"
    assert entry is not None and entry.value is not None  # live
    column = binding.version_column
    if column is not None:
        return _judge_by_column(binding, column, first, row, entry)
    known = {expected_value(binding, r) for r in (first.row, row) if r is not None}
    if entry.value in known:
        return Verdict.IN_FLIGHT, "holds the row's value at the first read or now"
    if first.floor is not None and entry.version >= first.floor:
        return Verdict.IN_FLIGHT, f"v{entry.version} is from a change after the first read"
    before = "" if first.floor is None else " and its version is from before the first read"
    if first.row is None and row is None:
        return Verdict.STALE, f"live entry v{entry.version} for a row gone at the first read and still gone"
    return Verdict.STALE, (
        f"value {entry.value!r} (v{entry.version}) is neither the row at the first read nor now{before}"
    )


def _judge_by_column(
    binding: Binding, column: str, first: FirstRead, row: Mapping[str, Any] | None, entry: Entry
) -> tuple[Verdict, str]:
    if first.row is not None:
        want = column_version(first.row[column])
        if entry.version < want:
            return Verdict.STALE, f"v{entry.version} is older than the row at the first read (v{want})"
        if entry.version == want and entry.value != expected_value(binding, first.row):
            return Verdict.STALE, f"v{entry.version} is the row's version at the first read, another value"
    elif row is None:
        return Verdict.STALE, f"live entry v{entry.version} for a row gone at the first read and still gone"
    if row is not None:
        now = column_version(row[column])
        if entry.version == now and entry.value != expected_value(binding, row):
            return Verdict.STALE, f"v{entry.version} is the row's version now, with another value"
        if entry.version > now:
            return Verdict.STALE, f"v{entry.version} is newer than the row (v{now}): no change can replace it"
    return Verdict.IN_FLIGHT, f"v{entry.version} moved past the first read"


def version_floor(source: VersionSource, position: BinlogPosition | None) -> int | None:
    """The smallest version a change committed after ``position`` can have; None when unknown.

    ``binlog``: a rows event committed later ends after ``pos`` (or in a later file), so its version is
    at least ``binlog_version(file, pos + 1, 0)``; every earlier one ends at or before ``pos`` and is
    below it. ``gtid``: a later transaction has a larger sequence number than the highest executed one
    (the highest over all domains or source uuids: versions of different domains do not compare, and
    this errs towards calling an old entry old).
    """
    if position is None:
        return None
    if source == "binlog":
        try:
            return binlog_version(position.file, position.pos + 1, 0)
        except VersionError:
            return None
    sequences = [_highest_sequence(part) for part in position.gtid.replace("\n", "").split(",") if part]
    found = [s for s in sequences if s is not None]
    if not found:
        return None
    try:
        # The version of the first row of the next transaction (any domain: only the number counts).
        return gtid_version(str(max(found) + 1), 0)
    except VersionError:
        return None


def _highest_sequence(gtid_set: str) -> int | None:
    """Highest sequence of one MariaDB GTID (``0-1-42``) or MySQL set (``uuid:1-40:42-45``)."""
    gtid_set = gtid_set.strip()
    try:
        if ":" not in gtid_set:
            return gtid_sequence(gtid_set)
        ends = [interval.rsplit("-", 1)[-1] for interval in gtid_set.split(":")[1:]]
        return max(int(end) for end in ends if end.isdecimal())
    except (VersionError, ValueError):
        return None


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
    unverifiable: str | None = None
    """Why this binding could not be verified at all (then every count is 0); None: it was."""
    unverifiable_keys: int = 0
    """Entries that could not be judged (their key cannot be read back, or no usable version)."""
    rule: str = ""
    """How in-flight entries were told from stale ones: version column, binlog/gtid floor, value only."""
    examples: list[str] = field(default_factory=list)

    def example(self, text: str) -> None:
        """Keep ``text`` among the report's examples (the first 10)."""
        if len(self.examples) < 10:
            self.examples.append(text)

    def count_unverifiable(self, key: str, why: str) -> None:
        """One more key whose entry or row could not be judged, with an example saying why."""
        self.unverifiable_keys += 1
        self.example(f"unverifiable: {key}: {why}")

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "tier": self.tier,
            "rows": self.rows,
            "checked": self.checked,
            "stale": self.stale,
            "in_flight": self.in_flight,
            "missing": self.missing,
            "versions_checked": self.versions_checked,
            "unverifiable": self.unverifiable,
            "unverifiable_keys": self.unverifiable_keys,
            "rule": self.rule,
            "examples": self.examples,
        }


def verify_namespace(
    binding: Binding,
    rows: Iterable[Mapping[str, Any]],
    entries: Mapping[str, Entry],
    *,
    prefix: str,
    key_columns: tuple[str, ...],
) -> VerifyReport:
    """Every row against the namespace's entries, and every entry without a row (one pass, no re-check).

    ``key_columns`` are the binding's, or the table's primary key when the binding names none. For a
    quiet pipeline (tests, the demo): a change in flight counts as stale here.
    """
    report = VerifyReport(binding.namespace, entries=len(entries))
    report.versions_checked = binding.version_column is not None
    seen: set[str] = set()
    for row in rows:
        report.rows += 1
        key = entry_key(prefix, binding.namespace, [row[c] for c in key_columns])
        seen.add(key)
        _count(report, key, binding, row, entries.get(key))
    for key, entry in entries.items():
        if key not in seen:
            _count(report, key, binding, None, entry)
    return report


def judge_or_count(
    report: VerifyReport, key: str, binding: Binding, row: Mapping[str, Any] | None, entry: Entry | None
) -> tuple[Verdict, str] | None:
    """:func:`judge`, or None once ``key`` is counted unverifiable (a version that cannot be read)."""
    try:
        return judge(binding, row, entry)
    except VersionError as exc:
        report.count_unverifiable(key, str(exc))
        return None


def _count(
    report: VerifyReport, key: str, binding: Binding, row: Mapping[str, Any] | None, entry: Entry | None
) -> None:
    judged = judge_or_count(report, key, binding, row, entry)
    if judged is None:
        return
    verdict, reason = judged
    if verdict is Verdict.MISSING:
        report.missing += 1
        report.example(f"missing: {key}")
        return
    report.checked += 1
    if verdict is Verdict.STALE:
        report.stale += 1
        report.example(f"stale: {key}: {reason}")


def nines(checked: int, stale: int) -> float:
    """-log10 of the stale fraction, capped at what the sample size can show (log10(checked))."""
    if checked <= 0:
        return 0.0
    cap = math.log10(checked)
    if stale == 0:
        return round(cap, 2)
    return round(min(-math.log10(stale / checked), cap), 2)


def stated_nines(checked: int, stale: int) -> float | None:
    """:func:`nines`, or None below :data:`MIN_CHECKED_FOR_NINES` checked entries (too few to say)."""
    return nines(checked, stale) if checked >= MIN_CHECKED_FOR_NINES else None


def nines_text(checked: int, stale: int) -> str:
    """``"1.48 nines"``, or ``"0 stale of 1 (too few to state nines)"`` for a tiny sample."""
    figure = stated_nines(checked, stale)
    if figure is None:
        return (
            f"{stale} stale of {checked} (too few to state nines: fewer than {MIN_CHECKED_FOR_NINES} checked)"
        )
    return f"{figure:.2f} nines"


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

    @property
    def unverifiable(self) -> list[VerifyReport]:
        """Reports of bindings that could not be verified at all."""
        return [r for r in self.reports if r.unverifiable is not None]

    @property
    def unverifiable_keys(self) -> int:
        return sum(r.unverifiable_keys for r in self.reports)

    @property
    def exit_code(self) -> int:
        """0 clean, 1 stale entries found, 3 nothing stale but something could not be verified."""
        if self.stale:
            return EXIT_STALE
        if self.unverifiable or self.unverifiable_keys:
            return EXIT_UNVERIFIABLE
        return EXIT_CLEAN

    @property
    def status(self) -> str:
        return {EXIT_CLEAN: "clean", EXIT_STALE: "stale", EXIT_UNVERIFIABLE: "unverifiable"}[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "checked": self.checked,
            "stale": self.stale,
            "in_flight": self.in_flight,
            "nines": stated_nines(self.checked, self.stale),
            "nines_text": nines_text(self.checked, self.stale),
            "min_checked_for_nines": MIN_CHECKED_FOR_NINES,
            "unverifiable": [{"namespace": r.namespace, "reason": r.unverifiable} for r in self.unverifiable],
            "unverifiable_keys": self.unverifiable_keys,
            "window_ms": self.window_ms,
            "ts_ms": int(time.time() * 1000),
            "reports": [r.to_json() for r in self.reports],
        }
