"""Malformed change-topic messages, generated with hypothesis, and what must become of each one.

The strategies are in tests/support/poison.py, shared with the integration fuzz run
(tests/integration/test_poison.py): every message they make is malformed at a known stage (``decode``:
not a valid envelope; ``bind``: a valid envelope that does not fit the table's binding), and the reason
must name what is wrong. The tests in this file check that promise against the codec and the planner
themselves, so that a failure of the
integration run points at the worker, not at a generator that made a valid message by accident; and they
run the worker's :class:`~pipeline.processor.ChangeProcessor` on mixed batches without services.

The bindings the messages are made for are those of the integration harness (tests/integration/conftest.py):
table ``<db>.assets`` with value columns modality, content, embedding and updated_at, keyed by ``id``,
versioned by the event.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from pipeline.plan import BindError, plan
from pipeline.processor import ChangeProcessor
from schemas import ChangeEvent, DecodeError, decode, encode, parse_bindings
from schemas.codec import DEAD_LETTER_REASON_CHARS, dead_letter, dead_letter_size_bound
from schemas.events import MAX_U64, DeadLetter
from tests.support.poison import (
    GENERATE,
    HUGE_SHAPES,
    TABLE,
    VALUE_COLUMNS,
    Change,
    ChangeStream,
    Poison,
    change_envelope,
    generate,
    huge_poison_messages,
    poison_messages,
    set_field,
    valid_edges,
    wire,
)

# --- what the worker does with them: oracles --------------------------------------------------------------


def bindings(db: str) -> Any:
    return parse_bindings(
        f"bindings:\n  - table: {db}.{TABLE}\n    namespace: {TABLE}\n"
        f"    value_columns: [{', '.join(VALUE_COLUMNS)}]\n"
    )


def rejection(db: str, value: bytes) -> tuple[str, str] | None:
    """``(stage, reason)`` for a message the codec or the planner rejects; None for a valid change."""
    try:
        event = decode(value)
    except DecodeError as exc:
        return "decode", exc.reason
    assert isinstance(event, ChangeEvent), "no generator makes a valid DDL event"
    try:
        plan(bindings(db).bindings[0], event, prefix="fk")
    except BindError as exc:
        return "bind", str(exc)
    return None


def check_rejected(db: str, poison: Poison) -> None:
    found = rejection(db, poison.value)
    assert found is not None, f"{poison!r} is a valid change"
    stage, reason = found
    assert stage == poison.stage, f"{poison!r} rejected at {stage}: {reason}"
    assert poison.names in reason, f"{poison!r}: the reason {reason!r} does not name {poison.names!r}"


@settings(GENERATE, max_examples=400, phases=[Phase.generate, Phase.shrink])
@given(poison_messages("shop"))
def test_every_generated_poison_is_rejected_at_its_stage_naming_the_field(poison: Poison) -> None:
    check_rejected("shop", poison)


@pytest.mark.parametrize("shape", HUGE_SHAPES)
def test_every_huge_poison_is_rejected(shape: str) -> None:
    (poison,) = generate(huge_poison_messages("shop", shape), 1)
    assert 5_000_000 <= len(poison.value) <= 5_300_200
    check_rejected("shop", poison)


@pytest.mark.parametrize(
    ("path", "value"),
    [("ts_ms", 10**400), ("version", 2**64), ("commit_ts_us", 10**30), ("source.pos", 2**64 + 7)],
)
def test_the_issue_examples_are_decode_errors_naming_the_field(path: str, value: int) -> None:
    data = change_envelope("shop")
    set_field(data, path, value)
    found = rejection("shop", wire(data))
    assert found is not None and found[0] == "decode"
    assert f"change.{path}" in found[1]


@settings(GENERATE, max_examples=200, phases=[Phase.generate, Phase.shrink])
@given(valid_edges())
def test_valid_changes_with_extreme_numbers_are_valid(edges: dict[str, int]) -> None:
    stream = ChangeStream("shop")
    for row_id in (1, 2, 1, 1):
        change = stream.change(row_id, delete=row_id == 1 and stream.next_version % 3 == 0, edges=edges)
        assert rejection("shop", change.value) is None


def test_generation_is_deterministic() -> None:
    first = generate(poison_messages("shop"), 50)
    second = generate(poison_messages("shop"), 50)
    assert [p.value for p in first] == [p.value for p in second]
    assert len({p.category for p in first}) > 8, "the examples cover most categories"


# --- the worker's processor on mixed batches (no services) ----------------------------------------------


class _Message:
    def __init__(self, key: bytes | None, value: bytes) -> None:
        self.key, self.value = key, value


@settings(GENERATE, max_examples=150, phases=[Phase.generate, Phase.shrink])
@given(
    st.lists(poison_messages("shop"), min_size=1, max_size=6),
    st.lists(st.integers(1, 4), min_size=1, max_size=6),
    st.randoms(use_true_random=False),
)
def test_a_batch_rejects_exactly_its_poison_messages_and_plans_the_rest(
    poisons: list[Poison], rows: list[int], rng: random.Random
) -> None:
    stream = ChangeStream("shop")
    changes = [stream.change(r) for r in rows]
    batch: list[Poison | Change] = [*poisons, *changes]
    rng.shuffle(batch)
    processor = ChangeProcessor(bindings("shop"), [], key_prefix="fk")
    prepared = asyncio.run(processor.prepare([(m.key, m.value) for m in batch]))
    rejected = {r.index: r for r in prepared.rejects}
    for index, message in enumerate(batch):
        if isinstance(message, Poison):
            assert index in rejected, f"{message!r} was not rejected"
            assert rejected[index].stage == message.stage
            assert message.names in rejected[index].reason
    assert sorted(p.index for p in prepared.planned) == [
        i for i, m in enumerate(batch) if isinstance(m, Change)
    ]
    assert len(rejected) == len(poisons)


# --- dead letters are bounded whatever the original -------------------------------------------------------


@settings(GENERATE, max_examples=60, phases=[Phase.generate, Phase.shrink])
@given(
    original_size=st.one_of(st.integers(0, 4096), st.integers(200_000, 6_000_000)),
    limit=st.sampled_from([0, 1, 1000, 256 * 1024]),
    reason_size=st.integers(0, 50_000),
    key=st.one_of(st.none(), st.binary(max_size=3000)),
    seed=st.integers(0, 2**16),
)
def test_a_dead_letter_never_exceeds_its_bound_and_describes_the_whole_original(
    original_size: int, limit: int, reason_size: int, key: bytes | None, seed: int
) -> None:
    original = random.Random(seed).randbytes(original_size)
    letter = dead_letter(
        "\u00e9" * reason_size,
        original,
        stage="decode",
        topic="t",
        partition=2,
        offset=MAX_U64,
        key=key,
        max_original_bytes=limit,
    )
    wire_form = encode(letter)
    assert len(wire_form) <= dead_letter_size_bound(limit)
    back = DeadLetter.model_validate_json(wire_form)
    assert back.original_size == original_size
    assert back.original_sha256 == hashlib.sha256(original).hexdigest()
    assert back.truncated == (original_size > limit)
    assert base64.b64decode(back.original_b64) == original[:limit]
    assert len(back.reason) <= DEAD_LETTER_REASON_CHARS
    assert back.key_b64 is None or len(base64.b64decode(back.key_b64)) <= 1024


@settings(GENERATE, max_examples=100)
@given(
    reason=st.text(st.characters(codec="utf-8"), min_size=DEAD_LETTER_REASON_CHARS)
    | st.sampled_from(["\x00", "\U0001f600", '"', "\\"]).map(lambda c: c * 3000),
    key=st.none() | st.binary(min_size=1024, max_size=2048),
)
def test_a_dead_letter_is_bounded_whatever_its_reason_quotes(reason: str, key: bytes | None) -> None:
    letter = dead_letter(reason, b"x" * 1000, stage="decode", topic="t" * 249, key=key, max_original_bytes=0)
    assert len(encode(letter)) <= dead_letter_size_bound(0)


def test_a_decode_reason_quotes_its_input() -> None:
    """Why the bound counts 6 bytes per reason character: the reason of a bad ``kind`` repeats the
    offending value, and JSON writes a NUL as ``\\u0000``."""
    data = change_envelope("shop")
    data["kind"] = "\x00" * 5000
    reason = rejection("shop", wire(data))[1]  # type: ignore[index]
    letter = dead_letter(reason, b"", stage="decode", max_original_bytes=0)
    assert len(reason) > 5000 and len(letter.reason) <= DEAD_LETTER_REASON_CHARS
    assert len(encode(letter)) > len(letter.reason) * 5  # NULs as 6-byte escapes
    assert len(encode(letter)) <= dead_letter_size_bound(0)
