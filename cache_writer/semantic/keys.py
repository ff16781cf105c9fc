"""The semantic-key API that the pipeline and applications share.

>>> weights = KeyHashWeights.generate(7, {"text": 384, "image": 512})
>>> keyer = SemanticKeyer(weights, device="auto")
>>> keys = keyer.keys("image", image_embeddings)            # (n, 512) tensor -> n Python ints
>>> keys = keyer.keys("text", [row["embedding"] for row in rows])   # bytes, base64, JSON lists
>>> format_key(keys[0], weights.key_bits)                   # 16 (or 32) lowercase hex digits
>>> words = keyer.words("image", image_embeddings)          # (n, 1) uint64 tensor on the keyer's device
>>> keyer.hex_keys("image", image_embeddings)               # the same hex, without a Python int per key

``words`` is the bulk path (cutovers, prewarms, whole namespaces): no Python object per key, and on a
GPU the keys stay on the device (:mod:`cache_writer.semantic.bulk`).

A key depends only on the weights and the embedding's values (see :mod:`cache_writer.semantic.ushash`
for why it is bit-identical on CPU and GPU, at any batch size, thread count or process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch

from cache_writer.semantic.bulk import Engine, format_words
from cache_writer.semantic.embeddings import EmbeddingDtype, EmbeddingValue, decode_embeddings
from cache_writer.semantic.exceptions import DeviceUnavailableError
from cache_writer.semantic.ushash import USHash
from cache_writer.semantic.weights import KeyHashWeights

if TYPE_CHECKING:  # a type only: its module needs pydantic, which computing keys does not
    from cache_writer.semantic.fallback_embedder import HashingTextEmbedder

DeviceChoice = Literal["auto", "cpu", "cuda"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto``: CUDA when ``torch.cuda.is_available()``, else the CPU. ``cuda`` (or ``cuda:N``) when no
    CUDA device can be used raises :class:`DeviceUnavailableError` saying why."""
    name = str(device) if isinstance(device, torch.device) else device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            built = torch.version.cuda
            why = (
                f"torch {torch.__version__} is built with CUDA {built}"
                if built
                else f"torch {torch.__version__} is a CPU-only build"
            )
            raise DeviceUnavailableError(
                f"device {name!r} requested but torch.cuda.is_available() is False ({why}, "
                f"{torch.cuda.device_count()} device(s) visible); use --device auto or cpu"
            )
        resolved = torch.device(name)
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return resolved
    raise DeviceUnavailableError(f"unknown device {name!r}; expected auto, cpu, cuda or cuda:N")


class SemanticKeyer:
    """Semantic keys of embedding batches on one device.

    Guaranteed: the same weights and the same embedding values give the same keys wherever and however
    they are computed (``ushash`` module docstring). Batch as much as you like: the keys do not change.
    """

    def __init__(
        self, weights: KeyHashWeights, device: str | torch.device = "auto", engine: Engine = "auto"
    ) -> None:
        """``engine``: how the device computes the sign of the key's integer dot products; ``auto`` picks
        the fastest exact one (``cache_writer.semantic.bulk``). Every engine gives the same keys."""
        self.weights = weights
        self.device = resolve_device(device)
        self._hash = USHash(weights, self.device, engine)

    @property
    def key_bits(self) -> int:
        return self.weights.key_bits

    @property
    def engine(self) -> str:
        """The engine in use (``int8`` or ``float64``)."""
        return self._hash.engine

    def dim(self, modality: str) -> int:
        return self.weights.dim(modality)

    def keys(
        self,
        modality: str,
        embeddings: torch.Tensor | Sequence[EmbeddingValue],
        dtype: EmbeddingDtype | None = None,
    ) -> list[int]:
        """One key per embedding: a ``(n, dim)`` float16/bfloat16/float32 tensor, or column values
        (bytes, base64 or JSON text, lists; ``dtype`` as in ``embeddings.decode_embedding``).

        Raises :class:`~cache_writer.semantic.exceptions.EmbeddingError` for a malformed embedding and
        ``KeyError`` for a modality the weights do not have.
        """
        return self._hash.keys(modality, self._batch(modality, embeddings, dtype))

    def words(
        self,
        modality: str,
        embeddings: torch.Tensor | Sequence[EmbeddingValue],
        dtype: EmbeddingDtype | None = None,
    ) -> torch.Tensor:
        """The keys as a ``(n, key_bits // 64)`` ``torch.uint64`` tensor on the keyer's device, word 0
        the low 64 bits (``key_words``): the bulk path, with no Python object per key. Same arguments
        and errors as :meth:`keys`."""
        return self._hash.words(modality, self._batch(modality, embeddings, dtype))

    def hex_keys(
        self,
        modality: str,
        embeddings: torch.Tensor | Sequence[EmbeddingValue],
        dtype: EmbeddingDtype | None = None,
    ) -> list[str]:
        """``format_key`` of each key (what entry keys are made of), from :meth:`words` without a Python
        int per key. Same arguments and errors as :meth:`keys`."""
        return format_words(self.words(modality, embeddings, dtype))

    def _batch(
        self,
        modality: str,
        embeddings: torch.Tensor | Sequence[EmbeddingValue],
        dtype: EmbeddingDtype | None,
    ) -> torch.Tensor:
        dim = self.weights.dim(modality)
        if isinstance(embeddings, torch.Tensor):
            return embeddings
        return decode_embeddings(embeddings, dim, dtype)

    def text_keys(
        self, texts: Sequence[str], embedder: HashingTextEmbedder, modality: str = "text"
    ) -> list[int]:
        """Keys of texts without an embedding column, through ``embedder`` (its ``dim`` must match)."""
        return self.keys(modality, embedder.embed(texts))


def format_key(key: int, bits: int = 64) -> str:
    """A key as ``bits / 4`` lowercase hex digits, most significant first (``parse_key`` inverts it)."""
    if bits not in (64, 128) or not 0 <= key < 1 << bits:
        raise ValueError(f"{key!r} is not a {bits}-bit key")
    return format(key, f"0{bits // 4}x")


def parse_key(text: str) -> int:
    """The key written by :func:`format_key` (16 or 32 hex digits)."""
    if len(text) not in (16, 32) or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{text!r} is not a 16- or 32-digit lowercase hex key")
    return int(text, 16)


def key_words(key: int, bits: int = 64) -> tuple[int, ...]:
    """A key as unsigned 64-bit words, least significant first (a 128-bit key is ``(low, high)``)."""
    if bits not in (64, 128) or not 0 <= key < 1 << bits:
        raise ValueError(f"{key!r} is not a {bits}-bit key")
    return tuple((key >> (64 * i)) & 0xFFFF_FFFF_FFFF_FFFF for i in range(bits // 64))
