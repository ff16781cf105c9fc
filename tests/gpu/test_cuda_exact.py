"""CPU and CUDA give bit-identical semantic keys (invariant 6). Runs where a CUDA device is present."""

from __future__ import annotations

import pytest
import torch

from cache_writer.semantic import KeyHashWeights, SemanticKeyer
from cache_writer.semantic.ushash import fused_matrix

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
]

DIMS = {"text": 384, "image": 768, "audio": 512}
COUNT = 10_000


@pytest.fixture(scope="module", params=[64, 128], ids=["64-bit", "128-bit"])
def keyers(request: pytest.FixtureRequest) -> tuple[SemanticKeyer, SemanticKeyer]:
    weights = KeyHashWeights.generate(21, DIMS, shared_dim=512, key_bits=request.param)
    return SemanticKeyer(weights, device="cpu"), SemanticKeyer(weights, device="cuda")


def embeddings(modality: str, dim: int, weights: KeyHashWeights) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(modality) * 1000 + dim)
    random = torch.randn(COUNT - 1000, dim, generator=g)
    # 1,000 vectors within float rounding of prototype 0's hyperplane: where a non-exact path would flip bits
    row = fused_matrix(weights, modality).t()[0]
    x = torch.randn(1000, dim, generator=g, dtype=torch.float64)
    x = x - (x @ row)[:, None] * row[None, :] / (row @ row)
    return torch.cat([random, x.to(torch.float32)])


@pytest.mark.parametrize("modality", sorted(DIMS))
def test_cpu_and_cuda_keys_are_identical(keyers: tuple[SemanticKeyer, SemanticKeyer], modality: str) -> None:
    cpu, cuda = keyers
    assert cuda.device.type == "cuda"
    vectors = embeddings(modality, DIMS[modality], cpu.weights)
    expected = cpu.keys(modality, vectors)
    assert len(set(expected)) > COUNT * 0.99
    assert cuda.keys(modality, vectors) == expected
    assert cuda.keys(modality, vectors.cuda()) == expected
    assert cuda.keys(modality, vectors.half()) == cpu.keys(modality, vectors.half())
    chunks = [cuda.keys(modality, vectors[i : i + 997]) for i in range(0, COUNT, 997)]
    assert [key for chunk in chunks for key in chunk] == expected
    assert [cuda.keys(modality, vectors[i : i + 1])[0] for i in range(0, COUNT, 50)] == expected[::50]
