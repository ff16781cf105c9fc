"""connectors.binlog.mentioned_databases: a DDL run from another database that names a bound table.

Generous on purpose: a false positive costs the worker a re-signing, a miss leaves stale entries.
"""

from __future__ import annotations

import pytest

from connectors.binlog import mentioned_databases

TABLES = [("shop", "assets"), ("shop", "Orders"), ("media", "clips")]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ALTER TABLE shop.assets ADD COLUMN x INT", {"shop": {"assets"}}),
        ("ALTER TABLE `shop`.`assets` ADD COLUMN x INT", {"shop": {"assets"}}),
        ("alter table SHOP.ASSETS drop column x", {"shop": {"assets"}}),
        ("ALTER TABLE `Shop` . `Assets` ADD x INT", {"shop": {"assets"}}),
        ("ALTER TABLE shop.`assets` ADD x INT", {"shop": {"assets"}}),
        ('ALTER TABLE "shop"."assets" ADD x INT', {"shop": {"assets"}}),
        ("ALTER TABLE `shop.assets` ADD x INT", {"shop": {"assets"}}),
        ("DROP TABLE IF EXISTS shop.orders", {"shop": {"Orders"}}),
        ("RENAME TABLE other.tmp TO shop.assets", {"shop": {"assets"}}),
        ("RENAME TABLE shop.assets TO media.clips", {"shop": {"assets"}, "media": {"clips"}}),
        ("CREATE TABLE other.copy LIKE shop.assets", {"shop": {"assets"}}),
        ("ALTER TABLE shop.assets ADD a INT, shop.orders ADD b INT", {"shop": {"assets", "Orders"}}),
        ("DROP DATABASE shop", {"shop": set()}),
        ("DROP SCHEMA IF EXISTS `media`", {"media": set()}),
        ("ALTER DATABASE shop CHARACTER SET utf8mb4", {"shop": set()}),
        ("TRUNCATE TABLE shop.assets", {"shop": {"assets"}}),
    ],
)
def test_bound_tables_named_anywhere_in_the_statement(query: str, expected: dict[str, set[str]]) -> None:
    assert mentioned_databases(query, TABLES) == expected


@pytest.mark.parametrize(
    "query",
    [
        "ALTER TABLE other.assets ADD x INT",  # same table name, another database
        "ALTER TABLE shop.assets_archive ADD x INT",  # a longer name
        "ALTER TABLE myshop.assets ADD x INT",
        "ALTER TABLE assets ADD x INT",  # unqualified: bound only when run from shop (checked by schema)
        "CREATE DATABASE shopping",
        "ALTER TABLE media.videos ADD x INT",
        "DROP TABLE other.shop",
    ],
)
def test_other_tables_are_not_mentions(query: str) -> None:
    assert mentioned_databases(query, TABLES) == {}


def test_a_bare_database_word_needs_the_database_keyword() -> None:
    assert mentioned_databases("ALTER TABLE t COMMENT 'shop'", TABLES) == {}
    assert mentioned_databases("ALTER TABLE shop ADD x INT", TABLES) == {}
