"""Bindings: which table feeds which cache namespace, and how its rows become cache entries.

A bindings file (YAML or JSON) looks like::

    bindings:
      - table: shop.assets            # database.table
        namespace: assets             # cache namespace (Redis hash tag)
        key_columns: [id]             # default: the table's primary key
        value_columns: [modality, content, embedding]   # default: every column
        version_column: updated_at    # default: the event's version (binlog coordinates)
        commit_time_column: updated_at  # a UTC DATETIME(6) set at commit; default: binlog time
        on_change: write              # or invalidate: applications fill after a miss
        semantic:                     # optional: address entries by what the row means (see below)
          modality: text              # text, image or audio
          embedding_column: embedding # an embedding stored with the row (float32/float16 bytes, JSON)
          text_column: content        # text only, without an embedding column: a local text embedder
          text_rules: {nfkc: true, casefold: false, collapse_whitespace: true}
        loader: my-loader             # optional: entry point of group freshkey.loaders for prewarms

With ``semantic``, a row's cache key is its semantic key under the namespace's active model
(``cache_writer.semantic``): ``<prefix>:{<namespace>}:<16 or 32 hex digits>``, and the entry records
the row it was built from. Without it the key is the row's key columns, as always.

Parsing the text is here (pure); reading the file is the caller's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.errors import Misconfigured

_IDENT = r"^[A-Za-z0-9_$-]+$"


class BindingError(Misconfigured):
    """The bindings are invalid; the message names the binding and the field."""


class TextRulesSpec(BaseModel):
    """Text normalization of a semantic binding (the fields of ``cache_writer.semantic.TextRules``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nfkc: bool = True
    casefold: bool = False
    collapse_whitespace: bool = True


class SemanticSpec(BaseModel):
    """How a row's semantic key is computed: from an embedding column, or (text) from a text column."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    modality: Literal["text", "image", "audio"]
    embedding_column: str | None = None
    embedding_dtype: Literal["float32", "float16"] | None = Field(
        None, description="Encoding of a bytes/base64 embedding; default: inferred from its length."
    )
    text_column: str | None = Field(
        None, description="text only: keyed through the local hashing text embedder when no embedding."
    )
    text_rules: TextRulesSpec = TextRulesSpec()
    ngram_sizes: tuple[int, ...] = Field((3,), min_length=1, max_length=8)

    @model_validator(mode="after")
    def _source(self) -> SemanticSpec:
        if self.modality == "text":
            if (self.embedding_column is None) == (self.text_column is None):
                raise ValueError("a text binding names exactly one of embedding_column and text_column")
        elif self.embedding_column is None or self.text_column is not None:
            raise ValueError(f"{self.modality} is keyed by its embedding_column only (no text_column)")
        if any(n < 1 for n in self.ngram_sizes):
            raise ValueError("ngram_sizes must be positive")
        return self

    @property
    def source_column(self) -> str:
        column = self.embedding_column or self.text_column
        assert column is not None
        return column


class Binding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str = Field(description="database.table")
    namespace: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)
    key_columns: tuple[str, ...] | None = None
    value_columns: tuple[str, ...] | None = None
    version_column: str | None = None
    commit_time_column: str | None = None
    on_change: Literal["write", "invalidate"] = Field(
        "write",
        description="write: inserts and updates write the new row into the cache (deletes invalidate); "
        "invalidate: every change only invalidates, and applications fill after a miss (under a lease).",
    )

    semantic: SemanticSpec | None = Field(
        None, description="Key entries by their semantic key under the namespace's active model."
    )
    loader: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Name of an entry point in the freshkey.loaders group that reloads rows for a "
        "prewarm; default: read them from the database.",
    )

    @field_validator("table")
    @classmethod
    def _qualified(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"table must be written database.table, got {value!r}")
        return value

    @field_validator("key_columns", "value_columns")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError("must be a non-empty list of distinct column names")
        return value

    @model_validator(mode="after")
    def _invalidate_needs_versions(self) -> Binding:
        if self.on_change == "invalidate" and self.version_column is None:
            raise ValueError(
                "on_change: invalidate needs a version_column: application fills must carry the row's "
                "version, so that a fill of a row read before a change is refused by its tombstone"
            )
        return self

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.split(".", 1)[1]


class Bindings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bindings: tuple[Binding, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Bindings:
        for attr in ("table", "namespace"):
            seen: set[str] = set()
            for binding in self.bindings:
                value = getattr(binding, attr)
                if value in seen:
                    raise ValueError(f"{attr} {value!r} is bound twice")
                seen.add(value)
        return self

    def for_table(self, database: str, table: str) -> Binding | None:
        return self._by_table.get((database, table))

    @property
    def _by_table(self) -> Mapping[tuple[str, str], Binding]:
        cached: dict[tuple[str, str], Binding] | None = self.__dict__.get("_index")
        if cached is None:
            cached = {(b.database, b.table_name): b for b in self.bindings}
            self.__dict__["_index"] = cached
        return cached

    def tables(self) -> Iterable[tuple[str, str]]:
        return self._by_table.keys()


def parse_bindings(text: str | bytes, *, source: str = "<bindings>") -> Bindings:
    """Parse a YAML or JSON bindings document; raises :class:`BindingError` saying what to fix."""
    try:
        data: Any = orjson.loads(text) if text.lstrip()[:1] in ("{", b"{") else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise BindingError(f"{source}: not valid YAML/JSON: {exc}") from None
    if isinstance(data, list):
        data = {"bindings": data}
    try:
        return Bindings.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise BindingError(f"{source}: invalid bindings:\n" + "\n".join(lines)) from None
