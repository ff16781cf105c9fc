"""The key layout round trip: every key built by ``cache_writer.layout`` is parsed back to what built it,
whatever the namespace and the key values hold, and no entry key is ever a signature key."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from cache_writer.layout import (
    SIGNATURE_SUFFIX,
    entry_key,
    is_signature_key,
    namespace_of,
    namespace_prefix,
    namespace_prefix_of,
    parse_entry_key,
    row_entry_key,
    row_key_values,
    row_of,
    signature_key,
    signature_key_of,
    split_entry_key,
)
from schemas import row_key

# The characters that could confuse a parser of '<prefix>:{<namespace>}:<row>', and then anything.
TRICKY = "/%{}:$ *?[]\\\n\t.-_é€😀\x00"
texts = st.text(alphabet=st.sampled_from(TRICKY) | st.characters(codec="utf-8"), max_size=12)
namespaces = st.text(alphabet=st.sampled_from(TRICKY) | st.characters(codec="utf-8"), min_size=1, max_size=12)
prefixes = st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True)  # RedisSettings.key_prefix
key_values = st.lists(st.integers() | texts, min_size=1, max_size=4)
SLOW = settings(max_examples=400, deadline=None)


@SLOW
@given(prefixes, namespaces, key_values)
def test_an_entry_key_parses_back_to_its_prefix_namespace_and_values(
    prefix: str, namespace: str, values: list[int | str]
) -> None:
    key = entry_key(prefix, namespace, values)
    parsed = split_entry_key(key)
    assert parsed == (prefix, namespace, row_key(values))
    assert parse_entry_key(key) == parsed and namespace_of(key) == namespace
    assert row_key_values(parsed.row) == [str(v) for v in values]
    assert namespace_prefix_of(key) == namespace_prefix(prefix, namespace) and key.startswith(
        namespace_prefix(prefix, namespace)
    )
    assert signature_key_of(key) == signature_key(prefix, namespace)
    assert row_of(key, prefix, namespace) == parsed.row
    assert row_entry_key(prefix, namespace, parsed.row) == key


@SLOW
@given(prefixes, namespaces, namespaces, key_values)
def test_signature_keys_never_collide_with_entry_keys(
    prefix: str, namespace: str, other: str, values: list[int | str]
) -> None:
    entry = entry_key(prefix, other, values)
    signature = signature_key(prefix, namespace)
    assert entry != signature
    assert not is_signature_key(entry) and is_signature_key(signature)
    assert split_entry_key(signature) == (prefix, namespace, SIGNATURE_SUFFIX)
    assert row_of(signature, prefix, namespace) is None, "a signature key has no row"
    assert SIGNATURE_SUFFIX not in split_entry_key(entry).row


@SLOW
@given(prefixes, namespaces, namespaces, key_values)
def test_a_key_belongs_to_exactly_one_namespace(
    prefix: str, namespace: str, other: str, values: list[int | str]
) -> None:
    assume(namespace != other)
    key = entry_key(prefix, namespace, values)
    assert row_of(key, prefix, other) is None
    assert namespace_prefix_of(key) != namespace_prefix(prefix, other)


@SLOW
@given(prefixes, namespaces, key_values)
def test_entry_and_signature_keys_of_a_namespace_share_one_cluster_slot(
    prefix: str, namespace: str, values: list[int | str]
) -> None:
    # Redis hashes the whole key when the hash tag is empty ('{}'): a namespace starting with '}' would
    # split a namespace over slots. Bindings cannot name one (their pattern is [A-Za-z0-9_.-]+).
    assume(not namespace.startswith("}"))
    entry = entry_key(prefix, namespace, values).encode()
    assert key_slot(entry) == key_slot(signature_key(prefix, namespace).encode())


def test_the_documented_examples() -> None:
    assert entry_key("fk", "assets", [42]) == "fk:{assets}:42"
    assert entry_key("fk", "a", ["x/y", 7]) == "fk:{a}:x%2Fy/7"
    assert signature_key("fk", "assets") == "fk:{assets}:$signature"
    assert entry_key("fk", "assets", ["$signature"]) == "fk:{assets}:%24signature"
    assert split_entry_key("fk:{a:{b}:c}:1%2F2/3") == ("fk", "a:{b}:c", "1%2F2/3")
    assert row_key_values("1%2F2/3") == ["1/2", "3"]


@pytest.mark.parametrize("key", ["plain", "fk:a:1", "fk:{a:1", "fk}:{a", ""])
def test_keys_outside_the_layout_are_refused(key: str) -> None:
    assert parse_entry_key(key) is None and namespace_of(key) is None and namespace_prefix_of(key) == ""
    with pytest.raises(ValueError, match="not a freshkey entry key"):
        split_entry_key(key)
    assert row_of(key, "fk", "a") is None


def test_the_namespace_ends_at_the_last_close_brace_not_the_first() -> None:
    """The negative control: the rule the layout used before (the namespace ends at the first '}:')
    takes a namespace holding '}:' apart wrongly; the last '}:' cannot be in a row part."""
    key = entry_key("fk", "a}:b", [1])

    def first_close(key: str) -> tuple[str, str]:
        end = key.find("}:")
        return key[key.find(":{") + 2 : end], key[end + 2 :]

    assert first_close(key) == ("a", "b}:1"), "the old rule: another namespace, a row that is no row"
    assert split_entry_key(key)[1:] == ("a}:b", "1")
