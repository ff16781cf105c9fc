"""The semantic key of a binding's row: what the worker writes under, and what an application computes to
read the same entry (bit-identical wherever it runs: invariant 6).

``row_keys`` takes rows (images) of semantic bindings and a keyer (the weights of the namespace's model)
and returns their entry keys, ``<prefix>:{<namespace>}:<hex key>``; rows that cannot be keyed (no such
column, NULL, wrong type or size) get the reason instead. Requests that share a keyer and a modality are
keyed in one batch on the keyer's device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cache_writer.layout import entry_key
from cache_writer.semantic import (
    HashingTextEmbedder,
    SemanticKeyer,
    TextRules,
    decode_embedding,
)
from cache_writer.semantic.exceptions import EmbeddingError
from schemas import Binding


@dataclass(frozen=True, slots=True)
class RowKeyRequest:
    """One image (row) of a semantic binding to key with one keyer."""

    binding: Binding
    keyer: SemanticKeyer
    image: Mapping[str, Any]


def row_keys(requests: Sequence[RowKeyRequest], prefix: str) -> list[str | EmbeddingError]:
    """The entry key of each request, or the reason it has none, computed in batches.

    Requests that share a keyer and a modality are keyed in one call (one batch on the device); keys do
    not depend on how they are batched (invariant 6).
    """
    results: list[str | EmbeddingError] = [EmbeddingError("not keyed")] * len(requests)
    groups: dict[tuple[int, str, str], list[int]] = {}
    for index, request in enumerate(requests):
        spec = request.binding.semantic
        assert spec is not None and request.keyer is not None
        group = (id(request.keyer), spec.modality, "text" if spec.text_column else "embedding")
        groups.setdefault(group, []).append(index)
    for (_, modality, source), indexes in groups.items():
        first = requests[indexes[0]]
        keyer = first.keyer
        assert keyer is not None
        try:
            dim = keyer.dim(modality)
        except KeyError as exc:
            for index in indexes:
                results[index] = EmbeddingError(str(exc.args[0]))
            continue
        vectors = []
        ok: list[int] = []
        for index in indexes:
            request = requests[index]
            spec = request.binding.semantic
            assert spec is not None
            try:
                vectors.append(_vector(request, dim, source))
                ok.append(index)
            except EmbeddingError as exc:
                results[index] = exc
        if not ok:
            continue
        import torch

        # the bulk path: hex straight from the words, no Python int per key
        keys = keyer.hex_keys(modality, torch.stack(vectors))
        for index, key in zip(ok, keys, strict=True):
            request = requests[index]
            results[index] = entry_key(prefix, request.binding.namespace, [key])
    return results


_EMBEDDERS: dict[tuple[int, tuple[int, ...], TextRules], HashingTextEmbedder] = {}


def _vector(request: RowKeyRequest, dim: int, source: str) -> Any:
    spec = request.binding.semantic
    assert spec is not None
    column = spec.source_column
    if column not in request.image:
        raise EmbeddingError(f"semantic column {column!r} is not in the row")
    value = request.image[column]
    if value is None:
        raise EmbeddingError(f"semantic column {column!r} is NULL: the row has no semantic key")
    if source == "text":
        if not isinstance(value, str):
            raise EmbeddingError(f"text column {column!r} holds {type(value).__name__}, not text")
        rules = TextRules(**spec.text_rules.model_dump())
        embedder_key = (dim, spec.ngram_sizes, rules)
        embedder = _EMBEDDERS.get(embedder_key)
        if embedder is None:
            embedder = _EMBEDDERS[embedder_key] = HashingTextEmbedder(dim, spec.ngram_sizes, rules)
        return embedder.embed_one(value)
    return decode_embedding(value, dim, spec.embedding_dtype)
