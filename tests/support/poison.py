"""Malformed change-topic messages, generated with hypothesis, each with what must become of it.

Shared by the unit tests of the codec and the planner (tests/unit/schemas/test_dead_letters.py) and the
integration fuzz run (tests/integration/test_poison.py): every message :func:`poison_messages` makes is
malformed at a known stage (``decode``: not a valid envelope; ``bind``: a valid envelope that does not
fit the table's binding), and the reason must name what is wrong. :class:`ChangeStream` makes the valid
changes around them; :func:`generate` draws the same examples on every run.

The messages are made for the bindings of the integration harness (tests/integration/conftest.py):
table ``<db>.assets`` with value columns modality, content, embedding and updated_at, keyed by ``id``,
versioned by the event.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from schemas import encode, encode_value, message_key
from schemas.events import MAX_TS_MS, MAX_TS_US, MAX_U32, MAX_U64, DeadLetter

TABLE = "assets"
VALUE_COLUMNS = ("modality", "content", "embedding", "updated_at")
JSON_DIGITS_LIMIT = 4300
"""Longest integer literal the JSON parser turns into a number; a longer one is an ``Invalid JSON:
number out of range`` error at the document's root, which names the column but not the field."""

INT_FIELDS: dict[str, tuple[int, int]] = {
    "version": (0, MAX_U64),
    "ts_ms": (0, MAX_TS_MS),
    "commit_ts_us": (0, MAX_TS_US),
    "source.server_id": (0, MAX_U32),
    "source.pos": (0, MAX_U64),
    "source.row": (0, MAX_U32),
    "source.ts_ms": (0, MAX_TS_MS),
}
"""Every integer field of a change event and its range (schemas/events.py)."""
DDL_INT_FIELDS = ("ts_ms", "source.server_id", "source.pos", "source.row", "source.ts_ms")
REQUIRED_FIELDS = (
    "kind",
    "event_id",
    "op",
    "key",
    "source",
    "ts_ms",
    "version",
    "commit_ts_us",
    "commit_ts_coarse",
    "source.server_id",
    "source.file",
    "source.pos",
    "source.ts_ms",
    "source.db",
    "source.table",
)
BOUNDED_STRINGS = {"source.file": 512, "source.gtid": 512, "source.db": 256, "source.table": 256}
"""String fields with a length limit: a longer string there is a decode error."""

SENTINEL = 987_654_321_987_654_321
"""Stands for a raw JSON token in a rendered envelope (a number JSON libraries would not write)."""


# --- envelopes ---------------------------------------------------------------------------------------------


def wire(data: Any) -> bytes:
    """JSON bytes of ``data``; integers beyond 64 bits (which orjson refuses) through the standard library."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, separators=(",", ":")).encode()


def image(
    row_id: int, content: str, *, modality: str = "text", embedding: str | None = None
) -> dict[str, Any]:
    return {
        "id": row_id,
        "modality": modality,
        "content": content,
        "embedding": embedding,
        "updated_at": "2026-01-01T00:00:00.000001",
    }


def change_envelope(
    db: str,
    row_id: int = 7,
    *,
    op: str = "u",
    version: int = 12_345,
    content: str = "a cat",
    ts_ms: int = 1_700_000_000_123,
    commit_ts_us: int = 1_700_000_000_000_000,
    source: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A valid change event of ``<db>.assets`` as its wire dict (op c, u, d or r)."""
    after = image(row_id, content) if op != "d" else None
    before = image(row_id, "before " + content) if op in ("u", "d") else None
    return {
        "kind": "change",
        "event_id": f"1:binlog.000003:{version}:0",
        "op": op,
        "key": {"id": row_id},
        "before": before,
        "after": after,
        "source": {
            "server_id": 1,
            "file": "binlog.000003",
            "pos": 4711,
            "row": 0,
            "gtid": "0-1-42",
            "ts_ms": 1_700_000_000_000,
            "db": db,
            "table": TABLE,
            **(source or {}),
        },
        "ts_ms": ts_ms,
        "version": version,
        "commit_ts_us": commit_ts_us,
        "commit_ts_coarse": False,
    }


def ddl_envelope(db: str) -> dict[str, Any]:
    return {
        "kind": "ddl",
        "event_id": "1:binlog.000003:99:0",
        "source": change_envelope(db)["source"],
        "query": f"ALTER TABLE {TABLE} ADD extra INT",
        "ts_ms": 1_700_000_000_000,
    }


def set_field(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def delete_field(data: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data[part]
    del data[last]


def with_token(data: dict[str, Any], path: str, token: bytes) -> bytes:
    """``data`` rendered with the raw JSON ``token`` (any number literal, NaN...) at ``path``."""
    set_field(data, path, SENTINEL)
    rendered = wire(data)
    assert rendered.count(str(SENTINEL).encode()) == 1
    return rendered.replace(str(SENTINEL).encode(), token)


# --- valid changes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A valid change of one row, as produced to the change topic, with what Redis must hold after it."""

    row_id: int
    op: str
    version: int
    key: bytes
    value: bytes
    expected: bytes | None
    """The entry's ``d`` once applied (the projected value columns), None for a delete (a tombstone)."""


@dataclass
class ChangeStream:
    """Valid changes of ``<db>.assets``: creates, updates and deletes of a few rows with versions that
    only grow, so the last change of each row is what its entry must hold in the end."""

    db: str
    next_version: int = 1_000_000
    rows: dict[int, Change] = field(default_factory=dict)

    def change(self, row_id: int, *, delete: bool = False, edges: Mapping[str, int] | None = None) -> Change:
        """The next change of ``row_id``: a create when it is absent or deleted, else an update (or a
        delete, when asked). ``edges`` sets integer fields (``ts_ms``, ``source.pos``...) to in-range
        extremes: a valid change must apply whatever its numbers."""
        previous = self.rows.get(row_id)
        exists = previous is not None and previous.op != "d"
        op = ("d" if delete else "u") if exists else "c"
        version = self.next_version
        self.next_version += 1
        content = f"row {row_id} at version {version}"
        data = change_envelope(self.db, row_id, op=op, version=version, content=content)
        if op == "u" and previous is not None:
            data["before"] = orjson.loads(self._raw_after(previous))
        for path, number in (edges or {}).items():
            set_field(data, path, number)
        after = data["after"]
        expected = encode_value({c: after[c] for c in VALUE_COLUMNS}) if after is not None else None
        change = Change(
            row_id, op, version, message_key(self.db, TABLE, {"id": row_id}), wire(data), expected
        )
        self.rows[row_id] = change
        return change

    @staticmethod
    def _raw_after(change: Change) -> bytes:
        return orjson.dumps(orjson.loads(change.value)["after"])

    def expected(self) -> dict[int, Change]:
        """The last change of every row."""
        return dict(self.rows)


def valid_edges() -> st.SearchStrategy[dict[str, int]]:
    """In-range extremes for some integer fields of a valid change (``version`` stays the stream's)."""
    fields = [f for f in INT_FIELDS if f != "version"]
    return st.dictionaries(
        st.sampled_from(fields),
        st.sampled_from(["low", "high", "any"]),
        max_size=3,
    ).flatmap(
        lambda chosen: st.fixed_dictionaries(
            {
                f: st.just(INT_FIELDS[f][0])
                if how == "low"
                else st.just(INT_FIELDS[f][1])
                if how == "high"
                else st.integers(*INT_FIELDS[f])
                for f, how in chosen.items()
            }
        )
    )


# --- malformed messages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Poison:
    """A malformed message: where the worker must reject it and what its dead letter's reason must say."""

    category: str
    key: bytes | None
    value: bytes = field(repr=False)
    stage: str
    """``decode`` or ``bind``."""
    names: str
    """A piece of text the reason must contain (the field or column at fault); empty: anything."""

    def __repr__(self) -> str:  # hypothesis prints failing examples: keep 5 MB out of the report
        head = self.value[:80]
        return f"Poison({self.category!r}, {len(self.value)} B, {head!r}, {self.stage}, {self.names!r})"


INVALID_UTF8 = (b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")
"""Byte sequences that are not UTF-8 (lone continuation, overlong, surrogate, truncated, 5-byte)."""

WRONG_TYPES: dict[str, tuple[Any, ...]] = {
    "kind": (5, None, "other", "dead-letter", ["change"]),
    "event_id": (5, None, "", [], {"a": 1}),
    "op": (5, None, "x", "C", "", ["c"]),
    "key": ({}, [], "7", 7, None, {"id": 7.5}, {"id": None}, {"id": [7]}, {"id": True}),
    "before": (5, "row", [1, 2], True),
    "after": (5, "row", [1, 2], True),
    "source": ("binlog", [], 5, None, {}),
    "commit_ts_coarse": ("true", 1, 0, None, [True]),
    **{f: ("5", True, [5], {"v": 5}, None, 5.5) for f in INT_FIELDS},
}
"""Per field, values of a type the field does not accept (``null`` only where the field is required)."""


def _named(kind: str, path: str) -> str:
    # pydantic reports the discriminator itself at the root, every other field under the event's kind
    return "kind" if path == "kind" else f"{kind}.{path}"


def _key() -> st.SearchStrategy[bytes | None]:
    return st.one_of(
        st.none(),
        st.binary(max_size=64),
        st.integers(1025, 4096).map(lambda n: b"k" * n),  # longer than a dead letter keeps
    )


def _number_token(low: int, high: int) -> st.SearchStrategy[tuple[bytes, bool]]:
    """A JSON number outside ``[low, high]`` and whether the parser reaches the field (else: root error)."""
    near = st.one_of(
        st.integers(high + 1, high + 2**80),
        st.integers(-(2**80), low - 1),
        st.sampled_from([2**64, 2**64 + 1, 10**20, -1]).filter(lambda n: not low <= n <= high),
    ).map(lambda n: (str(n).encode(), True))
    # 10**k and -10**k with up to 6000 digits: above the parser's limit the error is at the root
    long = st.tuples(st.sampled_from([b"", b"-"]), st.integers(20, 6000)).map(
        lambda t: (t[0] + b"1" + b"0" * t[1], t[1] + 1 <= JSON_DIGITS_LIMIT)
    )
    others = st.sampled_from(
        [b"1e400", b"-1e400", b"1.0e3", b"0.5", b"-0.0", b"NaN", b"Infinity", b"-Infinity"]
    ).map(lambda t: (t, True))
    return st.one_of(near, long, st.just((b"1" + b"0" * 400, True)), others)


@st.composite
def poison_messages(draw: st.DrawFn, db: str) -> Poison:
    """One malformed message for ``<db>.assets`` (up to about 1.5 MB; see :func:`huge_poison_messages`)."""
    category = draw(
        st.sampled_from(
            [
                "random-bytes",
                "random-bytes",
                "invalid-utf8",
                "truncated-json",
                "truncated-json",
                "deep-nesting",
                "out-of-range",
                "out-of-range",
                "out-of-range",
                "ddl-out-of-range",
                "wrong-type",
                "wrong-type",
                "missing-field",
                "huge-string",
                "op-image-mismatch",
                "not-an-envelope",
                "bind-missing-column",
                "bind-unencodable-value",
            ]
        )
    )
    key = draw(_key())
    data = change_envelope(db, op=draw(st.sampled_from("cudr")))

    def poison(value: bytes, stage: str = "decode", names: str = "") -> Poison:
        return Poison(category, key, value, stage, names)

    if category == "random-bytes":
        return poison(draw(st.binary(max_size=64) | st.binary(min_size=64, max_size=4096)))
    if category == "invalid-utf8":
        bad = draw(st.sampled_from(INVALID_UTF8))
        data = change_envelope(db, op="c", content="marker")
        cut = draw(st.integers(0, len("marker")))
        return poison(wire(data).replace(b"marker", b"marker"[:cut] + bad + b"marker"[cut:]), names="unicode")
    if category == "truncated-json":
        whole = wire(data if draw(st.booleans()) else ddl_envelope(db))
        return poison(whole[: draw(st.integers(0, len(whole) - 1))])
    if category == "deep-nesting":
        depth = draw(st.one_of(st.just(100_000), st.integers(256, 100_000)))
        shape = draw(st.sampled_from(["arrays", "objects", "inside-a-row"]))
        if shape == "arrays":
            return poison(b"[" * depth + b"]" * depth, names="recursion limit")
        if shape == "objects":
            return poison(b'{"a":' * depth + b"1" + b"}" * depth, names="recursion limit")
        data = change_envelope(db, op="c")
        return poison(with_token(data, "after.content", b"[" * depth + b"]" * depth), names="recursion limit")
    if category == "out-of-range":
        path = draw(st.sampled_from(sorted(INT_FIELDS)))
        token, reaches_field = draw(_number_token(*INT_FIELDS[path]))
        names = _named("change", path) if reaches_field else "number out of range"
        return poison(with_token(data, path, token), names=names)
    if category == "ddl-out-of-range":
        path = draw(st.sampled_from(DDL_INT_FIELDS))
        token, reaches_field = draw(_number_token(*INT_FIELDS[path]))
        names = _named("ddl", path) if reaches_field else "number out of range"
        return poison(with_token(ddl_envelope(db), path, token), names=names)
    if category == "wrong-type":
        path = draw(st.sampled_from(sorted(WRONG_TYPES)))
        set_field(data, path, draw(st.sampled_from(WRONG_TYPES[path])))
        return poison(wire(data), names="" if path == "kind" else _named("change", path))
    if category == "missing-field":
        path = draw(st.sampled_from(REQUIRED_FIELDS))
        delete_field(data, path)
        return poison(wire(data), names=_named("change", path))
    if category == "huge-string":
        # mostly tens of KB, one in eight up to 1 MB (the 5 MB ones are huge_poison_messages')
        big = draw(st.integers(1, 8)) == 5  # hypothesis favours the ends of a range
        size = draw(st.integers(200_000, 1_000_000) if big else st.integers(600, 60_000))
        path = draw(st.sampled_from(["op", "version", "kind", *sorted(BOUNDED_STRINGS)]))
        set_field(data, path, draw(st.sampled_from("x\u00e9\U0001f600")) * size)
        return poison(wire(data), names="" if path == "kind" else _named("change", path))
    if category == "op-image-mismatch":
        op, image_name = draw(st.sampled_from([("c", "before"), ("r", "before"), ("d", "after")]))
        data = change_envelope(db, op=op)
        data[image_name] = image(7, "extra image")
        return poison(wire(data), names="must not have")
    if category == "not-an-envelope":
        return poison(
            draw(
                st.sampled_from(
                    [b"", b"null", b"true", b"42", b'"change"', b"[]", b"{}", b"[{}]", b" ", b"\x00"]
                )
                | st.just(encode(DeadLetter(reason="x", stage="decode", original_b64="eQ==", ts_ms=1)))
            )
        )
    if category == "bind-missing-column":
        column = draw(st.sampled_from(VALUE_COLUMNS))
        data = change_envelope(db, op=draw(st.sampled_from("cur")))
        del data["after"][column]
        return poison(wire(data), "bind", f"value column {column!r}")
    # bind-unencodable-value: a value column holds an integer beyond 64 bits (valid JSON, not cacheable)
    column = draw(st.sampled_from(VALUE_COLUMNS))
    number = draw(st.one_of(st.integers(2**64, 10**400), st.integers(-(10**400), -(2**63) - 1)))
    data = change_envelope(db, op=draw(st.sampled_from("cur")))
    data["after"][column] = number
    return poison(wire(data), "bind", "cannot be cached")


HUGE_SHAPES = ("random", "field", "nesting", "truncated")


@st.composite
def huge_poison_messages(
    draw: st.DrawFn, db: str, shape: str | None = None, low: int = 5_000_000, high: int = 5_300_000
) -> Poison:
    """A malformed message of ``low``..``high`` bytes (5 MB by default), far above any dead letter:
    random bytes, a valid envelope with a 5 MB string where 512 characters are allowed, 5 MB of nested
    arrays, or a 5 MB valid change cut short by one byte (``shape``; default: any)."""
    size = draw(st.integers(low, high))
    shape = shape or draw(st.sampled_from(HUGE_SHAPES))
    key = draw(_key())
    if shape == "random":
        seed = draw(st.integers(0, 2**32))
        return Poison("huge-random", key, b"\xff" + random.Random(seed).randbytes(size - 1), "decode", "")
    if shape == "field":
        data = change_envelope(db, op="c", source={"file": "f" * size})
        return Poison("huge-field", key, wire(data), "decode", "change.source.file")
    if shape == "nesting":
        return Poison("huge-nesting", key, b"[" * (size // 2) + b"]" * (size // 2), "decode", "recursion")
    data = change_envelope(db, op="c", content="c" * size)
    return Poison("huge-truncated", key, wire(data)[:-1], "decode", "")


GENERATE = settings(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def generate(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` examples of ``strategy``, the same ones on every run (derandomized hypothesis): the
    integration run produces them all against one worker instead of starting a worker per example."""
    examples: list[Any] = []

    @settings(GENERATE, max_examples=count)
    @given(strategy)
    def collect(example: Any) -> None:
        examples.append(example)

    collect()
    return examples[:count]
