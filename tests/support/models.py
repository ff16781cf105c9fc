"""Model updates for pipeline tests: key-hash weights, ``freshkey model publish``, cutover reports.

What a test needs to move a semantic namespace from one model to another through the real command and
the real worker (``tests/support/pipeline.py``), and to compute the semantic keys an application
computes for its reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cache_writer.semantic import HashingTextEmbedder, KeyHashWeights, SemanticKeyer, format_key
from tests.support.pipeline import Pipeline

SEMANTIC = "    semantic: {modality: text, text_column: content}\n"
"""Binding lines that key the harness's ``assets`` rows by the semantic key of their ``content``."""
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
DIMS = {"text": 64, "image": 16}


def cli(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    """``freshkey <args>`` with the pipeline's settings."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], env=p.env, capture_output=True, text=True, timeout=120
    )


def make_weights(p: Pipeline, seed: int) -> tuple[Path, KeyHashWeights]:
    """A weights file in the pipeline's work directory, and the weights."""
    path = p.workdir / f"weights-{seed}.fkw"
    weights = KeyHashWeights.generate(seed, DIMS, shared_dim=32)
    weights.save(path)
    return path, weights


def publish(p: Pipeline, version: str, weights: Path, *, namespace: str | None = None) -> None:
    """``freshkey model publish`` of model ``minilm`` at ``version`` for the pipeline's namespace: the
    command itself (its options, settings from the pipeline's ``FRESHKEY_*`` environment, its Kafka
    producer), run in this process through typer's runner rather than in a new interpreter (which costs
    about 1 s of CPU per update; :func:`cli` runs the other commands as the user does)."""
    from typer.testing import CliRunner

    from pipeline.commands.model import model_app

    schema = p.workdir / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    args = ["publish", "--model", "minilm", "--version", version, "--tokenizer", "tok-1"]
    args += ["--schema", str(schema), "--weights", str(weights), "--namespace", namespace or p.namespace]
    env = {name: value for name, value in p.env.items() if name.startswith("FRESHKEY_")}
    done = CliRunner().invoke(model_app, args, env=env)
    assert done.exit_code == 0, f"{done.output}\n{done.exception!r}"


def semantic_row_key(weights: KeyHashWeights, content: str) -> str:
    """The key column value of a text row under ``weights``: what an application reads with."""
    keys = SemanticKeyer(weights, "cpu").keys(
        "text", HashingTextEmbedder(weights.dim("text")).embed([content])
    )
    return format_key(keys[0])


def cutovers(p: Pipeline, worker: str = "worker") -> list[dict[str, Any]]:
    """``/freshkey/cutovers`` of a worker (empty while it does not answer)."""
    found = p.page(worker, "/freshkey/cutovers")
    return list(found) if isinstance(found, list) else []


def wait_cutover(p: Pipeline, count: int, timeout: float = 90, worker: str = "worker") -> dict[str, Any]:
    """The ``count``-th signature change the worker reports, once it happened."""
    p.wait(lambda: len(cutovers(p, worker)) >= count, timeout, f"cutover #{count}")
    return cutovers(p, worker)[count - 1]
