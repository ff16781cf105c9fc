"""The exact reference arithmetic of US-HASH (steps 1 and 2 of :mod:`cache_writer.semantic.ushash`'s
docstring, which says why every result is exact): shared by the reference path (``ushash``) and the bulk
engines (``bulk``), which are checked against it."""

from __future__ import annotations

import torch

from cache_writer.semantic.exceptions import EmbeddingError

QUANT_MAX = 128
"""Largest ``|q_j|`` after quantization."""
EXACT_LIMIT = 2**53
"""float64 holds every integer up to this magnitude exactly."""
ACCEPTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FLOAT64_EXPONENT_BIAS = 1023


def quantize(embeddings: torch.Tensor) -> torch.Tensor:
    """Step 1 of the module docstring: ``(n, dim)`` float16/bfloat16/float32 -> integer-valued float64.

    Raises :class:`EmbeddingError` for another dtype or shape, or a NaN or infinite value.
    """
    if embeddings.dtype not in ACCEPTED_DTYPES:
        raise EmbeddingError(f"embeddings must be float16, bfloat16 or float32, not {embeddings.dtype}")
    if embeddings.dim() != 2 or embeddings.shape[1] == 0:
        raise EmbeddingError(f"embeddings must be a (batch, dim) matrix, got shape {tuple(embeddings.shape)}")
    # max and abs are exact in any precision, and every float16/bfloat16/float32 value (subnormals too)
    # is a normal float64 number. A NaN or an infinity anywhere makes its row's peak NaN or infinite.
    peak = embeddings.abs().amax(dim=1, keepdim=True).to(torch.float64)
    if not bool(torch.isfinite(peak).all()):
        raise EmbeddingError("embeddings hold NaN or infinite values: they have no key")
    # floor(log2(peak)) read from the float64 exponent field: exact, and the same bits on every device.
    exponent = ((peak.view(torch.int64) >> 52) & 0x7FF) - _FLOAT64_EXPONENT_BIAS
    shift = torch.where(peak > 0, 6 - exponent, torch.zeros_like(exponent))
    # 2**shift built from its bits; shift is in [-121, 155] here, well inside float64's exponent range.
    scale = ((shift + _FLOAT64_EXPONENT_BIAS) << 52).view(torch.float64)
    # The product is promoted to float64 (the input converted exactly, then scaled by a power of two:
    # exact), then rounded half to even in place; CPU and CUDA both round this way.
    return (embeddings * scale).round_()


def sign_bits(quantized: torch.Tensor, fused_t: torch.Tensor) -> torch.Tensor:
    """``(n, key_bits)`` bools: bit i is ``(q . F_i) > 0``, computed exactly (module docstring)."""
    return (quantized @ fused_t) > 0
