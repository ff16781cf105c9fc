"""Semantic keys: normalization, embedding decoding, key-hash weights and US-HASH (bit-exact everywhere).

Applications import this package to address cache entries the way the pipeline does; it needs torch
and nothing of Faust or Kafka.

Nothing here imports torch until a name that needs it is used (PEP 562): a worker whose bindings have no
semantic key never pays for torch (about 1.2 s of start-up and 200 MiB here), and the exceptions and
text rules stay cheap to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cache_writer.semantic.bulk import WORD_DTYPE, Engine, format_words, words_to_ints
    from cache_writer.semantic.embeddings import EmbeddingDtype, decode_embedding, decode_embeddings
    from cache_writer.semantic.exceptions import (
        DeviceUnavailableError,
        EmbeddingError,
        EncoderUnavailableError,
        SemanticKeyError,
        WeightsDigestMismatch,
        WeightsError,
    )
    from cache_writer.semantic.fallback_embedder import HashingTextEmbedder
    from cache_writer.semantic.keys import SemanticKeyer, format_key, key_words, parse_key, resolve_device
    from cache_writer.semantic.normalize import MODALITIES, Modality, TextRules, normalize_text
    from cache_writer.semantic.ushash import USHash, quantize
    from cache_writer.semantic.weights import (
        KeyHashWeights,
        load_update_weights,
        load_weights,
        verify_digest,
    )

_WHERE = {
    "WORD_DTYPE": "cache_writer.semantic.bulk",
    "Engine": "cache_writer.semantic.bulk",
    "format_words": "cache_writer.semantic.bulk",
    "words_to_ints": "cache_writer.semantic.bulk",
    "EmbeddingDtype": "cache_writer.semantic.embeddings",
    "decode_embedding": "cache_writer.semantic.embeddings",
    "decode_embeddings": "cache_writer.semantic.embeddings",
    "DeviceUnavailableError": "cache_writer.semantic.exceptions",
    "EmbeddingError": "cache_writer.semantic.exceptions",
    "EncoderUnavailableError": "cache_writer.semantic.exceptions",
    "SemanticKeyError": "cache_writer.semantic.exceptions",
    "WeightsDigestMismatch": "cache_writer.semantic.exceptions",
    "WeightsError": "cache_writer.semantic.exceptions",
    "HashingTextEmbedder": "cache_writer.semantic.fallback_embedder",
    "SemanticKeyer": "cache_writer.semantic.keys",
    "format_key": "cache_writer.semantic.keys",
    "key_words": "cache_writer.semantic.keys",
    "parse_key": "cache_writer.semantic.keys",
    "resolve_device": "cache_writer.semantic.keys",
    "MODALITIES": "cache_writer.semantic.normalize",
    "Modality": "cache_writer.semantic.normalize",
    "TextRules": "cache_writer.semantic.normalize",
    "normalize_text": "cache_writer.semantic.normalize",
    "USHash": "cache_writer.semantic.ushash",
    "quantize": "cache_writer.semantic.ushash",
    "KeyHashWeights": "cache_writer.semantic.weights",
    "load_update_weights": "cache_writer.semantic.weights",
    "load_weights": "cache_writer.semantic.weights",
    "verify_digest": "cache_writer.semantic.weights",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MODALITIES",
    "WORD_DTYPE",
    "DeviceUnavailableError",
    "EmbeddingDtype",
    "EmbeddingError",
    "EncoderUnavailableError",
    "Engine",
    "HashingTextEmbedder",
    "KeyHashWeights",
    "Modality",
    "SemanticKeyError",
    "SemanticKeyer",
    "TextRules",
    "USHash",
    "WeightsDigestMismatch",
    "WeightsError",
    "decode_embedding",
    "decode_embeddings",
    "format_key",
    "format_words",
    "key_words",
    "load_update_weights",
    "load_weights",
    "normalize_text",
    "parse_key",
    "quantize",
    "resolve_device",
    "verify_digest",
    "words_to_ints",
]
