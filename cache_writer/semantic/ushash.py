"""US-HASH: semantic keys from embeddings, bit-identical on any device, batch size, thread count, process.

For one modality ``m`` with weights ``W_m`` (``shared_dim x dim``) and prototypes ``P``
(``key_bits x shared_dim``), both int8 (:mod:`cache_writer.semantic.weights`), the key of an embedding
``x`` (float16/bfloat16/float32, finite) is::

    q     = quantize(x)                          step 1: a positive multiple of x, rounded to integers
    z     = W_m q / ||W_m q||                    projection into the shared space, L2-normalized
    bit i = 1 if <P_i, z> > 0 else 0             i = 0 .. key_bits-1 (0 when W_m q = 0)
    key   = sum(bit_i << i)                      bit 0 is the least significant

``q`` differs from a positive multiple of ``x`` by at most 1/2 per element while its largest element is
at least 64, so the key is the US-HASH of ``x`` up to that quantization. It is computed exactly, and
without computing the normalization:

1. Quantize. ``e`` = the binary exponent of ``max_j |x_j|`` (``2**e <= max < 2**(e+1)``), ``k = 6 - e``,
   ``q_j = round_half_even(x_j * 2**k)``. Multiplying by a power of two is exact in float64 for every
   float16/bfloat16/float32 value, and rounding an exact value is exact, so ``q`` is one fixed vector
   of integers with ``|q_j| <= 128`` (the largest element lands in ``[64, 128)`` before rounding) on any
   hardware. A zero vector quantizes to zeros (its key is 0). No division is used, because a scalar
   division may be computed as a multiplication by the reciprocal on some devices.
2. Project and compare. ``s = P (W_m q) = (P W_m) q``. ``2**k`` and the L2 norm are positive and a
   positive factor never changes a sign, so ``sign(<P_i, z>) = sign(s_i)`` for the quantized input:
   the normalization is applied mathematically and costs nothing. ``P W_m`` is computed once per
   modality (the "fused" matrix, ``key_bits x dim``).

Why every result is exact (invariant 6). All arithmetic is float64 on integer values, and float64
represents every integer of magnitude ``<= 2**53`` exactly; the sum or product of two such integers whose
exact result is also ``<= 2**53`` in magnitude is therefore computed exactly, with or without FMA, in any
order and any blocking. Every intermediate of a matrix product is a sum of a subset of its products, so
it is bounded by the sum of the absolute values of all of them:

- fused entries: ``|sum_t P_it W_tj| <= shared_dim * 127 * 127 <= 4096 * 16129 = 66,064,384 < 2**26``;
- key dot products: ``|sum_j F_ij q_j| <= dim * 2**26 * 128 <= 8192 * 2**26 * 2**7 = 2**46``;

both far below ``2**53`` for the bounds that :class:`~cache_writer.semantic.weights.KeyHashWeights`
enforces (``shared_dim <= 4096``, ``dim <= 8192``; :func:`exactness_bound` recomputes the bound and
:class:`USHash` refuses weights beyond it). So ``s`` is the exact integer, the sign test ``s > 0`` is
exact, and the key cannot depend on summation order, batch size, thread count, BLAS library, CPU or
GPU. (float64 is used rather than an integer matmul because CUDA has no int64 GEMM; TF32 and other
reduced-precision modes apply only to float32 and below.)
"""

from __future__ import annotations

import logging
import struct

import torch

from cache_writer.semantic.bulk import (
    ENGINES,
    WORD_DTYPE,
    BulkHasher,
    Engine,
    default_engine,
    reference_words,
    self_check,
    words_to_ints,
)
from cache_writer.semantic.exact import (
    ACCEPTED_DTYPES,
    EXACT_LIMIT,
    QUANT_MAX,
    quantize,
    sign_bits,
)
from cache_writer.semantic.exceptions import EmbeddingError, WeightsError
from cache_writer.semantic.weights import INT8_LIMIT, KeyHashWeights

log = logging.getLogger(__name__)

__all__ = [
    "EXACT_LIMIT",
    "QUANT_MAX",
    "USHash",
    "exactness_bound",
    "fused_matrix",
    "pack_bits",
    "quantize",
    "sign_bits",
]

_CPU_CHUNK_ROWS = 512  # measured: float64 GEMM and element-wise passes stay in L2 on a 2-core host
_CPU_BULK_CHUNK_ROWS = 1024  # measured on a 2-core AVX-512 host: 512 and 2048 are 10-30 % slower
_CPU_BULK_MIN_ROWS = 128  # measured, 1 thread, d=512: below it the reference's fewer passes win (0.4-0.9x
# the reference's keys/s at 1-64 rows), from 256 rows the bulk path does (2.2-2.5x at 256-512 rows)
_DEVICE_CHUNK_ROWS = 1 << 16


def exactness_bound(shared_dim: int, dim: int) -> int:
    """The largest magnitude any intermediate of the key computation can reach (module docstring)."""
    fused = shared_dim * INT8_LIMIT * INT8_LIMIT
    return max(fused, dim * fused * QUANT_MAX)


def fused_matrix(weights: KeyHashWeights, modality: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(P W_m)^T`` as float64, shape ``(dim, key_bits)``, exact (module docstring), on ``device``."""
    weights.dim(modality)  # raises KeyError naming the known modalities
    projection = weights.projections[modality]
    fused = weights.prototypes.to(torch.float64) @ projection.to(torch.float64)
    return fused.t().contiguous().to(device)


def pack_bits(bits: torch.Tensor) -> list[int]:
    """Keys as Python ints from ``(n, key_bits)`` bools: bit i is worth ``2**i``."""
    n, key_bits = bits.shape
    if n == 0:
        return []
    place = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=bits.device)
    # byte b of a key holds bits 8b..8b+7; a sum of distinct powers of two below 256 is exact
    packed = (bits.reshape(n, key_bits // 8, 8).to(torch.int32) * place).sum(dim=2).to(torch.uint8)
    buffer = bytearray(n * key_bits // 8)
    torch.frombuffer(buffer, dtype=torch.uint8).copy_(packed.reshape(-1).cpu())
    words = struct.unpack(f"<{n * key_bits // 64}Q", buffer)  # little-endian: byte 0 is the lowest
    if key_bits == 64:
        return list(words)
    return [low | high << 64 for low, high in zip(words[0::2], words[1::2], strict=True)]


class USHash:
    """The US-HASH of one set of weights on one device; the fused matrices are built once per modality.

    Guaranteed: :meth:`words` and :meth:`keys` return the same keys for the same embedding values on any
    device, engine, batch size, batch position, thread count or process (module docstring and
    :mod:`cache_writer.semantic.bulk`). :meth:`bits` is the reference path those are tested against.
    """

    def __init__(
        self, weights: KeyHashWeights, device: torch.device | str = "cpu", engine: Engine = "auto"
    ) -> None:
        for modality in weights.modalities:
            bound = exactness_bound(weights.shared_dim, weights.dim(modality))
            if bound >= EXACT_LIMIT:
                raise WeightsError(f"modality {modality!r}: intermediates up to {bound} would not be exact")
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
        self.weights = weights
        self.device = torch.device(device)
        self.engine = default_engine(self.device) if engine == "auto" else engine
        self.chunk_rows = _CPU_CHUNK_ROWS if self.device.type == "cpu" else _DEVICE_CHUNK_ROWS
        self.bulk_chunk_rows = _CPU_BULK_CHUNK_ROWS if self.device.type == "cpu" else _DEVICE_CHUNK_ROWS
        self._fused: dict[str, torch.Tensor] = {}
        self._bulk: dict[str, BulkHasher | None] = {}

    def fused(self, modality: str) -> torch.Tensor:
        matrix = self._fused.get(modality)
        if matrix is None:
            matrix = self._fused[modality] = fused_matrix(self.weights, modality, self.device)
        return matrix

    def bulk(self, modality: str) -> BulkHasher | None:
        """The bulk hasher of ``modality``, self-checked against the reference when it is built; None
        (the reference path) when that check failed, which is logged as an error."""
        if modality in self._bulk:
            return self._bulk[modality]
        hasher: BulkHasher | None = BulkHasher(
            self.fused(modality), self.device, self.engine, self.bulk_chunk_rows
        )
        assert hasher is not None
        if not self_check(hasher):
            log.error(
                "semantic keys: the %s engine on %s gave keys that differ from the reference for "
                "modality %r (a broken kernel or library); keying with the reference path instead, "
                "which is slower. Report the torch version and device.",
                self.engine,
                self.device,
                modality,
            )
            hasher = None
        self._bulk[modality] = hasher
        return hasher

    def _checked(self, modality: str, embeddings: torch.Tensor) -> torch.Tensor:
        fused_t = self.fused(modality)
        if embeddings.dim() != 2 or embeddings.shape[1] != fused_t.shape[0]:
            want, got = fused_t.shape[0], tuple(embeddings.shape)
            raise EmbeddingError(f"{modality} embeddings must have shape (n, {want}), got {got}")
        if embeddings.dtype not in ACCEPTED_DTYPES:
            raise EmbeddingError(f"embeddings must be float16, bfloat16 or float32, not {embeddings.dtype}")
        return fused_t

    def bits(self, modality: str, embeddings: torch.Tensor) -> torch.Tensor:
        """``(n, key_bits)`` bools for a ``(n, dim)`` batch, on this hasher's device: the reference path.

        Large batches are cut into chunks of :attr:`chunk_rows` rows to stay in cache; since every row's
        arithmetic is exact and independent of the others, chunking cannot change a bit.
        """
        fused_t = self._checked(modality, embeddings)
        chunks = [
            sign_bits(quantize(embeddings[start : start + self.chunk_rows].to(self.device)), fused_t)
            for start in range(0, max(len(embeddings), 1), self.chunk_rows)
        ]
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)

    def words(self, modality: str, embeddings: torch.Tensor) -> torch.Tensor:
        """The keys of a ``(n, dim)`` batch as a ``(n, key_bits // 64)`` ``torch.uint64`` tensor on this
        hasher's device, word 0 the low 64 bits (``keys.key_words`` of each key): no Python int per key.
        Computed by the engine's :meth:`bulk` hasher, or by the reference path for batches of fewer than
        128 rows on a CPU (where it is faster) or when the engine failed its self-check.

        Raises :class:`EmbeddingError` for a wrong shape or dtype, or a NaN or infinite value.
        """
        fused_t = self._checked(modality, embeddings)
        small = self.device.type == "cpu" and len(embeddings) < _CPU_BULK_MIN_ROWS  # the same keys, faster
        hasher = None if small else self.bulk(modality)
        if hasher is not None:
            return hasher.words(embeddings)
        chunks = [
            reference_words(embeddings[start : start + self.chunk_rows], fused_t)
            for start in range(0, max(len(embeddings), 1), self.chunk_rows)
        ]
        return (chunks[0] if len(chunks) == 1 else torch.cat(chunks)).view(WORD_DTYPE)

    def keys(self, modality: str, embeddings: torch.Tensor) -> list[int]:
        """The keys as Python ints (:meth:`words`, then one int per key)."""
        return words_to_ints(self.words(modality, embeddings))
