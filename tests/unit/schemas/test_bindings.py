"""schemas.bindings: parsing YAML/JSON bindings documents and looking a table up."""

from __future__ import annotations

import pytest

from schemas.bindings import Binding, BindingError, Bindings, parse_bindings

YAML = """
bindings:
  - table: shop.assets            # database.table
    namespace: assets
    key_columns: [id]
    value_columns: [modality, content, embedding]
    version_column: updated_at
    commit_time_column: updated_at
  - table: shop.texts
    namespace: texts.v2
"""

JSON = """
{"bindings": [
  {"table": "shop.assets", "namespace": "assets", "key_columns": ["id"],
   "value_columns": ["modality", "content", "embedding"],
   "version_column": "updated_at", "commit_time_column": "updated_at"},
  {"table": "shop.texts", "namespace": "texts.v2"}
]}
"""


def check_example(bindings: Bindings) -> None:
    assets, texts = bindings.bindings
    assert assets == Binding(
        table="shop.assets",
        namespace="assets",
        key_columns=("id",),
        value_columns=("modality", "content", "embedding"),
        version_column="updated_at",
        commit_time_column="updated_at",
    )
    assert (assets.database, assets.table_name) == ("shop", "assets")
    assert texts.namespace == "texts.v2"
    assert texts.key_columns is None
    assert texts.value_columns is None
    assert texts.version_column is None
    assert texts.commit_time_column is None


@pytest.mark.parametrize("text", [YAML, JSON, YAML.encode(), JSON.encode(), "  \n" + JSON])
def test_yaml_and_json_parse(text: str | bytes) -> None:
    check_example(parse_bindings(text))


def test_yaml_and_json_give_equal_bindings() -> None:
    assert parse_bindings(YAML) == parse_bindings(JSON)


@pytest.mark.parametrize(
    "text",
    [
        "- table: shop.assets\n  namespace: assets\n",
        '[{"table": "shop.assets", "namespace": "assets"}]',
    ],
)
def test_bare_list_is_accepted(text: str) -> None:
    bindings = parse_bindings(text)
    assert [b.table for b in bindings.bindings] == ["shop.assets"]


def test_for_table_lookup() -> None:
    bindings = parse_bindings(YAML)
    assets = bindings.for_table("shop", "assets")
    assert assets is not None
    assert assets.namespace == "assets"
    texts = bindings.for_table("shop", "texts")
    assert texts is not None
    assert texts.namespace == "texts.v2"
    assert bindings.for_table("shop", "audio") is None
    assert bindings.for_table("other", "assets") is None
    assert bindings.for_table("shop.assets", "") is None
    assert set(bindings.tables()) == {("shop", "assets"), ("shop", "texts")}
    # Lookups do not change what the bindings are.
    assert bindings == parse_bindings(YAML)
    assert bindings.for_table("shop", "assets") is assets


def error(text: str | bytes) -> str:
    with pytest.raises(BindingError) as info:
        parse_bindings(text, source="conf/bindings.yaml")
    message = str(info.value)
    assert message.startswith("conf/bindings.yaml: ")
    return message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- {table: shop.a, namespace: a, bogus: 1}", ["bindings.0.bogus", "Extra inputs"]),
        ("bindings: [{table: shop.a, namespace: a}]\nextra: 1", ["extra", "Extra inputs"]),
        ("- {table: shop, namespace: a}", ["bindings.0.table", "database.table", "'shop'"]),
        ("- {table: shop.a.b, namespace: a}", ["bindings.0.table", "database.table"]),
        ("- {table: .a, namespace: a}", ["bindings.0.table", "database.table"]),
        ("- {table: shop., namespace: a}", ["bindings.0.table", "database.table"]),
        (
            "- {table: shop.a, namespace: a}\n- {table: shop.a, namespace: b}",
            ["table 'shop.a' is bound twice"],
        ),
        (
            "- {table: shop.a, namespace: a}\n- {table: shop.b, namespace: a}",
            ["namespace 'a' is bound twice"],
        ),
        ("- {table: shop.a, namespace: a, key_columns: []}", ["bindings.0.key_columns", "non-empty"]),
        ("- {table: shop.a, namespace: a, key_columns: [id, id]}", ["bindings.0.key_columns", "distinct"]),
        ("- {table: shop.a, namespace: a, value_columns: []}", ["bindings.0.value_columns", "non-empty"]),
        ("- {table: shop.a, namespace: 'a b'}", ["bindings.0.namespace", "pattern"]),
        ("- {table: shop.a, namespace: 'a{b}'}", ["bindings.0.namespace", "pattern"]),
        ("- {table: shop.a, namespace: 'a:b'}", ["bindings.0.namespace", "pattern"]),
        ("- {table: shop.a, namespace: ''}", ["bindings.0.namespace"]),
        ("- {table: shop.a, namespace: " + "n" * 201 + "}", ["bindings.0.namespace", "200"]),
        ("- {table: shop.a}", ["bindings.0.namespace", "required"]),
        ("[]", ["bindings", "at least 1"]),
        ("bindings: []", ["bindings", "at least 1"]),
        ("", ["invalid bindings"]),
        ("just a string", ["invalid bindings"]),
    ],
)
def test_invalid_bindings_name_the_problem(text: str, words: list[str]) -> None:
    message = error(text)
    for word in words:
        assert word in message


@pytest.mark.parametrize("text", ["{not: [valid", "bindings: [\n  - oops", b'{"bindings": [}'])
def test_unparseable_text(text: str | bytes) -> None:
    assert "not valid YAML/JSON" in error(text)


def test_second_binding_errors_name_its_index() -> None:
    message = error("- {table: shop.a, namespace: a}\n- {table: shop.b, namespace: b, key_column: [id]}")
    assert "bindings.1.key_column" in message


def test_namespace_allows_dots_dashes_underscores() -> None:
    bindings = parse_bindings("- {table: shop.a, namespace: A-z_0.9}")
    assert bindings.bindings[0].namespace == "A-z_0.9"


def test_invalidate_mode_needs_a_version_column() -> None:
    with pytest.raises(BindingError, match="version_column"):
        parse_bindings("bindings:\n  - table: a.b\n    namespace: n\n    on_change: invalidate\n")
    ok = parse_bindings(
        "bindings:\n  - table: a.b\n    namespace: n\n    on_change: invalidate\n    version_column: v\n"
    )
    assert ok.bindings[0].on_change == "invalidate"
