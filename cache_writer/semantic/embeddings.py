"""Decoding embedding columns into float32 tensors.

An embedding column holds one vector of ``dim`` numbers in one of these forms:

- bytes (a BLOB/BINARY column as the binlog reader returns it): raw IEEE-754 little-endian
  ``float32`` (4 bytes a number) or ``float16`` (2 bytes a number);
- a string: the same bytes in standard base64, which is how cache values and change events carry
  BLOBs (``schemas.values``); or a JSON array text such as ``"[0.1, 0.2]"`` (a TEXT column);
- a list of numbers (a JSON column).

The result is always a float32 tensor. float16 values become float32 exactly, so a vector stored as
float16 and the same values stored as float32 give the same key. JSON numbers are rounded to the nearest
float32 (ties to even). NaN and infinities are errors: they have no sign and no key.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Literal

import torch

from cache_writer.semantic.exceptions import EmbeddingError

EmbeddingDtype = Literal["float32", "float16"]
EmbeddingValue = bytes | bytearray | memoryview | str | Sequence[float]

_TORCH_DTYPES: dict[EmbeddingDtype, torch.dtype] = {"float32": torch.float32, "float16": torch.float16}
_ITEMSIZE: dict[EmbeddingDtype, int] = {"float32": 4, "float16": 2}


def decode_embedding(value: EmbeddingValue, dim: int, dtype: EmbeddingDtype | None = None) -> torch.Tensor:
    """One embedding as a 1-D float32 tensor of ``dim`` finite numbers.

    ``dtype`` names the encoding of bytes and base64 values; when None it is inferred from the length
    (``4 * dim`` bytes: float32, ``2 * dim``: float16), which is unambiguous for a known ``dim``.
    """
    if dim <= 0:
        raise EmbeddingError(f"embedding dim must be positive, got {dim}")
    if isinstance(value, bytes | bytearray | memoryview):
        vector = _from_bytes(bytes(value), dim, dtype)
    elif isinstance(value, str):
        vector = _from_string(value, dim, dtype)
    elif isinstance(value, Sequence):
        vector = _from_numbers(value, dim)
    else:
        raise EmbeddingError(
            f"an embedding must be bytes, a string or a list of numbers, not {type(value).__name__}"
        )
    _check_finite(vector)
    return vector


def decode_embeddings(
    values: Iterable[EmbeddingValue], dim: int, dtype: EmbeddingDtype | None = None
) -> torch.Tensor:
    """A batch of embeddings as a ``(n, dim)`` float32 tensor; the error names the failing row index."""
    vectors: list[torch.Tensor] = []
    for index, value in enumerate(values):
        try:
            vectors.append(decode_embedding(value, dim, dtype))
        except EmbeddingError as exc:
            raise EmbeddingError(f"row {index}: {exc}") from None
    if not vectors:
        return torch.empty((0, dim), dtype=torch.float32)
    return torch.stack(vectors)


def _from_bytes(data: bytes, dim: int, dtype: EmbeddingDtype | None) -> torch.Tensor:
    encoding = _infer_dtype(len(data), dim) if dtype is None else dtype
    if len(data) != _ITEMSIZE[encoding] * dim:
        raise EmbeddingError(
            f"embedding has {len(data)} bytes; expected {_ITEMSIZE[encoding] * dim} ({dim} {encoding})"
        )
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if sys.byteorder != "little":
        raw = raw.view(-1, _ITEMSIZE[encoding]).flip(1).reshape(-1)
    return raw.view(_TORCH_DTYPES[encoding]).to(torch.float32)


def _infer_dtype(size: int, dim: int) -> EmbeddingDtype:
    if size == 4 * dim:
        return "float32"
    if size == 2 * dim:
        return "float16"
    raise EmbeddingError(
        f"embedding has {size} bytes; expected {4 * dim} ({dim} float32) or {2 * dim} ({dim} float16)"
    )


def _from_string(text: str, dim: int, dtype: EmbeddingDtype | None) -> torch.Tensor:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            numbers = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise EmbeddingError(f"embedding text is not a JSON array: {exc}") from None
        if not isinstance(numbers, list):
            raise EmbeddingError("embedding text is not a JSON array")
        return _from_numbers(numbers, dim)
    try:
        data = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        raise EmbeddingError("embedding string is neither base64 nor a JSON array") from None
    return _from_bytes(data, dim, dtype)


def _from_numbers(numbers: Sequence[object], dim: int) -> torch.Tensor:
    if len(numbers) != dim:
        raise EmbeddingError(f"embedding has {len(numbers)} numbers; expected {dim}")
    for index, number in enumerate(numbers):
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise EmbeddingError(f"embedding element {index} is {number!r}, not a number")
    try:
        vector = torch.tensor(numbers, dtype=torch.float64)
    except (OverflowError, RuntimeError):
        raise EmbeddingError("embedding has a number too large for float32") from None
    return vector.to(torch.float32)


def _check_finite(vector: torch.Tensor) -> None:
    bad = (~torch.isfinite(vector)).nonzero()
    if bad.numel():
        index = int(bad[0, 0])
        raise EmbeddingError(
            f"embedding element {index} is {float(vector[index])}: NaN and infinities have no key"
        )
