"""Modality-aware normalization of semantic-key inputs.

Text is normalized before it is embedded, so inputs that differ only in Unicode form, spacing or (when a
binding asks for it) case get the same key. Images and audio are keyed only through an embedding column:
their raw bytes are never normalized or hashed here (:func:`require_embedding`). The tokenizer version is
part of the schema signature, so a change of these rules together with a new tokenizer version is a
cutover, not a silent key drift.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from cache_writer.semantic.exceptions import EmbeddingError

Modality = Literal["text", "image", "audio"]
MODALITIES: tuple[Modality, ...] = get_args(Modality)

# Unicode White_Space (PropList.txt), listed so that other languages can reproduce it exactly.
_WHITESPACE = re.compile(
    "[\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+"
)


class TextRules(BaseModel):
    """How a binding's text is normalized; applied in the order of the fields.

    - ``nfkc``: Unicode NFKC (compatibility composition: ligatures, full-width forms, superscripts);
    - ``casefold``: Unicode full case folding (``"Straße"`` -> ``"strasse"``), then NFKC again when
      ``nfkc`` is on (folding can leave text that is not NFKC);
    - ``collapse_whitespace``: every run of Unicode White_Space characters becomes one U+0020 space,
      and leading and trailing ones are removed.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    nfkc: bool = True
    casefold: bool = False
    collapse_whitespace: bool = True


DEFAULT_TEXT_RULES = TextRules()


def normalize_text(text: str, rules: TextRules = DEFAULT_TEXT_RULES) -> str:
    """The normalized text (see :class:`TextRules`). Pure and deterministic: the same on every host."""
    if rules.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if rules.casefold:
        text = text.casefold()
        if rules.nfkc:
            text = unicodedata.normalize("NFKC", text)
    if rules.collapse_whitespace:
        text = _WHITESPACE.sub(" ", text).strip(" ")
    return text


def check_modality(name: str) -> Modality:
    """``name`` as a :data:`Modality`; raises ``ValueError`` for any other name."""
    for modality in MODALITIES:
        if name == modality:
            return modality
    raise ValueError(f"unknown modality {name!r}; expected one of {', '.join(MODALITIES)}")


def require_embedding(modality: Modality, embedding: object | None) -> object:
    """The embedding value of an image or audio input; raises :class:`EmbeddingError` when it is missing.

    Images and audio have no content normalization: only their embedding defines their key.
    """
    if embedding is None:
        raise EmbeddingError(f"{modality} inputs are keyed by their embedding column, and this row has none")
    return embedding
