"""Model updates from a registry table in MySQL, read through the binlog like any other change.

A team that keeps its model registry in the database inserts a row; the connector turns the after
image into a :class:`~schemas.model_updates.ModelUpdate` and produces it to the model-update topic,
where the worker checks it exactly as one sent by ``freshkey model publish``. The table
(``FRESHKEY_CONNECTOR_MODEL_REGISTRY_TABLE=db.table``) has these columns::

    CREATE TABLE model_registry (
      id BIGINT AUTO_INCREMENT PRIMARY KEY,
      model VARCHAR(200) NOT NULL,
      model_version VARCHAR(100) NOT NULL,      -- semantic version
      tokenizer_version VARCHAR(200) NOT NULL,
      input_schema JSON NOT NULL,               -- JSON Schema object
      weights_ref VARCHAR(1000) NOT NULL,       -- resolved by the workers (FRESHKEY_MODEL_WEIGHTS_DIR)
      weights_sha256 CHAR(64) NOT NULL,
      namespaces JSON NOT NULL,                 -- JSON array of namespace names
      key_bits SMALLINT NOT NULL DEFAULT 64
    );

Deletes are ignored (a model is retired by publishing a newer one). A row that does not make a valid
update becomes a dead letter with the reason; the stream goes on.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from schemas import ChangeEvent
from schemas.errors import InvalidInput
from schemas.model_updates import ModelUpdate


class RegistryRowError(InvalidInput):
    """The row is not a valid model update; the message says which column is wrong."""


def _json_column(row: dict[str, Any], column: str) -> Any:
    value = row.get(column)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise RegistryRowError(f"column {column!r} is not JSON: {exc}") from None
    return value


def update_from_row(event: ChangeEvent) -> ModelUpdate | None:
    """The model update an insert or update of a registry row announces (None for a delete)."""
    row = event.after
    if row is None:
        return None
    missing = [
        c
        for c in ("model", "model_version", "tokenizer_version", "weights_ref", "weights_sha256")
        if c not in row
    ]
    if missing:
        raise RegistryRowError(f"registry row lacks column(s) {', '.join(missing)}")
    namespaces = _json_column(row, "namespaces")
    if not isinstance(namespaces, list):
        raise RegistryRowError("column 'namespaces' must hold a JSON array of namespace names")
    try:
        return ModelUpdate(
            model=row["model"],
            model_version=row["model_version"],
            tokenizer_version=str(row["tokenizer_version"]),
            input_schema=_json_column(row, "input_schema"),
            weights_ref=row["weights_ref"],
            weights_sha256=str(row["weights_sha256"]).lower(),
            namespaces=tuple(namespaces),
            key_bits=int(row.get("key_bits") or 64),  # type: ignore[arg-type]
            ts_ms=int(time.time() * 1000),
        )
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise RegistryRowError(f"registry row is not a valid model update: {errors}") from None
