"""pipeline.plan.plan: from a change event and its binding to versioned cache actions."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cache_writer import CacheAction, entry_key
from pipeline.plan import BindError, commit_time_coarse, commit_time_us, event_version, plan
from schemas import Binding, ChangeEvent

PREFIX = "fk"
VERSION = (3 << 48) | (4711 << 16) | 1
BINLOG_COMMIT_US = 1_700_000_000_000_000
# 2024-01-01T00:00:00Z in µs since the epoch (19723 days * 86400 s).
JAN_1_2024_US = 1_704_067_200_000_000

ROW = {
    "id": 7,
    "sku": "cat/01%",
    "modality": "image",
    "content": "s3://bucket/cat.png",
    "embedding": [0.5, -1.0],
    "updated_at": "2024-01-01 00:00:00.000001",
    "secret": "not cached",
}


def binding(**fields: Any) -> Binding:
    return Binding(table="shop.assets", namespace="assets", **fields)


def event(op: str, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> ChangeEvent:
    return ChangeEvent.model_validate(
        {
            "event_id": "1:binlog.000003:4711:1",
            "op": op,
            "key": {"id": (after or before or {})["id"]},
            "before": before,
            "after": after,
            "source": {
                "server_id": 1,
                "file": "binlog.000003",
                "pos": 4711,
                "row": 1,
                "ts_ms": BINLOG_COMMIT_US // 1000,
                "db": "shop",
                "table": "assets",
            },
            "ts_ms": BINLOG_COMMIT_US // 1000 + 5,
            "version": VERSION,
            "commit_ts_us": BINLOG_COMMIT_US,
            "commit_ts_coarse": True,
        }
    )


def value(**columns: Any) -> bytes:
    return orjson.dumps(columns, option=orjson.OPT_SORT_KEYS)


def test_key_layout() -> None:
    assert entry_key("fk", "assets", [42]) == "fk:{assets}:42"
    assert entry_key("fk", "assets", ["a/b", 1]) == "fk:{assets}:a%2Fb/1"
    assert entry_key("cache", "texts.v2", ["100%"]) == "cache:{texts.v2}:100%25"


@pytest.mark.parametrize("op", ["c", "r"])
def test_insert_is_one_write_with_projected_columns(op: str) -> None:
    b = binding(value_columns=("modality", "content", "embedding"))
    actions = plan(b, event(op, after=ROW), prefix=PREFIX)
    assert actions == [
        CacheAction(
            "write",
            "fk:{assets}:7",
            VERSION,
            BINLOG_COMMIT_US,
            value(modality="image", content="s3://bucket/cat.png", embedding=[0.5, -1.0]),
        )
    ]
    assert b"secret" not in (actions[0].value or b"")


def test_insert_without_value_columns_caches_the_whole_row() -> None:
    actions = plan(binding(), event("c", after=ROW), prefix=PREFIX)
    assert len(actions) == 1
    assert orjson.loads(actions[0].value or b"") == ROW
    assert actions[0].value == value(**ROW)


def test_value_does_not_depend_on_column_order() -> None:
    shuffled = dict(reversed(list(ROW.items())))
    one = plan(binding(), event("c", after=ROW), prefix=PREFIX)
    two = plan(binding(), event("c", after=shuffled), prefix=PREFIX)
    assert one == two


def test_update_is_one_write() -> None:
    before = {**ROW, "content": "s3://bucket/old.png"}
    actions = plan(binding(value_columns=("content",)), event("u", before=before, after=ROW), prefix=PREFIX)
    assert actions == [
        CacheAction("write", "fk:{assets}:7", VERSION, BINLOG_COMMIT_US, value(content="s3://bucket/cat.png"))
    ]


def test_update_changing_binding_key_invalidates_old_key_then_writes_new() -> None:
    b = binding(key_columns=("sku",), value_columns=("modality",))
    before = {**ROW, "sku": "dog/02"}
    actions = plan(b, event("u", before=before, after=ROW), prefix=PREFIX)
    assert actions == [
        CacheAction("invalidate", "fk:{assets}:dog%2F02", VERSION, BINLOG_COMMIT_US),
        CacheAction("write", "fk:{assets}:cat%2F01%25", VERSION, BINLOG_COMMIT_US, value(modality="image")),
    ]


def test_update_of_composite_key_part_invalidates_old_key() -> None:
    b = binding(key_columns=("id", "modality"), value_columns=("content",))
    before = {**ROW, "modality": "text"}
    actions = plan(b, event("u", before=before, after=ROW), prefix=PREFIX)
    assert [(a.kind, a.key) for a in actions] == [
        ("invalidate", "fk:{assets}:7/text"),
        ("write", "fk:{assets}:7/image"),
    ]


def test_delete_invalidates_the_before_image_key() -> None:
    actions = plan(binding(key_columns=("sku",)), event("d", before=ROW), prefix=PREFIX)
    assert actions == [CacheAction("invalidate", "fk:{assets}:cat%2F01%25", VERSION, BINLOG_COMMIT_US)]
    assert actions[0].value is None


def test_default_key_is_the_primary_key() -> None:
    actions = plan(binding(), event("d", before=ROW), prefix="other")
    assert actions == [CacheAction("invalidate", "other:{assets}:7", VERSION, BINLOG_COMMIT_US)]


def test_version_column_datetime_is_epoch_microseconds() -> None:
    b = binding(version_column="updated_at", value_columns=("modality",))
    actions = plan(b, event("c", after=ROW), prefix=PREFIX)
    assert [a.version for a in actions] == [JAN_1_2024_US + 1]


def test_version_column_integer_and_update_uses_after_image() -> None:
    b = binding(version_column="rev", value_columns=("modality",))
    ev = event("u", before={**ROW, "rev": 4}, after={**ROW, "rev": 5})
    assert event_version(b, ev) == 5
    assert [a.version for a in plan(b, ev, prefix=PREFIX)] == [5]


def test_a_delete_is_one_newer_than_the_row_state_it_removes() -> None:
    b = binding(version_column="updated_at")
    row_version = JAN_1_2024_US + 1  # the before image's updated_at
    assert [a.version for a in plan(b, event("d", before=ROW), prefix=PREFIX)] == [row_version + 1]


def test_version_without_version_column_is_the_event_version() -> None:
    assert event_version(binding(), event("c", after=ROW)) == VERSION


def test_commit_time_column_for_inserts_and_updates() -> None:
    b = binding(commit_time_column="updated_at", value_columns=("modality",))
    for ev in (
        event("c", after=ROW),
        event("u", before={**ROW, "updated_at": "2023-01-01 00:00:00"}, after=ROW),
    ):
        assert commit_time_us(b, ev) == (JAN_1_2024_US + 1, False)
        assert [a.commit_ts_us for a in plan(b, ev, prefix=PREFIX)] == [JAN_1_2024_US + 1]


def test_commit_time_of_delete_is_coarse_binlog_time() -> None:
    b = binding(commit_time_column="updated_at")
    ev = event("d", before=ROW)
    assert commit_time_us(b, ev) == (BINLOG_COMMIT_US, True)
    assert [a.commit_ts_us for a in plan(b, ev, prefix=PREFIX)] == [BINLOG_COMMIT_US]


def test_commit_time_without_column_is_the_event_commit_time() -> None:
    assert commit_time_us(binding(), event("c", after=ROW)) == (BINLOG_COMMIT_US, True)


@pytest.mark.parametrize("column", [None, "updated_at"])
@pytest.mark.parametrize("op", ["c", "u", "d"])
@pytest.mark.parametrize("coarse", [True, False])
def test_commit_time_coarse_agrees_with_commit_time_us(column: str | None, op: str, coarse: bool) -> None:
    """The processor reports a change's commit time from its actions and this flag (no second parse):
    the flag is the one commit_time_us gives, and every action carries that commit time."""
    b = binding(commit_time_column=column)
    before = ROW if op in ("u", "d") else None
    after = ROW if op in ("c", "u") else None
    ev = event(op, before=before, after=after).model_copy(update={"commit_ts_coarse": coarse})
    commit_us, expected = commit_time_us(b, ev)
    assert commit_time_coarse(b, ev) is expected
    assert {a.commit_ts_us for a in plan(b, ev, prefix=PREFIX)} == {commit_us}


def test_commit_time_column_aware_datetime() -> None:
    b = binding(commit_time_column="t")
    ev = event("c", after={**ROW, "t": "2024-01-01T01:00:00.5+01:00"})
    assert commit_time_us(b, ev) == (JAN_1_2024_US + 500_000, False)


@pytest.mark.parametrize(
    ("fields", "op", "words"),
    [
        ({"value_columns": ("modality", "missing")}, "c", ["value column", "'missing'", "shop.assets"]),
        ({"key_columns": ("nope",)}, "c", ["key column", "'nope'", "shop.assets"]),
        ({"key_columns": ("nope",)}, "d", ["key column", "'nope'"]),
        ({"version_column": "rev"}, "c", ["version column", "'rev'"]),
        ({"version_column": "rev"}, "d", ["version column", "'rev'"]),
        ({"commit_time_column": "committed"}, "c", ["commit time column", "'committed'"]),
    ],
)
def test_missing_column_is_a_bind_error_naming_it(fields: dict[str, Any], op: str, words: list[str]) -> None:
    ev = event(op, after=ROW) if op == "c" else event(op, before=ROW)
    with pytest.raises(BindError) as info:
        plan(binding(**fields), ev, prefix=PREFIX)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("bad", [None, True, 1.5, [1], {"a": 1}])
def test_unusable_key_value_is_a_bind_error(bad: object) -> None:
    with pytest.raises(BindError, match="'sku'"):
        plan(binding(key_columns=("sku",)), event("c", after={**ROW, "sku": bad}), prefix=PREFIX)


@pytest.mark.parametrize("bad", ["yesterday", -1, True, 1.5, None])
def test_unusable_version_is_a_bind_error(bad: object) -> None:
    with pytest.raises(BindError):
        plan(binding(version_column="rev"), event("c", after={**ROW, "rev": bad}), prefix=PREFIX)


@pytest.mark.parametrize("bad", ["yesterday", 5, None])
def test_unusable_commit_time_is_a_bind_error(bad: object) -> None:
    with pytest.raises(BindError, match="commit time"):
        plan(binding(commit_time_column="t"), event("c", after={**ROW, "t": bad}), prefix=PREFIX)


def test_unencodable_value_is_a_bind_error() -> None:
    with pytest.raises(BindError):
        plan(binding(), event("c", after={**ROW, "big": 2**64}), prefix=PREFIX)
