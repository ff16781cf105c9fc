"""Semantic keys: normalization, embedding decoding, key-hash weights and US-HASH (bit-exact everywhere).

Applications import this package to address cache entries the way the pipeline does; it needs torch
and nothing of Faust or Kafka.
"""

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
