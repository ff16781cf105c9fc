"""The bulk keying path: US-HASH keys as a tensor of unsigned 64-bit words, with no Python int per key.

:mod:`cache_writer.semantic.ushash` defines the key and proves why the reference arithmetic (float64 on
integer values) is exact. This module computes the same keys with fewer and cheaper passes over the
data, on any device, and returns them as a ``(n, key_bits // 64)`` ``torch.uint64`` tensor (word 0 holds
bits 0..63, word 1 bits 64..127). Every step below is exact, so the words are bit-identical to the
reference at any batch size, chunking, thread count, device or engine (invariant 6); the tests compare
them bit for bit.

Quantize, fused (one reduction and two element-wise passes instead of five)
    ``hi, lo`` = the largest and smallest element of each row (exact in any precision), ``peak =
    max(hi, -lo)``, ``k = 6 - floor(log2(peak))`` read from its float64 exponent as in ``ushash``. With
    ``s = 2**k`` as a float32 and ``M = 1.5 * 2**23``::

        y_j = float32(M + x_j * s)          then   bits(y_j) = 0x4B400000 + q_j

    Why it is exact: ``x_j * 2**k`` is exact in float32 (a power of two) unless it falls below the
    normal range (``< 2**-126``), where it rounds to integer 0 either way. ``|x_j * 2**k| < 128``, so
    ``M + x_j * 2**k`` lies in ``[2**23, 2**24)`` where float32 numbers are exactly the integers: the
    addition rounds it to the nearest integer, ties to even, and since ``M`` is even that is ``M + q_j``
    with ``q_j = round_half_even(x_j * 2**k)``, the reference's ``q_j``. A fused multiply-add rounds
    once at the same place, so the result does not depend on how the device evaluates it. The float32
    bits of an integer in ``[2**23, 2**24)`` are ``0x4B000000 + (value - 2**23)``; taking their low
    byte (a narrowing integer conversion keeps the low 8 bits, two's complement, on every CPU and in
    PTX's ``cvt``) gives ``q_j`` as an int8 as long as ``-128 <= q_j <= 127``.

    ``q_j = +128`` is possible (an element whose scaled value is at least 127.5). Such a row is
    quantized with ``-s`` instead: ``round_half_even`` is odd-symmetric, so the row becomes ``-q``, in
    ``[-128, 127]`` unless the row also holds ``-128``; its key bits are then read from ``-s`` (a
    factor of -1 carried per row). Both tests are exact float64 comparisons on ``hi * 2**k`` and
    ``lo * 2**k``. Rows holding both +128 and -128, and rows too small for a float32 scale
    (``peak < 2**-121``, so ``k > 127``), are keyed by the reference path instead (they are rare; the
    result is the same by definition).

Engines: the sign of ``s = F q`` with ``F = P W_m`` (integers, ``|F_ij| < 2**26``)
    ``int8``: ``F`` is split into signed base-256 digits, ``F = sum_m 256**m D_m`` with ``D_m`` int8 in
    ``[-128, 127]`` (at most 4 limbs), and one int8 x int8 -> int32 GEMM computes every ``A_m = D_m q``
    (``torch._int_mm``: oneDNN VNNI/AMX on x86 CPUs that have them, cuBLASLt's integer kernels on CUDA).
    ``|A_m| <= dim * 128 * 128 <= 2**27`` for every partial sum, so int32 never overflows and the
    result is exact in any order. ``s = sum_m 256**m A_m`` is then summed in float64: every term and
    partial sum is an integer below ``2**52``, so it is exact too.
    ``float64``: the reference GEMM (exact for the reason given in ``ushash``) on the int8 ``q``.

    ``auto`` picks ``int8`` where torch has a real int8 kernel (CUDA; an x86 CPU with AVX-512 VNNI,
    which is the condition under which torch's CPU ``_int_mm`` uses oneDNN instead of a scalar loop) and
    ``float64`` elsewhere. Both are exact; the choice is speed only. When an engine is set up for a
    modality it keys a set of awkward probes (ties, +-128, subnormals, tiny and zero rows) and compares
    them with the reference on the CPU: a mismatch (a broken kernel or library) logs an error and
    falls back to the reference path for that hasher, so it says so instead of keying wrong.

Packing
    The key bits become bytes (bit ``8b + i`` of a key is bit ``i`` of byte ``b``) and the bytes of a
    row are read as little-endian 64-bit words, all on the device. The ``int8`` engine packs with one
    more int8 GEMM against the place values ``1, 2, ..., 64, -128`` (a byte's two's complement); the
    ``float64`` engine with shifts and an integer sum. Both add distinct powers of two: exact.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import torch

from cache_writer.semantic.exact import quantize, sign_bits
from cache_writer.semantic.exceptions import EmbeddingError

log = logging.getLogger(__name__)

Engine = Literal["auto", "int8", "float64"]
ENGINES: tuple[Engine, ...] = ("auto", "int8", "float64")

WORD_DTYPE = torch.uint64
"""The dtype of the words (torch >= 2.3). ``words.view(torch.int64)`` holds the same bits for the
operations that torch does not implement on uint64."""

_MAGIC = 12582912.0  # 1.5 * 2**23: float32 integers in [2**23, 2**24) are spaced exactly 1 apart
_FLOAT64_EXPONENT_BIAS = 1023
_FLOAT32_EXPONENT_BIAS = 127
_MAX_FLOAT32_SHIFT = 127  # 2**127 is the largest power of two a float32 holds
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_CUDA_MIN_ROWS = 17  # cuBLASLt's int8 GEMM in torch: more than 16 rows, K and N multiples of 8


def default_engine(device: torch.device) -> Literal["int8", "float64"]:
    """``int8`` where torch's ``_int_mm`` runs a real int8 kernel on ``device``, else ``float64``."""
    if device.type == "cuda":
        return "int8"
    if device.type == "cpu" and _cpu_has_avx512_vnni():
        return "int8"
    return "float64"


@cache
def _cpu_has_avx512_vnni() -> bool:
    # torch's CPU _int_mm uses oneDNN only when cpuinfo reports AVX-512 VNNI; otherwise a scalar loop
    # (exact, but about 100x slower than float64 BLAS). /proc/cpuinfo is where Linux reports the flag.
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and "avx512_vnni" in line.split() for line in text.splitlines())


def digits(fused_t: torch.Tensor) -> list[torch.Tensor]:
    """Signed base-256 digits of an integer matrix: ``sum_m 256**m * digits[m] == fused_t``, each digit
    an int8 matrix in ``[-128, 127]``; at least one digit."""
    rest = fused_t.to(torch.int64)
    limbs: list[torch.Tensor] = []
    while not limbs or bool(rest.ne(0).any()):
        digit = torch.remainder(rest + 128, 256) - 128
        limbs.append(digit.to(torch.int8))
        rest = torch.div(rest - digit, 256, rounding_mode="floor")  # exact: rest - digit is a multiple
    return limbs


@dataclass(frozen=True)
class _Quantized:
    q: torch.Tensor
    """``(rows, cols)`` int8: ``sign * q`` of each row, zero-padded where the engine needs it."""
    sign: torch.Tensor
    """``(n, 1)`` float64, ``-1.0`` where the row was quantized with ``-s``."""
    reference: torch.Tensor
    """``(n,)`` bool: rows the reference path keys (both +-128 in the row, or ``peak < 2**-121``)."""
    nonfinite: torch.Tensor
    """``(n,)`` bool: rows holding a NaN or an infinity (no key)."""


def quantize_int8(embeddings: torch.Tensor, rows: int, cols: int) -> _Quantized:
    """The fused quantize of the module docstring, into a ``(rows, cols)`` int8 buffer (zero padded)."""
    n, dim = embeddings.shape
    if embeddings.device.type == "cuda":
        low, high = torch.aminmax(embeddings, dim=1)  # one pass on a GPU
    else:
        high, low = embeddings.amax(dim=1), embeddings.amin(dim=1)  # ~10x faster than aminmax on CPUs
    hi, lo = high.to(torch.float64), low.to(torch.float64)
    peak = torch.maximum(hi, -lo)  # NaN propagates
    nonfinite = ~torch.isfinite(peak)
    exponent = ((peak.view(torch.int64) >> 52) & 0x7FF) - _FLOAT64_EXPONENT_BIAS
    shift = torch.where(peak > 0, 6 - exponent, torch.zeros_like(exponent))
    tiny = shift > _MAX_FLOAT32_SHIFT
    # NaN and infinite rows have shifts far outside float32's range; they are refused anyway.
    shift = shift.clamp(1 - _FLOAT32_EXPONENT_BIAS, _MAX_FLOAT32_SHIFT)
    scale64 = ((shift + _FLOAT64_EXPONENT_BIAS) << 52).view(torch.float64)
    plus_128 = hi * scale64 >= 127.5  # exact products: round_half_even gives 128 exactly from 127.5 up
    minus_128 = lo * scale64 <= -127.5
    flip = plus_128 & ~minus_128
    sign = torch.where(flip, -1.0, 1.0).to(torch.float64)[:, None]
    scale = ((shift + _FLOAT32_EXPONENT_BIAS) << 23).to(torch.int32).view(torch.float32)[:, None]
    scale = scale * sign.to(torch.float32)
    if embeddings.device.type == "cuda":
        magic = torch.tensor(_MAGIC, dtype=torch.float32, device=embeddings.device)
        scaled = torch.addcmul(magic, embeddings, scale)  # one pass; an FMA rounds at the same place
    else:
        scaled = torch.mul(embeddings, scale).add_(_MAGIC)  # faster than addcmul on CPUs
    integers = scaled.view(torch.int32)  # 0x4B400000 + q (module docstring)
    if (rows, cols) == (n, dim):
        q = integers.to(torch.int8)  # keeps the low byte: q
    else:
        q = torch.zeros((rows, cols), dtype=torch.int8, device=embeddings.device)
        q[:n, :dim].copy_(integers)
    return _Quantized(q, sign, tiny | (plus_128 & minus_128) | nonfinite, nonfinite)


class BulkHasher:
    """US-HASH words of one modality on one device with one engine (module docstring).

    ``fused_t`` is the reference's ``(dim, key_bits)`` float64 matrix ``(P W_m)^T`` on ``device``.
    Guaranteed: :meth:`words` equals the reference bit for bit (module docstring).
    """

    def __init__(
        self,
        fused_t: torch.Tensor,
        device: torch.device,
        engine: Literal["int8", "float64"],
        chunk_rows: int,
    ) -> None:
        self.fused_t = fused_t
        self.device = device
        self.engine = engine
        self.chunk_rows = chunk_rows
        self.dim, self.key_bits = int(fused_t.shape[0]), int(fused_t.shape[1])
        self._cuda = device.type == "cuda"
        self._cols = -(-self.dim // 8) * 8 if self._cuda and engine == "int8" else self.dim
        if engine == "int8":
            limbs = digits(fused_t.cpu())
            self.limbs = len(limbs)
            # (limbs * key_bits, cols), transposed to column-major for cuBLASLt's TN int8 kernel
            stacked = torch.zeros((self.limbs * self.key_bits, self._cols), dtype=torch.int8)
            stacked[:, : self.dim] = torch.cat(limbs, dim=1).t()
            self._digits_t = stacked.to(device).t()
            place = torch.zeros((self.key_bits // 8, self.key_bits), dtype=torch.int8)
            for bit in range(self.key_bits):
                place[bit // 8, bit] = -128 if bit % 8 == 7 else 1 << (bit % 8)
            self._place_t = place.to(device).t()
        self._shifts = torch.arange(8, dtype=torch.uint8, device=device)

    def words(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``(n, key_bits // 64)`` uint64 words on this device for a ``(n, dim)`` batch.

        Raises :class:`EmbeddingError` for a NaN or an infinity, like the reference. One host
        synchronization per call (to find the rare rows the reference path keys), none per chunk.
        """
        n = len(embeddings)
        width = self.key_bits // 64
        if n == 0:
            return torch.empty((0, width), dtype=WORD_DTYPE, device=self.device)
        words: list[torch.Tensor] = []
        reference: list[torch.Tensor] = []
        nonfinite: list[torch.Tensor] = []
        for start in range(0, n, self.chunk_rows):
            chunk = embeddings[start : start + self.chunk_rows].to(self.device)
            chunk_words, chunk_reference, chunk_nonfinite = self._chunk(chunk)
            words.append(chunk_words)
            reference.append(chunk_reference)
            nonfinite.append(chunk_nonfinite)
        result = words[0] if len(words) == 1 else torch.cat(words)
        special = reference[0] if len(reference) == 1 else torch.cat(reference)
        refused = nonfinite[0] if len(nonfinite) == 1 else torch.cat(nonfinite)
        # the one synchronization: almost always two False
        any_refused, any_special = torch.stack([refused.any(), special.any()]).tolist()
        if any_refused:
            raise EmbeddingError("embeddings hold NaN or infinite values: they have no key")
        if any_special:
            rows = special.nonzero().flatten()
            result[rows] = reference_words(embeddings[rows.to(embeddings.device)], self.fused_t)
        return result.view(WORD_DTYPE)

    def _chunk(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = len(chunk)
        rows = max(n, _CUDA_MIN_ROWS) if self._cuda and self.engine == "int8" else n
        quantized = quantize_int8(chunk, rows, self._cols)
        if self.engine == "int8":
            partial = torch._int_mm(quantized.q, self._digits_t)[:n]  # (n, limbs * key_bits) int32
            kb = self.key_bits
            sums = partial[:, :kb].to(torch.float64)
            for limb in range(1, self.limbs):
                sums.add_(partial[:, limb * kb : (limb + 1) * kb], alpha=float(256**limb))
        else:
            sums = quantized.q.to(torch.float64) @ self.fused_t
        if self._cuda or bool(quantized.sign.lt(0).any()):  # a CPU reads the flag for free
            sums.mul_(quantized.sign)
        bits = sums > 0
        return self._pack(bits), quantized.reference, quantized.nonfinite

    def _pack(self, bits: torch.Tensor) -> torch.Tensor:
        n = len(bits)
        if self.engine == "int8":
            rows = max(n, _CUDA_MIN_ROWS) if self._cuda else n
            if rows != n:
                bits = torch.cat([bits, bits.new_zeros((rows - n, self.key_bits))])
            packed = torch._int_mm(bits.view(torch.int8), self._place_t)[:n].to(torch.int8)
        else:
            packed = (bits.view(torch.uint8).view(n, self.key_bits // 8, 8) << self._shifts).sum(
                dim=2, dtype=torch.uint8
            )
        return _bytes_to_words(packed)


def _bytes_to_words(packed: torch.Tensor) -> torch.Tensor:
    """``(n, key_bits // 8)`` bytes (byte 0 lowest) as ``(n, key_bits // 64)`` int64 words."""
    if _LOW_BYTE != 0:  # a big-endian host: put each word's lowest byte last before reinterpreting
        packed = packed.view(len(packed), -1, 8).flip(2).reshape(len(packed), -1).contiguous()
    return packed.contiguous().view(torch.int64)


def reference_words(embeddings: torch.Tensor, fused_t: torch.Tensor) -> torch.Tensor:
    """The reference path (``exact.quantize`` and ``sign_bits``) packed into int64 words."""
    bits = sign_bits(quantize(embeddings.to(fused_t.device)), fused_t)
    n, key_bits = bits.shape
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    packed = (bits.view(torch.uint8).view(n, key_bits // 8, 8) << shifts).sum(dim=2, dtype=torch.uint8)
    return _bytes_to_words(packed)


def words_to_ints(words: torch.Tensor) -> list[int]:
    """Keys as Python ints from ``(n, 1 or 2)`` words (the slow form: one object per key)."""
    columns = words.view(torch.int64).cpu().view(WORD_DTYPE).numpy()
    if columns.shape[1] == 1:
        return [int(k) for k in columns[:, 0].tolist()]
    return [low | high << 64 for low, high in columns.tolist()]


def format_words(words: torch.Tensor) -> list[str]:
    """Keys as lowercase hex (16 or 32 digits, most significant first: ``keys.format_key``) from words,
    without a Python int per key."""
    columns = words.view(torch.int64).cpu().view(WORD_DTYPE).numpy()
    n, width = columns.shape
    if n == 0:
        return []
    text = columns[:, ::-1].astype(">u8").tobytes().hex()  # big-endian: most significant digit first
    size = width * 16
    return [text[i : i + size] for i in range(0, n * size, size)]


PROBE_ROWS = 48


def probe_embeddings(dim: int, seed: int = 0) -> torch.Tensor:
    """Awkward rows for the self-check and the tests: ties at .5, +128 alone, +-128 together, -128,
    subnormal, tiny (``peak < 2**-121``), huge, zero and one-hot rows, float16 values, random rows."""
    g = torch.Generator().manual_seed(seed)
    rows: list[torch.Tensor] = [torch.randn(dim, generator=g) for _ in range(PROBE_ROWS - 16)]

    def row(values: Sequence[float], base: float = 0.0) -> torch.Tensor:
        vector = torch.full((dim,), base)
        vector[: min(dim, len(values))] = torch.tensor(list(values)[:dim])
        return vector

    rows.append(row([64.0, 0.5, 1.5, 2.5, -0.5, -1.5, 127.5 / 2]))  # ties after a scale of 2**0
    rows.append(row([127.5, 3.0, -7.25]))  # +128 alone: the flipped row
    rows.append(row([127.5, -127.5, 1.0]))  # +128 and -128: the reference row
    rows.append(row([-127.5, 64.0, 0.25]))  # -128 alone
    rows.append(row([127.9, -127.6]))
    rows.append(torch.randn(dim, generator=g) * 1e-40)  # subnormal float32, k > 127: reference
    rows.append(torch.randn(dim, generator=g) * 2.0**-115)  # k near the float32 limit
    rows.append(torch.randn(dim, generator=g) * 1e37)
    rows.append(torch.zeros(dim))
    rows.append(row([0.0] * (dim // 2) + [-3.0]))
    rows.append(torch.randn(dim, generator=g).half().float())
    rows.append(torch.full((dim,), 0.1))
    rows.append(torch.linspace(-1, 1, dim))
    rows.append(torch.full((dim,), 1.9990234375))  # every element rounds to +128
    rows.append(torch.full((dim,), -1.9990234375))
    rows.append(row([2.0**-100, 2.0**-140]))  # a subnormal element beside a small normal peak
    return torch.stack(rows).to(torch.float32)


def self_check(hasher: BulkHasher) -> bool:
    """Whether the hasher's words equal the CPU reference on :func:`probe_embeddings`."""
    probes = probe_embeddings(hasher.dim)
    expected = reference_words(probes, hasher.fused_t.cpu())
    got = hasher.words(probes).view(torch.int64).cpu()
    return bool(torch.equal(got, expected))
