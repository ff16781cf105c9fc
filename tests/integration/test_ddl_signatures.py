"""A schema change of a bound table moves its namespace's signature, model or not (invariant 7).

Seven rows are cached from a table bound without ``value_columns`` (every column cached) and without a
model. After ``ALTER TABLE`` drops or renames a column, only two rows change again. The five untouched
entries still hold the old columns: before this protection they were served as they were (``freshkey
verify`` found 5 of 7 stale). Now the DDL moves the namespace's signature, so the application's read
script treats them as misses and the verifier finds nothing stale; reading the same entries without the
signature check (the negative control) still finds the 5 old ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from cache_writer.client import CacheClient, Hit, Miss
from cache_writer.layout import signature_key
from connectors.settings import MySQLSettings
from pipeline.verify.run import run_verification
from schemas import parse_bindings
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

ROWS = 7
TOUCHED = (1, 2)


def _mysql(p: Pipeline) -> MySQLSettings:
    return MySQLSettings(
        host=p.mysql.host,
        port=p.mysql.port,
        user=p.mysql.admin_user,
        password=p.mysql.admin_password,  # type: ignore[arg-type]
    )


async def _reads(p: Pipeline) -> dict[int, Hit | Miss]:
    client = aioredis.Redis.from_url(p.redis_url)
    try:
        cache = CacheClient(client, prefix=p.prefix)
        return {row: await cache.get(p.namespace, [row]) for row in range(1, ROWS + 1)}
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("ddl", "update"),
    [
        ("ALTER TABLE assets DROP COLUMN modality", "UPDATE assets SET content='new' WHERE id=%s"),
        ("ALTER TABLE assets RENAME COLUMN content TO body", "UPDATE assets SET body='new' WHERE id=%s"),
    ],
    ids=["drop-column", "rename-column"],
)
def test_ddl_moves_the_signature_of_a_namespace_without_a_model(
    make_pipeline: Callable[..., Pipeline], ddl: str, update: str
) -> None:
    p = make_pipeline(value_columns=False)
    p.start("worker")
    p.start("connector")
    for row in range(1, ROWS + 1):
        p.sql("INSERT INTO assets VALUES (%s, 'text', %s, NULL, NOW(6))", (row, f"old-{row}"))
    p.wait_consistent()
    assert not p.redis.exists(signature_key(p.prefix, p.namespace)), "no signature before any DDL"
    assert all(isinstance(r, Hit) for r in asyncio.run(_reads(p)).values())

    p.sql(ddl)
    # Rows and the DDL travel on different partitions: a change applied before the DDL's signature move
    # carries the old signature and is a miss afterwards (cold, never stale). Change the two rows once
    # the move is done, so that they are hits.
    p.wait(lambda: bool(p.redis.hget(signature_key(p.prefix, p.namespace), "s")), 60, "the signature move")
    for row in TOUCHED:
        p.sql(update, (row,))

    def touched_rows_rewritten() -> bool:
        entries = [p.entry(row) for row in TOUCHED]
        return all(e is not None and e.value is not None and b'"new"' in e.value for e in entries)

    p.wait(touched_rows_rewritten, 60, "the rows changed after the DDL to be cached again")
    fields = p.redis.hgetall(signature_key(p.prefix, p.namespace))
    assert fields.get(b"u", b"") == b"", "a namespace without a model keeps none"

    reads = asyncio.run(_reads(p))
    assert all(isinstance(reads[row], Hit) for row in TOUCHED), reads
    untouched = [row for row in range(1, ROWS + 1) if row not in TOUCHED]
    assert all(isinstance(reads[row], Miss) for row in untouched), "entries of the old columns served"
    for row in TOUCHED:
        hit = reads[row]
        assert isinstance(hit, Hit)
        assert (b"modality" in hit.value) == ("modality" not in ddl)

    binding = parse_bindings(p.bindings_text).bindings[0]

    async def verify() -> tuple[int, int, int]:
        client = aioredis.Redis.from_url(p.redis_url)
        try:
            result = await run_verification(
                _mysql(p), [binding], [("redis", client)], prefix=p.prefix, window_ms=500
            )
        finally:
            await client.aclose()
        report = result.reports[0]
        return report.checked, report.stale, report.missing

    checked, stale, missing = asyncio.run(verify())
    assert (checked, stale, missing) == (len(TOUCHED), 0, len(untouched))

    # Negative control: the same entries judged without their signature are the old, wrong values.
    assert p.verify().stale == len(untouched)
