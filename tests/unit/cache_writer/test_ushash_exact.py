"""US-HASH keys are bit-identical at any batch size and position, thread count, input dtype and process
(invariant 6); a naive float32 computation is not, which is what these tests would catch."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cache_writer.semantic import EmbeddingError, KeyHashWeights, SemanticKeyer, format_key, key_words
from cache_writer.semantic.bulk import (
    BulkHasher,
    Engine,
    default_engine,
    digits,
    probe_embeddings,
    quantize_int8,
)
from cache_writer.semantic.ushash import USHash, exactness_bound, fused_matrix, pack_bits, quantize, sign_bits
from cache_writer.semantic.weights import MAX_EMBEDDING_DIM, MAX_SHARED_DIM

SEED = 11
DIMS = {"text": 384, "image": 512, "audio": 96}
SHARED_DIM = 256
BATCH_SIZES = (1, 2, 3, 7, 64, 1000, 4096)


@pytest.fixture(scope="module")
def weights() -> KeyHashWeights:
    return KeyHashWeights.generate(SEED, DIMS, shared_dim=SHARED_DIM)


@pytest.fixture(scope="module")
def keyer(weights: KeyHashWeights) -> SemanticKeyer:
    return SemanticKeyer(weights, device="cpu")


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def probes(dim: int, seed: int = 0) -> torch.Tensor:
    """Ordinary and awkward vectors: ties at .5 after scaling, subnormals, huge and tiny magnitudes,
    a zero vector, one-hot vectors, float16-representable values."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(dim, generator=g) for _ in range(8)]
    tie = torch.zeros(dim)
    tie[0] = 64.0  # max 64 -> scale 2**0: the .5 values below are exact ties
    tie[1 : 1 + 6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.5 / 2])
    rows.append(tie)
    rows.append(torch.randn(dim, generator=g) * 1e-40)  # subnormal float32
    rows.append(torch.randn(dim, generator=g) * 1e37)
    rows.append(torch.zeros(dim))
    one_hot = torch.zeros(dim)
    one_hot[dim // 2] = -3.0
    rows.append(one_hot)
    rows.append(torch.randn(dim, generator=g).half().float())
    rows.append(torch.full((dim,), 0.1))
    rows.append(torch.linspace(-1, 1, dim))
    return torch.stack(rows).to(torch.float32)


def reference_keys(weights: KeyHashWeights, modality: str, vectors: torch.Tensor) -> list[int]:
    """The definition in Python integers (no floating-point arithmetic after the exact scaling)."""
    prototypes = weights.prototypes.tolist()
    projection = weights.projections[modality].tolist()
    keys = []
    for vector in vectors.tolist():
        peak = max(abs(v) for v in vector)
        if peak == 0:
            keys.append(0)
            continue
        exponent = math.frexp(peak)[1]  # peak = f * 2**exponent, f in [0.5, 1)
        q = [round(math.ldexp(v, 7 - exponent)) for v in vector]  # Python round: half to even
        assert max(abs(x) for x in q) <= 128
        shared = [sum(w * x for w, x in zip(row, q, strict=True)) for row in projection]
        key = 0
        for bit, row in enumerate(prototypes):
            if sum(p * h for p, h in zip(row, shared, strict=True)) > 0:
                key |= 1 << bit
        keys.append(key)
    return keys


def test_bounds_leave_float64_exact() -> None:
    assert exactness_bound(MAX_SHARED_DIM, MAX_EMBEDDING_DIM) <= 2**46 < 2**53


def test_quantization_is_exact_and_ties_go_to_even() -> None:
    q = quantize(probes(16))
    assert q.dtype == torch.float64
    assert torch.equal(q, q.round())
    assert float(q.abs().max()) <= 128
    assert q[8, :7].tolist() == [64.0, 0.0, 2.0, 2.0, -0.0, -2.0, 64.0]
    assert q[11].abs().sum() == 0
    assert q[9].abs().max() >= 64  # subnormal inputs are scaled up, not flushed to zero


@pytest.mark.parametrize("modality", ["audio", "text"])
def test_keys_equal_the_integer_definition(
    weights: KeyHashWeights, keyer: SemanticKeyer, modality: str
) -> None:
    vectors = probes(DIMS[modality], seed=1)
    assert keyer.keys(modality, vectors) == reference_keys(weights, modality, vectors)


@pytest.mark.parametrize("modality", sorted(DIMS))
def test_same_key_at_any_batch_size_and_position(
    weights: KeyHashWeights, keyer: SemanticKeyer, modality: str
) -> None:
    dim = DIMS[modality]
    targets = torch.cat([probes(dim, seed=2), near_boundary(weights, modality, 48)[0]])
    expected = [keyer.keys(modality, targets[i : i + 1])[0] for i in range(len(targets))]
    g = torch.Generator().manual_seed(3)
    for batch_size in BATCH_SIZES:
        for placement in range(2):
            filler = torch.randn(max(batch_size, 1), dim, generator=g)
            for start in range(0, len(targets), batch_size):
                chunk = targets[start : start + batch_size]
                batch = filler.clone()
                positions = torch.randperm(batch_size, generator=g)[: len(chunk)]
                if placement == 1:
                    positions = torch.arange(batch_size - len(chunk), batch_size)  # the tail
                batch[positions] = chunk
                keys = keyer.keys(modality, batch)
                got = [keys[int(p)] for p in positions]
                assert got == expected[start : start + len(chunk)], (batch_size, placement)


def test_same_keys_with_one_and_two_threads(keyer: SemanticKeyer, threads: None) -> None:
    batch = torch.cat(
        [probes(384, seed=4), torch.randn(4000, 384, generator=torch.Generator().manual_seed(5))]
    )
    torch.set_num_threads(1)
    single = keyer.keys("text", batch)
    torch.set_num_threads(2)
    double = keyer.keys("text", batch)
    assert single == double
    assert len(set(single)) > 3900  # distinct inputs, distinct keys: the comparison is not vacuous


def test_float16_and_float32_of_the_same_values(keyer: SemanticKeyer) -> None:
    halves = torch.randn(2000, 512, generator=torch.Generator().manual_seed(6)).half()
    halves[0] = probes(512)[8].half()  # ties survive the float16 round trip
    as_float = halves.float()
    assert keyer.keys("image", halves) == keyer.keys("image", as_float)
    bf = as_float.bfloat16()
    assert keyer.keys("image", bf) == keyer.keys("image", bf.float())


def test_positive_scaling_by_powers_of_two_keeps_the_key(keyer: SemanticKeyer) -> None:
    vectors = torch.randn(500, 96, generator=torch.Generator().manual_seed(7))
    keys = keyer.keys("audio", vectors)
    for factor in (2.0**-30, 0.5, 8.0, 2.0**40):
        assert keyer.keys("audio", vectors * factor) == keys


_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from cache_writer.semantic import KeyHashWeights, SemanticKeyer
sys.path.insert(0, ".")
from tests.unit.cache_writer.test_ushash_exact import DIMS, SEED, SHARED_DIM, probes
weights = KeyHashWeights.generate(SEED, DIMS, shared_dim=SHARED_DIM)
keyer = SemanticKeyer(weights, device="cpu")
vectors = torch.cat([probes(384, seed=8), torch.randn(300, 384, generator=torch.Generator().manual_seed(9))])
one_by_one = [keyer.keys("text", vectors[i : i + 1])[0] for i in range(len(vectors))]
assert one_by_one == keyer.keys("text", vectors)
print(json.dumps({"digest": weights.sha256, "threads": torch.get_num_threads(), "keys": one_by_one}))
"""


def test_same_keys_in_another_process(weights: KeyHashWeights, keyer: SemanticKeyer, threads: None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[3],  # the repository root: the child imports tests.*
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    child = json.loads(result.stdout.strip().splitlines()[-1])
    torch.set_num_threads(2)
    vectors = torch.cat(
        [probes(384, seed=8), torch.randn(300, 384, generator=torch.Generator().manual_seed(9))]
    )
    assert child["threads"] == 1
    assert child["digest"] == weights.sha256
    assert child["keys"] == keyer.keys("text", vectors)


# --- the check can fail: a naive float32 path is not reproducible ------------------------------------------


def near_boundary(weights: KeyHashWeights, modality: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectors almost orthogonal to prototype 0 (after projection): their float32 dot products with it are
    within rounding of zero, where the sign depends on how the sum was taken."""
    fused = fused_matrix(weights, modality).t()  # (key_bits, dim), exact integers
    row = fused[0]
    x = torch.randn(n, row.numel(), generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    x = x - (x @ row)[:, None] * row[None, :] / (row @ row)
    return x.to(torch.float32), fused.to(torch.float32)


def naive_bits(vectors: torch.Tensor, fused32: torch.Tensor) -> torch.Tensor:
    """What a straightforward implementation does: a float32 matmul of the unquantized embeddings."""
    return (vectors @ fused32.t()) > 0


def test_naive_float32_sign_depends_on_summation_order(weights: KeyHashWeights) -> None:
    x, fused32 = near_boundary(weights, "text", 256)
    row = fused32[0]
    forward = torch.zeros(len(x), dtype=torch.float32)
    backward = torch.zeros(len(x), dtype=torch.float32)
    dim = row.numel()
    for j in range(dim):  # a float32 rounding after every addition, in two orders
        forward = forward + x[:, j] * row[j]
        backward = backward + x[:, dim - 1 - j] * row[dim - 1 - j]
    flips = int(((forward > 0) != (backward > 0)).sum())
    assert flips > 0, "the adversarial inputs should make the naive float32 sign order-dependent"

    # The exact path: the same reordering of the sum (reversed coordinates) gives the same bits.
    reverse = torch.arange(dim - 1, -1, -1)
    fused_t = fused_matrix(weights, "text")
    assert torch.equal(sign_bits(quantize(x), fused_t), sign_bits(quantize(x[:, reverse]), fused_t[reverse]))


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not torch.backends.mkl.is_available(),  # type: ignore[no-untyped-call]
    reason="the batch-size dependence shown here is a property of MKL's sgemv/sgemm kernels on x86-64; "
    "test_naive_float32_sign_depends_on_summation_order shows the same failure on any BLAS",
)
def test_naive_float32_bits_depend_on_batch_size_but_keys_do_not(
    weights: KeyHashWeights, keyer: SemanticKeyer
) -> None:
    x, fused32 = near_boundary(weights, "text", 4096)
    whole = naive_bits(x, fused32)
    alone = torch.cat([naive_bits(x[i : i + 1], fused32) for i in range(len(x))])
    differing = int((whole != alone).any(dim=1).sum())
    assert differing > 0, "naive float32 keys were identical at batch size 1 and 4096"

    exact_whole = keyer.keys("text", x)
    exact_alone = [keyer.keys("text", x[i : i + 1])[0] for i in range(len(x))]
    assert exact_whole == exact_alone


# --- the bulk path (uint64 words): bit for bit the reference ------------------------------------------------

ENGINES: tuple[Engine, ...] = ("int8", "float64")
SWEEP_DIM = 24  # small, so that the batch-size sweep fits in a test


def reference_words(hasher: USHash, modality: str, vectors: torch.Tensor) -> torch.Tensor:
    """Today's keys (the float64 reference path, ``USHash.bits``) as int64 words, through Python ints."""
    keys = pack_bits(hasher.bits(modality, vectors))
    width = hasher.weights.key_bits // 64
    return torch.tensor(
        [[(key >> (64 * w)) & (2**64 - 1) for w in range(width)] for key in keys], dtype=torch.uint64
    ).view(torch.int64)


def awkward_pool(weights: KeyHashWeights, modality: str, size: int, dtype: torch.dtype) -> torch.Tensor:
    """``size`` rows, finite in ``dtype``: the bulk path's probes (+-128, flips, ties, tiny, zero rows) and
    rows on a prototype's hyperplane, scattered among random rows."""
    dim = weights.dim(modality)
    special = torch.cat(
        [probe_embeddings(dim, seed=s) for s in range(4)] + [near_boundary(weights, modality, 256)[0]]
    ).to(dtype)
    special = special[torch.isfinite(special).all(dim=1)]
    g = torch.Generator().manual_seed(12)
    pool = torch.randn(size, dim, generator=g).to(dtype)
    pool[torch.randperm(size, generator=g)[: len(special)]] = special
    return pool


def sweep_sizes() -> list[int]:
    """Batch sizes from 1 to 4096: every size up to 300, every multiple of 256 and its neighbours (the
    reference's 512-row and the bulk path's 1024-row chunks, GEMM blockings), and 64 seeded random sizes.
    (All 4096 sizes, 8.4 M rows per case, took 27-300 s per case on a shared 2-core host.)"""
    sizes = set(range(1, 301))
    sizes.update(m + d for m in range(256, 4097, 256) for d in (-1, 0, 1) if m + d <= 4096)
    g = torch.Generator().manual_seed(13)
    sizes.update(int(n) for n in torch.randint(301, 4097, (64,), generator=g))
    return sorted(sizes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("key_bits", [64, 128])
def test_words_equal_todays_keys_at_batch_sizes_up_to_4096(
    key_bits: int, dtype: torch.dtype, threads: None
) -> None:
    """Each size of :func:`sweep_sizes` at its own place in a pool of awkward rows; engines and thread
    counts take turns (by position in the list), so each of the four combinations runs a quarter of the
    sizes, spread over the whole range."""
    weights = KeyHashWeights.generate(SEED, {"text": SWEEP_DIM}, shared_dim=SHARED_DIM, key_bits=key_bits)
    hashers = {engine: USHash(weights, "cpu", engine) for engine in ENGINES}
    pool = awkward_pool(weights, "text", 4096 + 512, dtype)
    expected = reference_words(hashers["float64"], "text", pool)
    assert len(set(map(tuple, expected.tolist()))) > len(pool) * 0.9  # the comparison is not vacuous
    sizes = sweep_sizes()
    assert {1, 1023, 1024, 1025, 4095, 4096} <= set(sizes)
    for turn, n in enumerate(sizes):
        engine, count = ENGINES[turn % 2], 1 + (turn // 2) % 2
        torch.set_num_threads(count)
        start = (n * 7919) % (len(pool) - n + 1)
        batch = pool[start : start + n]
        bulk = hashers[engine].bulk("text")
        assert bulk is not None
        got = bulk.words(batch)  # the engine itself, also where USHash.words takes the reference path
        assert got.dtype == torch.uint64 and got.shape == (n, key_bits // 64)
        assert torch.equal(got.view(torch.int64), expected[start : start + n]), (n, engine, count)
        if n < 300:  # where USHash.words chooses between the reference and the engine
            assert torch.equal(hashers[engine].words("text", batch).view(torch.int64), got.view(torch.int64))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("key_bits", [64, 128])
def test_words_equal_todays_keys_at_real_dims(key_bits: int, engine: Engine) -> None:
    """The dims of real encoders (and one that is not a multiple of 8), every input dtype."""
    weights = KeyHashWeights.generate(SEED, DIMS, shared_dim=SHARED_DIM, key_bits=key_bits)
    hasher = USHash(weights, "cpu", engine)
    for modality in sorted(DIMS):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            pool = awkward_pool(weights, modality, 3000, dtype)
            expected = reference_words(hasher, modality, pool)
            assert torch.equal(hasher.words(modality, pool).view(torch.int64), expected), (modality, dtype)


def test_keys_and_hex_come_from_the_words(keyer: SemanticKeyer) -> None:
    vectors = awkward_pool(keyer.weights, "text", 500, torch.float32)
    keys = keyer.keys("text", vectors)
    assert keys == pack_bits(keyer._hash.bits("text", vectors))
    assert keyer.hex_keys("text", vectors) == [format_key(key, 64) for key in keys]
    words = keyer.words("text", vectors)
    assert [tuple(row) for row in words.tolist()] == [key_words(key, 64) for key in keys]
    wide = SemanticKeyer(KeyHashWeights.generate(SEED, DIMS, shared_dim=SHARED_DIM, key_bits=128), "cpu")
    wide_keys = wide.keys("text", vectors)
    assert any(key >= 2**64 for key in wide_keys)
    assert wide.hex_keys("text", vectors) == [format_key(key, 128) for key in wide_keys]
    assert [tuple(row) for row in wide.words("text", vectors).tolist()] == [
        key_words(key, 128) for key in wide_keys
    ]


def test_the_int8_engine_needs_its_sign_flip(weights: KeyHashWeights) -> None:
    """+128 does not fit an int8. Without the flip (a plain int8 of q), rows holding +128 get another key;
    with it, the bulk path equals the reference on exactly those rows."""
    vectors = probe_embeddings(384)
    fused_t = fused_matrix(weights, "text")
    q = quantize(vectors)
    holds_128 = (q == 128).any(dim=1)
    assert int(holds_128.sum()) >= 4
    wrapped = q.to(torch.int64).remainder(256).to(torch.uint8).view(torch.int8)  # what int8 keeps of q
    naive = sign_bits(wrapped.to(torch.float64), fused_t)
    exact = sign_bits(q, fused_t)
    assert bool((naive != exact).any(dim=1)[holds_128].all())
    assert torch.equal((naive != exact).any(dim=1), holds_128)
    quantized = quantize_int8(vectors, len(vectors), 384)
    flipped = quantized.sign[:, 0] < 0
    both = holds_128 & (q == -128).any(dim=1)
    assert torch.equal(flipped, holds_128 & ~both)
    assert torch.equal(
        quantized.q[~quantized.reference].to(torch.float64), (q * quantized.sign)[~quantized.reference]
    )
    hasher = USHash(weights, "cpu", "int8")
    bulk = hasher.bulk("text")  # the engine itself: USHash.words keys so few rows with the reference
    assert bulk is not None
    assert torch.equal(bulk.words(vectors).view(torch.int64), reference_words(hasher, "text", vectors))


def test_rows_the_fused_quantize_cannot_hold_go_to_the_reference(weights: KeyHashWeights) -> None:
    """A peak below 2**-121 needs a scale float32 cannot hold, and a row with both +128 and -128 fits no
    int8 either way: the fused quantize gets them wrong, marks them, and the reference keys them."""
    vectors = probe_embeddings(384)
    quantized = quantize_int8(vectors, len(vectors), 384)
    q = quantize(vectors)
    wrong = (quantized.q.to(torch.float64) != q * quantized.sign).any(dim=1)
    peak = vectors.abs().amax(dim=1)
    tiny = (peak > 0) & (peak < 2.0**-121)  # a zero row needs no scale (shift 0): it quantizes exactly
    assert bool(tiny.any()) and bool(wrong[tiny].all())
    zero = peak == 0
    assert bool(zero.any()) and not bool(wrong[zero].any()) and not bool(quantized.reference[zero].any())
    assert torch.equal(wrong, quantized.reference)
    hasher = USHash(weights, "cpu", "int8")
    bulk = hasher.bulk("text")  # the engine itself: USHash.words keys so few rows with the reference
    assert bulk is not None
    assert torch.equal(bulk.words(vectors).view(torch.int64), reference_words(hasher, "text", vectors))


def test_a_broken_kernel_is_caught_and_keys_stay_right(
    weights: KeyHashWeights, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GEMM that is off by one somewhere (a library bug) fails the self-check at set-up: the hasher
    says so and keys with the reference path, so no key is wrong."""
    real = torch._int_mm

    def off_by_one(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = real(a, b)
        out[:, 0] += 1
        return out

    monkeypatch.setattr(torch, "_int_mm", off_by_one)
    vectors = torch.cat([probe_embeddings(384, seed=5), torch.randn(200, 384)])  # >= 128 rows: the engine
    hasher = USHash(weights, "cpu", "int8")
    with caplog.at_level("ERROR", logger="cache_writer.semantic.ushash"):
        words = hasher.words("text", vectors)
    assert hasher.bulk("text") is None
    assert "differ from the reference" in caplog.text
    assert torch.equal(words.view(torch.int64), reference_words(hasher, "text", vectors))
    # the same kernel without the self-check would have keyed wrong: the check is not vacuous
    unchecked = BulkHasher(fused_matrix(weights, "text"), torch.device("cpu"), "int8", 1024)
    assert not torch.equal(unchecked.words(vectors).view(torch.int64), words.view(torch.int64))


def test_bulk_path_refuses_what_the_reference_refuses(keyer: SemanticKeyer) -> None:
    vectors = torch.randn(3000, 384)
    vectors[2500, 7] = float("nan")
    with pytest.raises(EmbeddingError, match="NaN or infinite"):
        keyer.words("text", vectors)
    with pytest.raises(EmbeddingError, match="float16, bfloat16 or float32"):
        keyer.words("text", vectors.double())
    with pytest.raises(EmbeddingError, match=r"shape \(n, 384\)"):
        keyer.words("text", torch.zeros(2, 383))
    empty = keyer.words("text", torch.empty(0, 384))
    assert empty.shape == (0, 1) and empty.dtype == torch.uint64
    assert keyer.hex_keys("text", torch.empty(0, 384)) == []


def test_digits_rebuild_the_fused_matrix(weights: KeyHashWeights) -> None:
    fused_t = fused_matrix(weights, "image")
    limbs = digits(fused_t)
    assert 2 <= len(limbs) <= 4
    rebuilt = sum(limb.to(torch.int64) * 256**m for m, limb in enumerate(limbs))
    assert torch.equal(rebuilt, fused_t.to(torch.int64))
    extreme = torch.tensor([[2**26 - 1, -(2**26) + 1, -128, 127, 128, -129, 0]], dtype=torch.float64)
    assert torch.equal(sum(d.to(torch.int64) * 256**m for m, d in enumerate(digits(extreme))), extreme.long())


def test_engine_choice() -> None:
    assert default_engine(torch.device("cuda")) == "int8"
    assert default_engine(torch.device("cpu")) in ENGINES
    with pytest.raises(ValueError, match="unknown engine 'int4'"):
        USHash(KeyHashWeights.generate(0, {"text": 8}, shared_dim=4), "cpu", "int4")  # type: ignore[arg-type]
