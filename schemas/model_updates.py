"""Model updates: a new model, tokenizer, input schema or key-hash weights for some namespaces.

A :class:`ModelUpdate` on the model-update topic announces that the entries of the namespaces it serves
are built under a new signature (:mod:`schemas.signature`) from now on. It is accepted only when it moves
every namespace forward (:func:`check_update`) and its weights file has the announced digest (checked by
``cache_writer.semantic.weights.load_update_weights``, which does the I/O); otherwise it is rejected with
a :class:`ModelUpdateRejected` whose ``reason`` goes to the dead-letter topic.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas.codec import DecodeError
from schemas.errors import InvalidInput
from schemas.signature import SignatureError, canonical_json, normalize_schema, schema_signature

_SEMVER = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]+$")  # the same rule as schemas.bindings.Binding.namespace

RejectionCode = Literal["not-newer", "unknown-namespace", "digest-mismatch", "weights-invalid"]


class ModelUpdateRejected(InvalidInput):
    """A model update that must not be applied; ``reason`` is one line for the dead letter."""

    def __init__(self, code: RejectionCode, reason: str) -> None:
        super().__init__(reason)
        self.code: RejectionCode = code
        self.reason = reason


@dataclass(frozen=True, eq=False)
class SemVer:
    """A Semantic Versioning 2.0.0 version, ordered by precedence (semver.org, item 11).

    Comparisons and equality follow precedence: build metadata is ignored (``1.0.0+a == 1.0.0+b``), a
    pre-release ranks below its release, numeric identifiers compare as numbers and below alphanumeric
    ones, and a longer set of pre-release identifiers ranks higher when the shared ones are equal.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SemVer:
        match = _SEMVER.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-pre][+build])")
        major, minor, patch, pre, build = match.groups()
        return cls(
            int(major),
            int(minor),
            int(patch),
            tuple(pre.split(".")) if pre else (),
            tuple(build.split(".")) if build else (),
        )

    @cached_property
    def precedence(self) -> tuple[Any, ...]:
        if not self.prerelease:
            return (self.major, self.minor, self.patch, 1, ())
        identifiers = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in self.prerelease)
        return (self.major, self.minor, self.patch, 0, identifiers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SemVer) and self.precedence == other.precedence

    def __hash__(self) -> int:
        return hash(self.precedence)

    def __lt__(self, other: SemVer) -> bool:
        return bool(self.precedence < other.precedence)

    def __le__(self, other: SemVer) -> bool:
        return bool(self.precedence <= other.precedence)

    def __gt__(self, other: SemVer) -> bool:
        return bool(self.precedence > other.precedence)

    def __ge__(self, other: SemVer) -> bool:
        return bool(self.precedence >= other.precedence)

    def order_key(self) -> str:
        """A printable ASCII string whose byte order is this version's precedence (build ignored).

        Compared byte by byte (never with a locale's collation), ``a.order_key() < b.order_key()``
        exactly when ``a < b``, and equal keys mean equal precedence. The form, for readers in other
        languages: each number ``n`` is written ``NNN`` + its decimal digits, where ``NNN`` is the
        digit count in three digits (so numbers of up to 999 digits compare numerically); the key is
        ``num(major) num(minor) num(patch)``, then ``1`` for a release, or ``0`` and each pre-release
        identifier followed by ``!`` (``0`` + ``num(n)`` for a numeric one, ``1`` + the identifier for
        an alphanumeric one), then a space. No key is a prefix of another (the space ends it), so
        anything appended after it cannot change the order of two different versions.
        """
        parts = [_order_number(self.major), _order_number(self.minor), _order_number(self.patch)]
        if not self.prerelease:
            parts.append("1")
        else:
            parts.append("0")
            for identifier in self.prerelease:
                if identifier.isdigit():
                    parts.append("0" + _order_number(int(identifier)))
                else:
                    parts.append("1" + identifier)
                parts.append("!")
        parts.append(" ")
        return "".join(parts)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _order_number(number: int) -> str:
    digits = str(number)
    if len(digits) > 999:
        raise ValueError("a version number of more than 999 digits has no order key")
    return f"{len(digits):03d}{digits}"


SEQUENCE_DIGITS = 20
"""Digits of the sequence part of a signature order (an unsigned 64-bit number fits)."""


NO_MODEL_ORDER_KEY = "000 "
"""The version part of the order of a namespace without a model: below every model version's key
(``SemVer.order_key`` starts with a digit count of at least ``001``), so a first model always moves it."""


def signature_order(version: SemVer | None, sequence: int = 0, epoch: int = 0) -> str:
    """The order of a namespace's signature, compared byte by byte (never with a locale):
    ``version.order_key()`` (:data:`NO_MODEL_ORDER_KEY` without a model) + ``/`` + ``sequence`` in 20
    digits, then ``/`` + ``epoch`` in 20 digits when the epoch is not 0.

    A newer model version always orders higher; for one model version, the sequence orders the
    signature changes that schema changes of the bound table make (the DDL's binlog version; 0 for the
    model update itself), and the epoch the fences that came after it (:func:`next_epoch_order`).
    """
    for name, number in (("sequence", sequence), ("epoch", epoch)):
        if not 0 <= number < 10**SEQUENCE_DIGITS:
            raise ValueError(f"{name} must be in 0..10**{SEQUENCE_DIGITS}-1, got {number}")
    key = version.order_key() if version is not None else NO_MODEL_ORDER_KEY
    order = f"{key}/{sequence:0{SEQUENCE_DIGITS}d}"
    return order + f"/{epoch:0{SEQUENCE_DIGITS}d}" if epoch else order


def order_nonce(order: str) -> str:
    """What an order adds to its version: '' for a model update's own order (sequence and epoch 0),
    else ``/<sequence>[/<epoch>]``. It is mixed into the signature (:func:`moved_signature`)."""
    _, _, nonce = order.partition(" /")
    nonce = "/" + nonce if nonce else ""
    return "" if nonce == "/" + "0" * SEQUENCE_DIGITS else nonce


def next_epoch_order(order: str, floor: int = 0) -> str:
    """The order of a fence of the signature whose order is ``order``: the same version and sequence,
    the epoch above both the current one and ``floor`` (so it orders above ``order`` and below any later
    DDL or model version). The fence passes the time in µs as ``floor``: a namespace whose signature
    record was lost (a Redis restart without persistence) never gets an epoch, and so a signature, it
    had before."""
    head, _, nonce = order.partition(" /")
    parts = nonce.split("/") if nonce else []
    if not parts or len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"not a signature order: {order!r}")
    epoch = max(int(parts[1]) + 1 if len(parts) == 2 else 1, floor)
    if epoch >= 10**SEQUENCE_DIGITS:
        raise ValueError("epoch exhausted")
    return f"{head} /{parts[0]}/{epoch:0{SEQUENCE_DIGITS}d}"


def moved_signature(base: str, order: str) -> str:
    """The signature of entries built under ``base`` (a model update's or a table's signature over the
    value columns) at ``order``: ``base`` itself for a model update's own order, else SHA-256 of
    ``base`` followed by :func:`order_nonce` (hex). A schema change or a fence therefore always moves
    the signature, even when the value columns stay the same."""
    nonce = order_nonce(order)
    if not nonce:
        return base
    return hashlib.sha256(f"{base}{nonce}".encode()).hexdigest()


class ModelUpdate(BaseModel):
    """One model update. Frozen and strict; the input schema is checked to have a canonical form.

    ``model_version`` is a semantic version, compared by precedence across the whole history of a
    namespace (switching to another model means publishing it with a higher version). The weights are
    the key-hash weights of the semantic keys (``cache_writer.semantic.weights``): ``weights_ref`` says
    where the file is (a path or a ``file://`` URI), ``weights_sha256`` what it must hash to.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    kind: Literal["model-update"] = "model-update"
    model: str = Field(min_length=1, max_length=200)
    model_version: str = Field(description="Semantic version 2.0.0 (MAJOR.MINOR.PATCH[-pre][+build]).")
    tokenizer_version: str = Field(min_length=1, max_length=200)
    input_schema: dict[str, Any] = Field(description="A JSON Schema or OpenAPI Schema Object.")
    weights_ref: str = Field(min_length=1, description="Path or file:// URI of the key-hash weights file.")
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of that file, lowercase hex.")
    namespaces: tuple[str, ...] = Field(min_length=1, description="The namespaces this model serves.")
    key_bits: Literal[64, 128] = 64
    ts_ms: int = Field(ge=0, description="When the update was published, ms since the epoch.")

    @field_validator("model_version")
    @classmethod
    def _semantic_version(cls, value: str) -> str:
        SemVer.parse(value)
        return value

    @field_validator("input_schema")
    @classmethod
    def _canonical_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            canonical_json(normalize_schema(value))
        except SignatureError as exc:
            raise ValueError(f"input schema has no canonical form: {exc}") from None
        return value

    @field_validator("namespaces")
    @classmethod
    def _distinct_namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _NAMESPACE.match(name) or len(name) > 200:
                raise ValueError(
                    f"namespace {name!r} must match {_NAMESPACE.pattern} (at most 200 characters)"
                )
        if len(set(value)) != len(value):
            raise ValueError("namespaces must be distinct")
        return value

    @property
    def semver(self) -> SemVer:
        return SemVer.parse(self.model_version)

    def signature(self, value_columns: Collection[str] = ()) -> str:
        """The schema signature of entries built under this update (:func:`schemas.signature`)."""
        return schema_signature(
            self.input_schema,
            self.model_version,
            self.tokenizer_version,
            self.weights_sha256,
            value_columns,
            model_name=self.model,
        )


def check_update(update: ModelUpdate, active: ModelUpdate | None, known_namespaces: Collection[str]) -> None:
    """Raise :class:`ModelUpdateRejected` unless ``update`` may replace ``active``.

    ``active`` is the newest update active on any namespace that ``update`` serves (None: none yet).
    Rejected: a namespace not in ``known_namespaces`` (code ``unknown-namespace``), a semantic version
    not strictly above the active one (``not-newer``; equal precedence, e.g. another build of the same
    version, is not newer). The weights digest is checked where the file is read.
    """
    unknown = [name for name in update.namespaces if name not in known_namespaces]
    if unknown:
        raise ModelUpdateRejected(
            "unknown-namespace",
            f"model {update.model} {update.model_version}: unknown namespace(s) {', '.join(unknown)}",
        )
    if active is not None and not update.semver > active.semver:
        raise ModelUpdateRejected(
            "not-newer",
            f"model {update.model} {update.model_version} is not newer than the active "
            f"{active.model} {active.model_version}",
        )


def decode_model_update(data: bytes) -> ModelUpdate:
    """Decode and validate one model-update message; raises ``schemas.DecodeError`` with the reason."""
    try:
        return ModelUpdate.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]]
        raise DecodeError("; ".join(parts)) from None
