"""Key-hash weights: the integer matrices that turn an embedding into a semantic key (US-HASH).

A :class:`KeyHashWeights` holds, all as int8 in ``[-127, 127]``:

- per modality ``m``, a projection ``W_m`` of shape ``(shared_dim, dim_m)`` into a space shared by all
  modalities;
- ``prototypes`` ``P`` of shape ``(key_bits, shared_dim)``: bit ``i`` of a key is the sign of the
  projected embedding against prototype ``i`` (``cache_writer.semantic.ushash``).

Dimensions are bounded (``dim_m <= MAX_EMBEDDING_DIM``, ``shared_dim <= MAX_SHARED_DIM``) so that the
key arithmetic is exact in float64; ``ushash`` proves the bound.

File format and digest
    The canonical bytes of a set of weights, which is also exactly the content of its file, are::

        header  = canonical JSON (schemas.signature.canonical_json) of
                  {"format": "freshkey.keyhash-weights/1", "key_bits": K, "shared_dim": D,
                   "modalities": [{"dim": d, "name": "audio"}, ...]}   # sorted by name
        payload = P as K*D signed bytes, row-major;
                  then each W_m in header order as D*d_m signed bytes, row-major
        bytes   = header (UTF-8) + b"\\n" + payload

    The digest is the lowercase hex SHA-256 of those bytes, so ``sha256sum weights.fkw`` gives it
    without freshkey. Loading rejects a file whose header is not in canonical form, whose length does
    not match, or that holds ``-128``, so every accepted file re-serializes to itself.

Generation
    :meth:`KeyHashWeights.generate` draws every matrix uniformly from ``[-127, 127]`` with a CPU
    ``torch.Generator`` seeded with ``seed``: first ``P``, then each ``W_m`` in name order. The result
    is deterministic for a given torch version; across torch versions only the digest is the identity,
    so publish the file, not the seed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import torch

from cache_writer.semantic.exceptions import WeightsDigestMismatch, WeightsError
from schemas.signature import canonical_json

if TYPE_CHECKING:
    from schemas.model_updates import ModelUpdate

WEIGHTS_FORMAT = "freshkey.keyhash-weights/1"
KEY_BITS = (64, 128)
MAX_SHARED_DIM = 4096
MAX_EMBEDDING_DIM = 8192
INT8_LIMIT = 127
_MODALITY_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True, eq=False)
class KeyHashWeights:
    """A validated, immutable set of key-hash weights (do not modify the tensors in place).

    Construction checks dtypes, shapes, the dimension bounds and the value range; :attr:`sha256` is the
    digest of :meth:`to_bytes` (module docstring).
    """

    key_bits: int
    shared_dim: int
    prototypes: torch.Tensor
    projections: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.key_bits not in KEY_BITS:
            raise WeightsError(f"key_bits must be 64 or 128, got {self.key_bits}")
        if not 1 <= self.shared_dim <= MAX_SHARED_DIM:
            raise WeightsError(f"shared_dim must be in 1..{MAX_SHARED_DIM}, got {self.shared_dim}")
        if not self.projections:
            raise WeightsError("key-hash weights need at least one modality")
        _check_matrix("prototypes", self.prototypes, (self.key_bits, self.shared_dim))
        ordered: dict[str, torch.Tensor] = {}
        for name in sorted(self.projections):
            matrix = self.projections[name]
            if not _MODALITY_NAME.match(name):
                raise WeightsError(f"modality name {name!r} must match {_MODALITY_NAME.pattern}")
            if matrix.dim() != 2 or not 1 <= matrix.shape[1] <= MAX_EMBEDDING_DIM:
                raise WeightsError(
                    f"projection {name!r} must be (shared_dim, dim) with dim in 1..{MAX_EMBEDDING_DIM}, "
                    f"got {tuple(matrix.shape)}"
                )
            _check_matrix(f"projection {name!r}", matrix, (self.shared_dim, matrix.shape[1]))
            ordered[name] = matrix.detach().to("cpu").contiguous()
        object.__setattr__(self, "prototypes", self.prototypes.detach().to("cpu").contiguous())
        object.__setattr__(self, "projections", ordered)

    @classmethod
    def generate(
        cls, seed: int, dims: Mapping[str, int], *, shared_dim: int = 256, key_bits: int = 64
    ) -> KeyHashWeights:
        """Random weights from ``seed`` (module docstring, "Generation")."""
        if not 0 <= seed < 2**64:
            raise WeightsError(f"seed must be in 0..2**64-1, got {seed}")
        if key_bits not in KEY_BITS or not 1 <= shared_dim <= MAX_SHARED_DIM:
            raise WeightsError(f"key_bits must be 64 or 128 and shared_dim in 1..{MAX_SHARED_DIM}")
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)

        def draw(rows: int, cols: int) -> torch.Tensor:
            return torch.randint(
                -INT8_LIMIT, INT8_LIMIT + 1, (rows, cols), generator=generator, dtype=torch.int8
            )

        prototypes = draw(key_bits, shared_dim)
        projections: dict[str, torch.Tensor] = {}
        for name in sorted(dims):
            if not 1 <= dims[name] <= MAX_EMBEDDING_DIM:
                raise WeightsError(f"dim of {name!r} must be in 1..{MAX_EMBEDDING_DIM}, got {dims[name]}")
            projections[name] = draw(shared_dim, dims[name])
        return cls(key_bits, shared_dim, prototypes, projections)

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.projections)

    def dim(self, modality: str) -> int:
        """The embedding dimension of ``modality``; raises ``KeyError`` naming the known ones."""
        try:
            return int(self.projections[modality].shape[1])
        except KeyError:
            known = ", ".join(self.projections)
            raise KeyError(
                f"no key-hash projection for modality {modality!r}; these weights have {known}"
            ) from None

    def header(self) -> dict[str, Any]:
        return {
            "format": WEIGHTS_FORMAT,
            "key_bits": self.key_bits,
            "modalities": [{"dim": int(m.shape[1]), "name": name} for name, m in self.projections.items()],
            "shared_dim": self.shared_dim,
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes (module docstring); equal weights always give equal bytes."""
        parts = [canonical_json(self.header()).encode("utf-8"), b"\n", _int8_bytes(self.prototypes)]
        parts.extend(_int8_bytes(matrix) for matrix in self.projections.values())
        return b"".join(parts)

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyHashWeights:
        """Parse canonical bytes; raises :class:`WeightsError` for anything else."""
        newline = data.find(b"\n")
        if newline < 0:
            raise WeightsError("not a key-hash weights file: no header line")
        header_bytes = data[:newline]
        try:
            header = json.loads(header_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WeightsError("not a key-hash weights file: the header is not JSON") from None
        if not isinstance(header, dict) or header.get("format") != WEIGHTS_FORMAT:
            raise WeightsError(f"not a key-hash weights file: format is not {WEIGHTS_FORMAT!r}")
        if set(header) != {"format", "key_bits", "modalities", "shared_dim"}:
            raise WeightsError(f"weights header has fields {sorted(header)}")
        if canonical_json(header).encode("utf-8") != header_bytes:
            raise WeightsError("weights header is not in canonical form")
        key_bits, shared_dim, modalities = header["key_bits"], header["shared_dim"], header["modalities"]
        if not (
            _is_int(key_bits)
            and _is_int(shared_dim)
            and isinstance(modalities, list)
            and all(
                isinstance(m, dict)
                and set(m) == {"dim", "name"}
                and _is_int(m["dim"])
                and isinstance(m["name"], str)
                for m in modalities
            )
        ):
            raise WeightsError("weights header has a field of the wrong type")
        names = [m["name"] for m in modalities]
        if names != sorted(set(names)):
            raise WeightsError("weights header modalities must be distinct and sorted by name")
        if key_bits not in KEY_BITS or not 1 <= shared_dim <= MAX_SHARED_DIM:
            raise WeightsError(f"weights header has key_bits {key_bits}, shared_dim {shared_dim}")
        if not all(1 <= m["dim"] <= MAX_EMBEDDING_DIM for m in modalities):
            raise WeightsError(f"weights header has a dim outside 1..{MAX_EMBEDDING_DIM}")
        shapes = [(key_bits, shared_dim)] + [(shared_dim, m["dim"]) for m in modalities]
        payload = data[newline + 1 :]
        expected = sum(rows * cols for rows, cols in shapes)
        if len(payload) != expected:
            raise WeightsError(f"weights payload has {len(payload)} bytes, the header needs {expected}")
        flat = (
            torch.frombuffer(bytearray(payload), dtype=torch.int8)
            if payload
            else torch.empty(0, dtype=torch.int8)
        )
        matrices: list[torch.Tensor] = []
        offset = 0
        for rows, cols in shapes:
            matrices.append(flat[offset : offset + rows * cols].reshape(rows, cols).clone())
            offset += rows * cols
        return cls(key_bits, shared_dim, matrices[0], dict(zip(names, matrices[1:], strict=True)))

    def save(self, path: str | Path) -> str:
        """Write the canonical bytes to ``path`` (atomically: a temporary file, then a rename); returns
        the digest, which is also the file's SHA-256."""
        target = Path(path)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_bytes(self.to_bytes())
        temporary.replace(target)
        return self.sha256


def verify_digest(weights: KeyHashWeights, sha256: str) -> None:
    """Raise :class:`WeightsDigestMismatch` unless the weights' digest is ``sha256`` (hex, any case)."""
    if weights.sha256 != sha256.lower():
        raise WeightsDigestMismatch(sha256.lower(), weights.sha256)


def weights_path(ref: str, base_dir: str | Path | None = None) -> Path:
    """The local path of a weights reference: a path (relative ones against ``base_dir``) or a ``file://``
    URI. Other schemes raise :class:`WeightsError` (fetch the file first, then pass its path)."""
    parsed = urlparse(ref)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise WeightsError(f"weights URI {ref!r} names a remote host")
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive, a path
        raise WeightsError(f"weights reference {ref!r}: only paths and file:// URIs are supported")
    path = Path(ref)
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def load_weights(
    ref: str | Path, expected_sha256: str | None = None, *, base_dir: str | Path | None = None
) -> KeyHashWeights:
    """Read and parse a weights file; with ``expected_sha256`` the file's bytes are checked first.

    Raises :class:`WeightsDigestMismatch`, :class:`WeightsError`, or ``OSError`` when it cannot be read.
    """
    path = ref if isinstance(ref, Path) else weights_path(ref, base_dir)
    data = path.read_bytes()
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256.lower():
            raise WeightsDigestMismatch(expected_sha256.lower(), actual)
    return KeyHashWeights.from_bytes(data)


def load_update_weights(update: ModelUpdate, *, base_dir: str | Path | None = None) -> KeyHashWeights:
    """The verified weights of a model update, or :class:`ModelUpdateRejected` with the reason:
    ``digest-mismatch`` when the file does not hash to ``update.weights_sha256``, ``weights-invalid``
    when it cannot be read or parsed or its key size is not ``update.key_bits``."""
    # imported here: schemas.model_updates needs pydantic, which computing keys does not (the GPU check
    # in tests/gpu loads the semantic modules with torch alone)
    from schemas.model_updates import ModelUpdateRejected

    label = f"model {update.model} {update.model_version}"
    try:
        weights = load_weights(update.weights_ref, update.weights_sha256, base_dir=base_dir)
    except WeightsDigestMismatch as exc:
        raise ModelUpdateRejected("digest-mismatch", f"{label}: {exc}") from None
    except (WeightsError, OSError) as exc:
        raise ModelUpdateRejected(
            "weights-invalid", f"{label}: weights {update.weights_ref!r}: {exc}"
        ) from None
    if weights.key_bits != update.key_bits:
        raise ModelUpdateRejected(
            "weights-invalid",
            f"{label}: weights make {weights.key_bits}-bit keys, the update says {update.key_bits}",
        )
    return weights


def _check_matrix(what: str, matrix: torch.Tensor, shape: tuple[int, int]) -> None:
    if not isinstance(matrix, torch.Tensor) or matrix.dtype != torch.int8:
        raise WeightsError(f"{what} must be an int8 tensor")
    if tuple(matrix.shape) != shape:
        raise WeightsError(f"{what} must have shape {shape}, got {tuple(matrix.shape)}")
    if matrix.numel() and int(matrix.min()) < -INT8_LIMIT:
        raise WeightsError(f"{what} holds -128; values must be in [-127, 127]")


def _int8_bytes(matrix: torch.Tensor) -> bytes:
    buffer = bytearray(matrix.numel())
    if buffer:
        torch.frombuffer(buffer, dtype=torch.int8).copy_(matrix.reshape(-1))
    return bytes(buffer)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
