"""Errors of the semantic keys, under :class:`SemanticKeyError` (itself a ``CacheWriterError``)."""

from __future__ import annotations

from cache_writer.exceptions import CacheWriterError
from schemas.errors import InvalidInput


class SemanticKeyError(CacheWriterError):
    """Root of every error raised by ``cache_writer.semantic``."""


class EmbeddingError(SemanticKeyError, InvalidInput):
    """An embedding cannot be used: wrong length or type, not base64, NaN or infinite values."""


class WeightsError(SemanticKeyError, ValueError):
    """Key-hash weights are malformed: a bad file, a shape or value out of the allowed range."""


class WeightsDigestMismatch(WeightsError):
    """The weights do not hash to the announced SHA-256."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"key-hash weights digest is {actual}, expected {expected}")
        self.expected = expected
        self.actual = actual


class DeviceUnavailableError(SemanticKeyError, RuntimeError):
    """The requested torch device cannot be used here."""


class EncoderUnavailableError(SemanticKeyError, ImportError):
    """The optional text encoder package is not installed."""
