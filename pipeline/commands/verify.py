"""``freshkey verify``: compare every cache tier with the database; stale vs still in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cache_writer.layout import latest_verification_key
from pipeline.commands import EnvFile
from pipeline.config import AllSettings, load_bindings
from pipeline.verify.judge import Verification, stated_nines

if TYPE_CHECKING:
    from cache_writer.redis.pipeline import RedisClient

console = Console()


def verify(
    env_file: EnvFile = None,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Rows per binding (random); default: all rows.")
    ] = None,
    window_ms: Annotated[
        float, typer.Option("--window-ms", min=0, help="Re-check mismatches after this long (SLA window).")
    ] = 1500.0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the row sample.")] = None,
) -> None:
    """Check L2 (and L3 when configured) against the database, entry by entry.

    A mismatch is read again after --window-ms and is stale only if the entry is still older than the
    row was at the first look (a version column, else the binlog/GTID position read before the rows,
    per FRESHKEY_CONNECTOR_VERSION_SOURCE); anything newer is in flight. Bindings that cannot be
    verified (missing table, no primary key and no key_columns, a column the binding names is absent)
    and keys that cannot be read back are listed as unverifiable, and the others are still checked.

    Exit codes: 0 every binding verified, nothing stale; 1 stale entries found; 3 nothing stale, but
    something could not be verified (see the UNVERIFIABLE lines). Below 10 checked entries no nines are
    stated.
    """
    settings = AllSettings.load(env_file)
    bindings = load_bindings(settings.bindings_path)

    import redis.asyncio as aioredis

    from cache_writer.redis.tier import connect
    from pipeline.verify.run import run_verification

    async def main() -> Verification:
        tiers: list[tuple[str, RedisClient]] = [("redis", connect(settings.redis))]
        if settings.l3.url:
            password = settings.l3.password.get_secret_value() if settings.l3.password else None
            tiers.append(("redis-l3", aioredis.Redis.from_url(settings.l3.url, password=password)))
        try:
            result = await run_verification(
                settings.mysql,
                bindings.bindings,
                tiers,
                prefix=settings.redis.key_prefix,
                window_ms=window_ms,
                sample=sample,
                seed=seed,
                version_source=settings.connector.version_source,
            )
            await tiers[0][1].set(
                latest_verification_key(settings.redis.key_prefix), orjson.dumps(result.to_json())
            )
            return result
        finally:
            for _, client in tiers:
                await client.aclose()

    result = asyncio.run(main())
    table = Table(title=f"freshkey verify (re-check after {window_ms:.0f} ms)")
    for column in ("namespace", "tier", "rows", "checked", "stale", "in flight", "missing", "nines"):
        table.add_column(column, justify="left" if column in ("namespace", "tier") else "right")
    for r in result.reports:
        if r.unverifiable is not None:
            table.add_row(r.namespace, r.tier, *(["-"] * 5), "[yellow]unverifiable[/]")
            continue
        figure = stated_nines(r.checked, r.stale)
        table.add_row(
            r.namespace,
            r.tier,
            str(r.rows),
            str(r.checked),
            f"[{'red' if r.stale else 'green'}]{r.stale}[/]",
            str(r.in_flight),
            str(r.missing),
            "too few" if figure is None else f"{figure:.2f}",
        )
    console.print(table)
    # Lines below are soft-wrapped (never broken) so that they can be searched and copied.
    for r in result.reports:
        if r.unverifiable is None and (r.stale or r.in_flight):
            console.print(
                f"  {r.namespace}/{r.tier}: stale vs in flight by {r.rule}", markup=False, soft_wrap=True
            )
        for example in r.examples if r.unverifiable is None else []:
            console.print(
                f"  {r.namespace}/{r.tier}: {example}", markup=False, highlight=False, soft_wrap=True
            )
    figures = result.to_json()
    console.print(
        f"checked {figures['checked']}, stale {figures['stale']}, in flight {figures['in_flight']}: "
        f"{figures['nines_text']} within {window_ms:.0f} ms",
        markup=False,
        soft_wrap=True,
    )
    for r in result.unverifiable:
        console.print(
            f"[yellow]UNVERIFIABLE[/] {escape(r.namespace)}: {escape(str(r.unverifiable))}", soft_wrap=True
        )
    if result.unverifiable or result.unverifiable_keys:
        console.print(
            f"[yellow]{len(result.unverifiable)} binding(s) and {result.unverifiable_keys} key(s) could not "
            f"be verified[/]: not counted as checked nor as stale (exit {result.exit_code})",
            soft_wrap=True,
        )
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
    if result.exit_code:
        raise typer.Exit(result.exit_code)
