"""From a binlog query event to what freshkey produces: is it a COMMIT, other transaction control, a row
change logged as a statement, or a schema change, and which bound databases or tables does it touch.
Pure functions, no I/O.

:func:`translate_ddl` turns a schema change into :class:`DdlEvent`\\ s for each bound database it may
touch: the database it ran in, and every bound ``db.table`` (or bound ``DATABASE db``) it names from
anywhere (:func:`mentioned_databases`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection
from typing import Literal

from connectors.binlog.translate import EventOrigin
from schemas import DdlEvent

StatementKind = Literal["commit", "control", "dml", "ddl"]
"""What a query event is: a COMMIT (a transaction boundary), another transaction-control statement
(BEGIN, ROLLBACK, XA, SAVEPOINT: nothing to do), a row change logged as a statement (a writer that set
``binlog_format`` to STATEMENT or MIXED for its session: its rows are not in the binlog), or a schema
change (every other statement a row-based binlog carries as a query)."""

_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "XA ", "SAVEPOINT")
_DML = re.compile(
    r"(?:\s|/\*.*?\*/|#[^\n]*(?:\n|$)|--(?:\s[^\n]*)?(?:\n|$))*"  # comments before it
    r"(?:INSERT|UPDATE|DELETE|REPLACE|LOAD\s+(?:DATA|XML)|WITH)\b",  # WITH: a CTE's UPDATE or DELETE
    re.IGNORECASE | re.DOTALL,
)


def statement_kind(query: str) -> StatementKind:
    """Whether a query event of a row-based binlog is a COMMIT, other transaction control, or DDL."""
    upper = query.strip().upper()
    if upper == "COMMIT":
        return "commit"
    if upper.startswith(_CONTROL):
        return "control"
    if _DML.match(query):
        return "dml"
    return "ddl"


def statement_tables(query: str, schema: str, tables: Collection[tuple[str, str]]) -> list[tuple[str, str]]:
    """The bound tables a row change logged as a statement may have changed: every bound table of the
    database it ran in (``schema``; a trigger or a view may reach any of them), and every bound
    ``db.table`` it names from anywhere (every bound table of a database it names as such). Generous
    like :func:`mentioned_databases`: a false positive costs a fence, a miss leaves stale entries."""
    found = {(db, table) for db, table in tables if db == schema}
    for db, named in mentioned_databases(query, tables).items():
        found |= {(db, table) for table in named} if named else {(d, t) for d, t in tables if d == db}
    return sorted(found)


def translate_ddl(
    query: str, schema: str, origin: EventOrigin, tables: Collection[tuple[str, str]], *, read_ms: int
) -> list[DdlEvent]:
    """The DDL events of a schema change run in database ``schema``: one for ``schema`` when it is a
    bound database, and one for every other bound database whose tables (or itself) it names (the table
    when it names exactly one, ``*`` otherwise). Empty when it touches no bound table."""
    databases = {db for db, _ in tables}
    events: list[DdlEvent] = []
    if schema in databases:
        events.append(_ddl(origin, schema, "*", query, read_ms))
    for db, named in sorted(mentioned_databases(query, tables).items()):
        if db != schema:  # run from another database, naming a bound table
            table = next(iter(named)) if len(named) == 1 else "*"
            events.append(_ddl(origin, db, table, query, read_ms, suffix=f":{db}"))
    return events


def _ddl(origin: EventOrigin, db: str, table: str, query: str, read_ms: int, *, suffix: str = "") -> DdlEvent:
    source = origin.source(db, table)
    return DdlEvent(
        event_id=f"{source.server_id}:{origin.file}:{source.pos}:ddl{suffix}",
        source=source,
        query=query,
        ts_ms=read_ms,
    )


_IDENTIFIER = re.compile(r'`((?:[^`]|``)+)`|"((?:[^"]|"")+)"|([\w$]+)')
_DATABASE_WORD = re.compile(r"(?:DATABASE|SCHEMA)(?:\s+IF(?:\s+NOT)?\s+EXISTS)?\s*$", re.IGNORECASE)


def _identifiers(query: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of every identifier-like token: quoted names unescaped, bare words as is."""
    found = []
    for match in _IDENTIFIER.finditer(query):
        backticked, quoted, bare = match.groups()
        name = (
            backticked.replace("``", "`")
            if backticked is not None
            else quoted.replace('""', '"')
            if quoted is not None
            else bare
        )
        found.append((match.start(), match.end(), name))
    return found


def mentioned_databases(query: str, tables: Collection[tuple[str, str]]) -> dict[str, set[str]]:
    """Bound databases a statement names, each with the bound tables of it named as ``db.table``.

    Case-insensitive, with or without backticks (or ANSI double quotes), spaces allowed around the dot;
    a quoted name holding a dot (```shop.assets```) counts too. ``DATABASE``/``SCHEMA <db>``
    (``DROP DATABASE shop``) names the database with no table (an empty set). Deliberately generous: a
    false positive costs the worker a re-signing, a miss leaves stale entries.
    """
    by_lower: dict[tuple[str, str], tuple[str, str]] = {(d.lower(), t.lower()): (d, t) for d, t in tables}
    databases = {d.lower(): d for d, _ in tables}
    found: dict[str, set[str]] = {}
    tokens = _identifiers(query)
    pairs: list[tuple[str, str]] = []
    for (_, end, first), (start, _, second) in itertools.pairwise(tokens):
        if query[end:start].strip() == ".":
            pairs.append((first, second))
    for _, _, name in tokens:
        if "." in name:  # `shop.assets`: not a qualified name in SQL, but cheap to honour
            db, _, table = name.partition(".")
            pairs.append((db, table))
    for db, table in pairs:
        bound = by_lower.get((db.lower(), table.lower()))
        if bound is not None:
            found.setdefault(bound[0], set()).add(bound[1])
    for start, _, name in tokens:
        if name.lower() in databases and _DATABASE_WORD.search(query[max(0, start - 40) : start]):
            found.setdefault(databases[name.lower()], set())
    return found
