"""The bulk keying path on CUDA: each engine's words equal the CPU reference bit for bit (invariant 6).
Runs where a CUDA device is present; tests/gpu/check_keys.py is the same check (and the figures) as one
script that needs torch alone, for a device machine without the project's environment."""

from __future__ import annotations

import pytest
import torch

from cache_writer.semantic import KeyHashWeights
from cache_writer.semantic.bulk import probe_embeddings, reference_words
from cache_writer.semantic.ushash import USHash, fused_matrix

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
]

DIMS = {"image": 512, "odd": 100}
SIZES = (1, 16, 17, 4096, 65539)  # 17: the smallest int8 GEMM cuBLASLt takes; 65539: across a chunk


def awkward(weights: KeyHashWeights, modality: str, size: int) -> torch.Tensor:
    dim = weights.dim(modality)
    row = fused_matrix(weights, modality).t()[0]
    g = torch.Generator().manual_seed(size)
    x = torch.randn(256, dim, generator=g, dtype=torch.float64)
    plane = x - (x @ row)[:, None] * row[None, :] / (row @ row)  # on prototype 0's hyperplane
    special = torch.cat([probe_embeddings(dim, seed=s) for s in range(4)] + [plane.float()])
    pool = torch.randn(size, dim, generator=g)
    count = min(size, len(special))
    pool[torch.randperm(size, generator=g)[:count]] = special[:count]
    return pool


@pytest.mark.parametrize("engine", ["int8", "float64"])
@pytest.mark.parametrize("key_bits", [64, 128])
def test_cuda_words_equal_the_cpu_reference(key_bits: int, engine: str) -> None:
    weights = KeyHashWeights.generate(3, DIMS, shared_dim=256, key_bits=key_bits)
    cuda = USHash(weights, "cuda", engine)  # type: ignore[arg-type]
    cpu = USHash(weights, "cpu", "float64")
    for modality in DIMS:
        assert cuda.bulk(modality) is not None, "the engine failed its self-check on this device"
        for size in SIZES:
            rows = awkward(weights, modality, size)
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                x = rows.to(dtype)
                x = x[torch.isfinite(x).all(dim=1)]
                expected = reference_words(x, cpu.fused(modality))
                assert len(set(map(tuple, expected.tolist()))) > len(x) * 0.5
                for batch in (x, x.cuda()):
                    got = cuda.words(modality, batch)
                    assert got.device.type == "cuda" and got.dtype == torch.uint64
                    assert torch.equal(got.view(torch.int64).cpu(), expected), (modality, size, dtype)
