"""Where a prewarm reloads hot rows from: the database, or a loader hook the user registers.

A loader is a callable ``load(binding, key_columns, keys) -> iterable of rows``: ``keys`` are the key
column values of the wanted rows (strings, as they appear in cache keys), and each row it returns is a
mapping of column name to JSON value (``schemas.values``: the form change events carry) holding at least
the key columns, the value columns, the semantic source column and the version column of the binding.
Rows it does not find are left out. It runs in a worker thread.

Register one as an entry point of the ``freshkey.loaders`` group and name it in the binding::

    # pyproject.toml of your package
    [project.entry-points."freshkey.loaders"]
    features = "mypkg.cache:load_features"

    # bindings.yaml
    - table: shop.assets
      namespace: assets
      loader: features

Without ``loader`` the rows are read from the bound table (``SELECT * ... WHERE (key) IN (...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from connectors.database import read_rows
from connectors.settings import MySQLSettings
from schemas import Binding
from schemas.errors import InvalidInput

LOADER_GROUP = "freshkey.loaders"

RowLoader = Callable[[Binding, Sequence[str], Sequence[Sequence[str]]], Iterable[Mapping[str, Any]]]


class LoaderError(InvalidInput, LookupError):
    """The binding names a loader that is not installed."""


def database_loader(settings: MySQLSettings) -> RowLoader:
    """The default loader: the rows of the bound table, read with ``settings``."""

    def load(
        binding: Binding, key_columns: Sequence[str], keys: Sequence[Sequence[str]]
    ) -> Iterable[Mapping[str, Any]]:
        return read_rows(settings, binding.database, binding.table_name, key_columns, keys)

    return load


def entry_point_loader(name: str) -> RowLoader:
    """The loader registered as ``name`` in the ``freshkey.loaders`` group."""
    found = [ep for ep in entry_points(group=LOADER_GROUP) if ep.name == name]
    if not found:
        known = ", ".join(sorted(ep.name for ep in entry_points(group=LOADER_GROUP))) or "none"
        raise LoaderError(f"no loader {name!r} in entry point group {LOADER_GROUP} (installed: {known})")
    loader = found[0].load()
    if not callable(loader):
        raise LoaderError(f"loader {name!r} ({found[0].value}) is not callable")
    return loader  # type: ignore[no-any-return]


class Loaders:
    """The loader of each binding (entry points are resolved once)."""

    def __init__(self, mysql: MySQLSettings) -> None:
        self._default = database_loader(mysql)
        self._named: dict[str, RowLoader] = {}

    def for_binding(self, binding: Binding) -> RowLoader:
        if binding.loader is None:
            return self._default
        loader = self._named.get(binding.loader)
        if loader is None:
            loader = self._named[binding.loader] = entry_point_loader(binding.loader)
        return loader
