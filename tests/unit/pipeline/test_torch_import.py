"""Processes that compute no semantic key do not import torch (about 1.2 s of start-up, 200 MiB)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cache_writer.semantic


def _imports_torch(code: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] == "True"


def test_the_worker_and_connector_modules_do_not_import_torch() -> None:
    assert not _imports_torch(
        "import pipeline.app, pipeline.cli, connectors.runner, pipeline.processor, pipeline.cutover, "
        "cache_writer.semantic.exceptions, cache_writer.semantic.normalize"
    )


def test_a_name_that_needs_torch_imports_it() -> None:
    assert _imports_torch("from cache_writer.semantic import SemanticKeyer")


def test_every_exported_name_resolves() -> None:
    for name in cache_writer.semantic.__all__:
        assert getattr(cache_writer.semantic, name) is not None, name
    with pytest.raises(AttributeError):
        cache_writer.semantic.NoSuchName  # noqa: B018
