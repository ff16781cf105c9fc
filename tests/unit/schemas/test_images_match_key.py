"""The change envelope's check that both images carry the primary key: the decode reasons (what a dead
letter says) are fixed here, as the check gave them before it was made cheaper per event."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from schemas import DecodeError, decode

BASE: dict[str, Any] = {
    "kind": "change",
    "event_id": "e1",
    "op": "u",
    "key": {"id": 7, "sku": "a"},
    "source": {"server_id": 1, "file": "binlog.000001", "pos": 4, "ts_ms": 1000, "db": "shop", "table": "t"},
    "ts_ms": 1000,
    "version": 5,
    "commit_ts_us": 1000000,
    "commit_ts_coarse": True,
}
PREFIX = "change: Value error, primary key column "
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "before missing id": (
        {"before": {"sku": "a"}, "after": {"id": 7, "sku": "a"}},
        "'id' missing from the before image",
    ),
    "after missing sku": (
        {"before": {"id": 7, "sku": "a"}, "after": {"id": 7}},
        "'sku' missing from the after image",
    ),
    "before differs": (
        {"before": {"id": 8, "sku": "a"}, "after": {"id": 7, "sku": "a"}},
        "'id' is 8 in the before image but 7 in the key",
    ),
    "after differs": (
        {"before": {"id": 7, "sku": "a"}, "after": {"id": 7, "sku": "b"}},
        "'sku' is 'b' in the after image but 'a' in the key",
    ),
    "after null": (
        {"before": {"id": 7, "sku": "a"}, "after": {"id": None, "sku": "a"}},
        "'id' is None in the after image but 7 in the key",
    ),
    "after 7.0 equals 7": ({"before": {"id": 7, "sku": "a"}, "after": {"id": 7.0, "sku": "a"}}, None),
    "after true": (
        {"before": {"id": 7, "sku": "a"}, "after": {"id": True, "sku": "a"}},
        "'id' is True in the after image but 7 in the key",
    ),
    "before checked first": (
        {"before": {"id": 9}, "after": {}},
        "'id' is 9 in the before image but 7 in the key",
    ),
    "valid": ({"before": {"id": 7, "sku": "a", "x": 1}, "after": {"id": 7, "sku": "a"}}, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_key_in_images_reasons(name: str) -> None:
    images, expected = CASES[name]
    data = orjson.dumps({**BASE, **images})
    if expected is None:
        event = decode(data)
        assert event.kind == "change" and event.before == images["before"] and event.after == images["after"]
        return
    with pytest.raises(DecodeError) as caught:
        decode(data)
    assert caught.value.reason == PREFIX + expected
