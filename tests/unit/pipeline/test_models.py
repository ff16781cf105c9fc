"""The worker's model path without services: semantic keys in batches, planning under the active and the
pending model, signatures per image, hotness scores, the hit recorder, bindings and the model command."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cache_writer import CacheAction
from cache_writer.hotness import HitRecorder, parse_hits
from cache_writer.l1 import L1Cache, parse_signature_broadcast
from cache_writer.layout import entry_key, namespace_of, namespace_prefix, signature_key, signature_key_of
from cache_writer.semantic import HashingTextEmbedder, KeyHashWeights, SemanticKeyer, format_key
from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.signatures import SignatureRecord, parse_signatures
from pipeline.commands.model import build_update, model_app
from pipeline.hotness import decode_count, hotness_score, merge_count, split_by_namespace, top_entries
from pipeline.models import KeyRequest, ModelState, NamespaceModels, semantic_keys
from pipeline.plan import BindError, plan, row_value, row_version
from pipeline.processor import ChangeProcessor
from pipeline.settings import HotnessSettings
from schemas import Binding, Bindings, ChangeEvent, encode
from schemas.bindings import BindingError, parse_bindings
from schemas.model_updates import ModelUpdate, SemVer, signature_order

PREFIX = "fk"
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}
WEIGHTS_1 = KeyHashWeights.generate(1, {"text": 32, "image": 8}, shared_dim=16)
WEIGHTS_2 = KeyHashWeights.generate(2, {"text": 32, "image": 8}, shared_dim=16)


def update(version: str, weights: KeyHashWeights) -> ModelUpdate:
    return ModelUpdate(
        model="m",
        model_version=version,
        tokenizer_version="t",
        input_schema=SCHEMA,
        weights_ref="/w.fkw",
        weights_sha256=weights.sha256,
        namespaces=("assets",),
        ts_ms=1,
    )


def state(version: str, weights: KeyHashWeights, columns: tuple[str, ...] = ("content", "id")) -> ModelState:
    u = update(version, weights)
    record = SignatureRecord(
        u.signature(columns), signature_order(u.semver), u.model_dump_json().encode(), columns
    )
    return ModelState(record, u, SemanticKeyer(WEIGHTS_1 if weights is WEIGHTS_1 else weights, "cpu"))


TEXT = Binding(
    table="shop.assets",
    namespace="assets",
    semantic={"modality": "text", "text_column": "content"},  # type: ignore[arg-type]
)
PLAIN = Binding(table="shop.assets", namespace="assets")


def text_key(weights: KeyHashWeights, text: str) -> str:
    key = SemanticKeyer(weights, "cpu").keys("text", HashingTextEmbedder(32).embed([text]))[0]
    return entry_key(PREFIX, "assets", [format_key(key)])


def change(
    op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, version: int = 100
) -> ChangeEvent:
    image = after or before
    assert image is not None
    return ChangeEvent.model_validate(
        {
            "event_id": f"e{version}",
            "op": op,
            "key": {"id": image["id"]},
            "before": before,
            "after": after,
            "source": {
                "server_id": 1,
                "file": "b.000001",
                "pos": 4,
                "ts_ms": 1000,
                "db": "shop",
                "table": "assets",
            },
            "ts_ms": 1001,
            "version": version,
            "commit_ts_us": 1_000_000,
            "commit_ts_coarse": True,
        }
    )


# --- semantic keys -----------------------------------------------------------------------------------


def test_semantic_keys_are_batched_and_equal_to_one_by_one() -> None:
    st = state("1.0.0", WEIGHTS_1)
    texts = [f"row {i}  with   SPACES" for i in range(40)]
    keys = semantic_keys([KeyRequest(TEXT, st, {"id": i, "content": t}) for i, t in enumerate(texts)], PREFIX)
    one_by_one = [semantic_keys([KeyRequest(TEXT, st, {"id": 0, "content": t})], PREFIX)[0] for t in texts]
    assert keys == one_by_one == [text_key(WEIGHTS_1, t) for t in texts]
    assert text_key(WEIGHTS_1, "a b") == text_key(WEIGHTS_1, "a \t b"), "binding text rules apply"


def test_semantic_key_errors_are_per_row() -> None:
    st = state("1.0.0", WEIGHTS_1)
    image = Binding(table="s.t", namespace="assets", semantic={"modality": "image", "embedding_column": "e"})  # type: ignore[arg-type]
    requests = [
        KeyRequest(TEXT, st, {"id": 1, "content": "fine"}),
        KeyRequest(TEXT, st, {"id": 2, "content": None}),
        KeyRequest(TEXT, st, {"id": 3}),
        KeyRequest(TEXT, st, {"id": 4, "content": 5}),
        KeyRequest(image, st, {"id": 5, "e": [0.5] * 8}),
        KeyRequest(image, st, {"id": 6, "e": [0.5] * 7}),
    ]
    results = semantic_keys(requests, PREFIX)
    assert isinstance(results[0], str) and isinstance(results[4], str)
    reasons = [str(r) for r in results if isinstance(r, EmbeddingError)]
    assert len(reasons) == 4
    assert "NULL" in reasons[0] and "not in the row" in reasons[1] and "not text" in reasons[2]
    assert "7 numbers" in reasons[3]


# --- planning under models ---------------------------------------------------------------------------


class _Tier:
    name = "redis"
    client = object()


class _Registry:
    def __init__(self, models: NamespaceModels) -> None:
        self.models = models

    async def refresh(self, client: object, namespaces: Iterable[str]) -> dict[str, NamespaceModels]:
        return {ns: self.models for ns in namespaces}


def prepare(binding: Binding, models: NamespaceModels, *events: ChangeEvent) -> Any:
    processor = ChangeProcessor(
        Bindings(bindings=(binding,)),
        [_Tier()],
        key_prefix=PREFIX,
        models=_Registry(models),  # type: ignore[list-item,arg-type]
    )
    prepared = asyncio.run(processor.prepare([(None, encode(e)) for e in events]))
    return prepared.planned, [(r.index, r.stage, r.reason) for r in prepared.rejects], prepared.ddl


def test_an_update_invalidates_the_old_semantic_key_and_writes_the_new_one_under_both_models() -> None:
    active, pending = state("1.0.0", WEIGHTS_1), state("2.0.0", WEIGHTS_2)
    event = change("u", {"id": 7, "content": "a cat"}, {"id": 7, "content": "a dog"})
    planned, rejects, ddl = prepare(TEXT, NamespaceModels(active, pending), event)
    assert not rejects and not ddl
    actions: list[CacheAction] = planned[0].actions
    expected = []
    for st, weights in ((pending, WEIGHTS_2), (active, WEIGHTS_1)):
        expected += [
            CacheAction("invalidate", text_key(weights, "a cat"), 100, 1_000_000),
            CacheAction(
                "write",
                text_key(weights, "a dog"),
                100,
                1_000_000,
                b'{"content":"a dog","id":7}',
                signature=st.signature,
                row="7",
            ),
        ]
    assert actions == expected
    # a delete invalidates the before image's key (under both models)
    planned, _, _ = prepare(
        TEXT, NamespaceModels(active, pending), change("d", {"id": 7, "content": "a dog"}, None)
    )
    assert [(a.kind, a.key) for a in planned[0].actions] == [
        ("invalidate", text_key(WEIGHTS_2, "a dog")),
        ("invalidate", text_key(WEIGHTS_1, "a dog")),
    ]


def test_an_unkeyable_new_row_still_invalidates_the_old_key_and_is_dead_lettered() -> None:
    active = state("1.0.0", WEIGHTS_1)
    event = change("u", {"id": 7, "content": "a cat"}, {"id": 7, "content": None})
    planned, rejects, _ = prepare(TEXT, NamespaceModels(active), event)
    assert [(a.kind, a.key) for a in planned[0].actions] == [("invalidate", text_key(WEIGHTS_1, "a cat"))]
    assert rejects[0][1] == "semantic-key" and "NULL" in rejects[0][2]


def test_without_a_model_plain_bindings_work_as_always_and_semantic_ones_cache_nothing() -> None:
    event = change("c", None, {"id": 7, "content": "x"})
    planned, rejects, _ = prepare(PLAIN, NamespaceModels(), event)
    assert planned[0].actions == plan(PLAIN, event, prefix=PREFIX)
    assert planned[0].actions[0].signature is None and planned[0].actions[0].row is None
    planned, rejects, _ = prepare(TEXT, NamespaceModels(), event)
    assert planned[0].actions == [] and not rejects


def test_plain_bindings_with_a_model_carry_the_signature_of_the_image_columns() -> None:
    active = state("1.0.0", WEIGHTS_1, columns=("content", "id"))
    same = change("c", None, {"id": 7, "content": "x"})
    wider = change("c", None, {"id": 8, "content": "x", "extra": 1}, version=101)
    planned, _, _ = prepare(PLAIN, NamespaceModels(active), same, wider)
    assert planned[0].actions[0].signature == active.signature
    other = planned[1].actions[0].signature
    assert other == active.update.signature(("content", "extra", "id")) != active.signature


def test_ddl_events_are_returned_in_order() -> None:
    from schemas import DdlEvent, Source

    source = Source(server_id=1, file="b.000001", pos=9, ts_ms=1, db="shop", table="*")
    ddl = DdlEvent(event_id="d", source=source, query="ALTER TABLE assets ADD c INT", ts_ms=1)
    processor = ChangeProcessor(Bindings(bindings=(PLAIN,)), [], key_prefix=PREFIX)
    prepared = asyncio.run(processor.prepare([(None, encode(ddl))]))
    assert prepared.ddl == [ddl] and not prepared.planned and not prepared.rejects


# --- rows read back for a prewarm ---------------------------------------------------------------------


def test_row_value_and_version() -> None:
    binding = Binding(table="s.t", namespace="n", value_columns=("a",), version_column="v")
    assert row_value(binding, {"a": 1, "b": 2, "v": 5}) == b'{"a":1}'
    assert row_version(binding, {"v": 5}) == 5
    with pytest.raises(BindError):
        row_value(binding, {"b": 2})
    assert row_version(PLAIN, {"id": 1}) is None


# --- hotness -----------------------------------------------------------------------------------------


def test_hotness_score_is_the_documented_formula() -> None:
    s = HotnessSettings()
    assert s.alpha == 0.7 and s.tau_s == 3600
    assert hotness_score(0, 0, s) == pytest.approx(0.7 * 0.5 + 0.3)
    assert hotness_score(3, 1800, s) == pytest.approx(0.7 / (1 + math.exp(-3)) + 0.3 * math.exp(-0.5))
    assert hotness_score(10, 0, s) > hotness_score(1, 0, s) > hotness_score(1, 7200, s)


def test_top_entries_by_score_and_prefix() -> None:
    s = HotnessSettings()
    now = 10_000_000
    items = [
        ("fk:{a}:hot", merge_count(None, 50, now)),
        ("fk:{a}:old", merge_count(None, 50, now - 7_200_000)),
        ("fk:{a}:once", merge_count(None, 1, now)),
        ("fk:{b}:other", merge_count(None, 99, now)),
    ]
    # 0.7*sigmoid(1) + 0.3 (now) = 0.81 beats 0.7*sigmoid(50) + 0.3*exp(-2) = 0.74 (two hours ago)
    assert top_entries(items, "fk:{a}:", 2, now, s) == ["fk:{a}:hot", "fk:{a}:once"]
    assert top_entries(items, "fk:{a}:", 9, now, s)[-1] == "fk:{a}:old"
    assert top_entries(items, "fk:{a}:", 0, now, s) == []
    assert decode_count(merge_count("3,100", 2, 50)) == (5, 100)
    assert namespace_of("fk:{a.b}:x/y") == "a.b" and namespace_of("nope") is None


def test_hit_recorder_batches_and_splits_by_namespace() -> None:
    recorder = HitRecorder("fk", flush_every=3, flush_interval_s=3600)
    recorder.record("fk:{a}:1")
    recorder.record("fk:{a}:1")
    assert not recorder.due()
    recorder.record("fk:{b}:2")
    assert recorder.due()
    counts = recorder.drain()
    assert {k: v[0] for k, v in counts.items()} == {"fk:{a}:1": 2, "fk:{b}:2": 1}
    parsed = parse_hits({b"h": recorder._message(counts)["h"]})  # as XREADGROUP returns it
    batches = split_by_namespace({**parsed, "other:{a}:1": (1, 1)}, "fk")
    assert [(b.namespace, sorted(b.counts)) for b in batches] == [("a", ["fk:{a}:1"]), ("b", ["fk:{b}:2"])]
    assert parse_hits({b"h": b"not json"}) == {}


# --- keys, L1, signature state ------------------------------------------------------------------------


def test_signature_keys_share_the_namespace_slot() -> None:
    assert signature_key("fk", "assets") == "fk:{assets}:$signature"
    assert signature_key_of(entry_key("fk", "assets", ["$signature"])) == "fk:{assets}:$signature"
    assert entry_key("fk", "assets", ["$signature"]) != signature_key("fk", "assets"), "$ is encoded"
    assert namespace_prefix("fk", "a") == "fk:{a}:"
    with pytest.raises(ValueError, match="not a freshkey entry key"):
        signature_key_of("plain")


def test_l1_refuses_entries_read_under_another_signature_after_a_cutover() -> None:
    l1 = L1Cache()
    l1.mark(True)
    assert l1.put("fk:{a}:1", 1, b"x", "s1") and l1.put("fk:{b}:1", 1, b"y", "s1")
    assert parse_signature_broadcast(b"a s2 fk:{a}:") == ("fk:{a}:", "s2")
    assert parse_signature_broadcast(b"w 1 fk:{a}:1") is None
    l1.on_signature("fk:{a}:", "s2")
    assert l1.get("fk:{a}:1") is None and l1.get("fk:{b}:1") is not None
    assert not l1.put("fk:{a}:1", 2, b"x", "s1")
    assert l1.put("fk:{a}:1", 2, b"x", "s2")


def test_parse_signatures() -> None:
    state = parse_signatures("a", {b"s": b"S", b"o": b"O", b"u": b"{}", b"cols": b'["x"]', b"t": b"5"})
    assert state.active_signature == "S" and state.active is not None and state.active.value_columns == ("x",)
    assert state.pending is None and parse_signatures("a", {}).active_signature == ""


# --- bindings and the command ------------------------------------------------------------------------


def test_semantic_binding_options() -> None:
    b = parse_bindings(
        "bindings:\n  - table: a.b\n    namespace: n\n    loader: features\n"
        "    semantic: {modality: text, text_column: c, text_rules: {casefold: true}}\n"
    ).bindings[0]
    assert b.semantic is not None and b.semantic.text_rules.casefold and b.loader == "features"
    for bad in (
        "{modality: image, text_column: c}",
        "{modality: text}",
        "{modality: text, text_column: c, embedding_column: e}",
        "{modality: video, embedding_column: e}",
    ):
        with pytest.raises(BindingError):
            parse_bindings(f"bindings:\n  - table: a.b\n    namespace: n\n    semantic: {bad}\n")


def test_model_command_builds_updates_and_weights(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "w.fkw"
    result = runner.invoke(
        model_app, ["init-weights", "--out", str(out), "--seed", "3", "--dims", "text=8,audio=4"]
    )
    assert result.exit_code == 0, result.output
    digest = result.output.strip().splitlines()[-1]
    assert digest == hashlib.sha256(out.read_bytes()).hexdigest()
    upd, warnings = build_update(
        model="m", version="1.2.3", tokenizer="t", schema=SCHEMA, weights=out, weights_sha256=None,
        namespaces=["a", "b"], key_bits=None,
    )  # fmt: skip
    assert upd.weights_sha256 == digest and upd.namespaces == ("a", "b") and not warnings
    assert upd.weights_ref == str(out.resolve()) and SemVer.parse(upd.model_version) == SemVer.parse("1.2.3")
    _, warnings = build_update(
        model="m", version="1.2.3", tokenizer="t", schema=SCHEMA, weights=out, weights_sha256="ab" * 32,
        namespaces=["a"], key_bits=None,
    )  # fmt: skip
    assert warnings and "reject" in warnings[0]
    bad = runner.invoke(model_app, ["init-weights", "--out", str(out), "--seed", "1", "--dims", "text"])
    assert bad.exit_code == 2
