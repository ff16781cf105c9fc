"""The Redis part of ``freshkey bench``: cut a namespace of N entries over on a real Redis.

See ``pipeline.commands.bench``. The worker's own code runs (``Cutovers.cutover``); only the row source
is an in-memory loader, so the figures are Redis, keying and Python, not a database.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
import torch
from rich.console import Console
from rich.table import Table

from cache_writer import RedisTier
from cache_writer.client import CacheClient, Hit
from cache_writer.layout import entry_key, invalidation_channel, signature_key
from cache_writer.semantic import KeyHashWeights, SemanticKeyer, format_key
from cache_writer.signatures import SignatureRecord, set_signature
from connectors.settings import MySQLSettings
from pipeline.cutover import Cutovers
from pipeline.embedded import LocalRedis
from pipeline.loaders import Loaders, RowLoader
from pipeline.models import ModelRegistry
from pipeline.settings import ModelSettings
from schemas import Binding, Bindings, encode_value
from schemas.model_updates import ModelUpdate, signature_order

PREFIX = "bench"
NAMESPACE = "bench"
LOAD_CHUNK = 20_000
SAMPLE_OLD = 1_000
_MIX = 0x9E3779B97F4A7C15  # odd: i -> i * _MIX mod 2**64 is a bijection, so the cold keys are distinct


class MemoryLoaders(Loaders):
    """Rows from a mapping of row key -> row: a cutover without a database."""

    def __init__(self, rows: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__(MySQLSettings())
        self.rows = rows

    def for_binding(self, binding: Binding) -> RowLoader:
        def load(
            binding: Binding, key_columns: Sequence[str], keys: Sequence[Sequence[str]]
        ) -> Iterable[Mapping[str, Any]]:
            return [self.rows[key[0]] for key in keys if key[0] in self.rows]

        return load


def _update(version: str, weights: KeyHashWeights) -> ModelUpdate:
    return ModelUpdate(
        model="bench",
        model_version=version,
        tokenizer_version="bench-tok",
        input_schema={"type": "object", "properties": {"embedding": {"type": "string"}}},
        weights_ref="/dev/null",
        weights_sha256=weights.sha256,
        namespaces=(NAMESPACE,),
        key_bits=weights.key_bits,  # type: ignore[arg-type]
        ts_ms=int(time.time() * 1000),
    )


def redis_cutover(
    *,
    entries: int,
    hot: int,
    dim: int,
    shared_dim: int,
    key_bits: int,
    seed: int,
    device: str,
    redis_url: str | None,
    progress: Console,
) -> dict[str, Any]:
    """Load ``entries`` entries, cut over with a prewarm of the ``hot`` hottest; returns the figures."""
    server = None
    if redis_url is None:
        server = LocalRedis()
        server.start()
        redis_url = server.url
    try:
        return asyncio.run(_run(entries, hot, dim, shared_dim, key_bits, seed, device, redis_url, progress))
    finally:
        if server is not None:
            server.stop()


async def _run(
    entries: int,
    hot: int,
    dim: int,
    shared_dim: int,
    key_bits: int,
    seed: int,
    device: str,
    redis_url: str,
    progress: Console,
) -> dict[str, Any]:
    weights1 = KeyHashWeights.generate(seed + 101, {"text": dim}, shared_dim=shared_dim, key_bits=key_bits)
    weights2 = KeyHashWeights.generate(seed + 102, {"text": dim}, shared_dim=shared_dim, key_bits=key_bits)
    update1, update2 = _update("1.0.0", weights1), _update("2.0.0", weights2)
    binding = Binding(
        table="bench.items",
        namespace=NAMESPACE,
        key_columns=("id",),
        value_columns=("id", "embedding"),
        semantic={"modality": "text", "embedding_column": "embedding"},
    )
    columns = binding.value_columns or ()
    generator = torch.Generator().manual_seed(seed + 7)
    vectors = torch.randn(hot, dim, generator=generator)
    rows = {
        str(i): {"id": i, "embedding": base64.b64encode(vectors[i].numpy().tobytes()).decode()}
        for i in range(hot)
    }
    hot_keys = [
        entry_key(PREFIX, NAMESPACE, [format_key(k, key_bits)])
        for k in SemanticKeyer(weights1, device).keys("text", vectors)
    ]
    mask = (1 << key_bits) - 1

    def old_key(i: int) -> str:
        if i < hot:
            return hot_keys[i]
        return entry_key(PREFIX, NAMESPACE, [format_key((i * _MIX + seed) & mask, key_bits)])

    sync = redis.Redis.from_url(redis_url)
    client = aioredis.Redis.from_url(redis_url)
    tier = RedisTier(client, tombstone_ttl_ms=86_400_000, channel=invalidation_channel(PREFIX))
    try:
        if sync.dbsize():
            raise RuntimeError(f"{redis_url} is not empty: the bench needs a scratch Redis")
        await tier.load_scripts()
        s1 = update1.signature(columns)
        old = SignatureRecord(
            s1, signature_order(update1.semver), update1.model_dump_json().encode(), columns
        )
        await set_signature(client, PREFIX, NAMESPACE, old)

        # -- load: pipelined HSETs, one entry per row, built under model 1 --------------------------
        progress.print(f"loading {entries:,} entries into {redis_url} ...")
        now_us = str(int(time.time() * 1_000_000))
        load_started = time.perf_counter()
        for start in range(0, entries, LOAD_CHUNK):
            pipe = sync.pipeline(transaction=False)
            for i in range(start, min(start + LOAD_CHUNK, entries)):
                value = rows[str(i)] if i < hot else {"id": i, "embedding": ""}
                pipe.execute_command(  # type: ignore[no-untyped-call]
                    "HSET", old_key(i), "v", 1000 + i, "d", encode_value(value), "c", now_us, "s", s1, "k", i
                )
            pipe.execute()
        load_s = time.perf_counter() - load_started
        info = sync.info("memory")
        loaded = int(sync.dbsize())

        # -- the cutover: the worker's code, prewarm-then-switch ------------------------------------
        registry = ModelRegistry(Bindings(bindings=(binding,)), prefix=PREFIX, device=device)

        async def no_columns(_: Binding) -> tuple[str, ...]:
            raise AssertionError("the bench binding has value_columns")

        async def key_columns(_: Binding) -> tuple[str, ...]:
            return ("id",)

        cutovers = Cutovers(
            Bindings(bindings=(binding,)),
            registry,
            prefix=PREFIX,
            settings=ModelSettings(cutover="prewarm-then-switch", prewarm_top_n=hot, prewarm_batch=1000),
            columns_of=no_columns,
            key_columns_of=key_columns,
            loaders=MemoryLoaders(rows),
        )
        cutovers.tiers[:] = [tier]
        started = time.perf_counter()
        ping_started = time.perf_counter()
        await client.ping()
        ping_ms = (time.perf_counter() - ping_started) * 1000
        started = time.perf_counter()
        report = await cutovers.cutover(NAMESPACE, update2, weights2, hot_keys)
        total_s = time.perf_counter() - started

        # -- checks: no sampled old entry is served; every hot entry is, under the new signature -----
        reader = CacheClient(client, prefix=PREFIX)
        base = f"{PREFIX}:{{{NAMESPACE}}}:"
        step = max(entries // SAMPLE_OLD, 1)
        sample = [old_key(i) for i in range(0, entries, step)][:SAMPLE_OLD]
        served_old = 0
        for key in sample:
            if isinstance(await reader.get(NAMESPACE, [key[len(base) :]]), Hit):
                served_old += 1
        new_keys = [
            entry_key(PREFIX, NAMESPACE, [format_key(k, key_bits)])
            for k in SemanticKeyer(weights2, device).keys("text", vectors)
        ]
        present = 0
        for key in new_keys:
            result = await reader.get(NAMESPACE, [key[len(base) :]])
            if isinstance(result, Hit) and result.signature == report.signature:
                present += 1
        active: bytes | None = await client.hget(signature_key(PREFIX, NAMESPACE), "s")  # type: ignore[assignment]
    finally:
        await tier.close()
        sync.close()
    return {
        "entries": loaded - 1,  # the signature key
        "load_seconds": load_s,
        "load_entries_per_s": entries / load_s if load_s else float("inf"),
        "used_memory_mb": int(info["used_memory"]) / 2**20,
        "device": device,
        "mode": report.mode,
        "switch_ms": report.switch_ms,
        "ping_ms": ping_ms,
        "prewarm_hot": report.prewarm.hot,
        "prewarm_written": report.prewarm.written,
        "prewarm_seconds": report.prewarm.seconds,
        "prewarm_entries_per_s": report.prewarm.written / report.prewarm.seconds
        if report.prewarm.seconds
        else float("inf"),
        "cutover_total_seconds": total_s,
        "old_sampled": len(sample),
        "old_served": served_old,
        "hot_present": present,
        "active_is_new": active is not None and active.decode() == report.signature,
    }


def print_redis_cutover(figures: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"cutover on Redis: {figures['entries']:,} entries "
        f"({figures['used_memory_mb']:,.0f} MiB, loaded in {figures['load_seconds']:.1f} s), "
        f"{figures['mode']}, keys on {figures['device']}"
    )
    for column in ("step", "figure"):
        table.add_column(column, justify="right")
    table.add_row(
        "switch (one signature write)", f"{figures['switch_ms']:.3f} ms (PING {figures['ping_ms']:.3f} ms)"
    )
    table.add_row(
        f"prewarm top {figures['prewarm_hot']:,}",
        f"{figures['prewarm_seconds']:.2f} s, {figures['prewarm_written']:,} written "
        f"({figures['prewarm_entries_per_s']:,.0f}/s: read back, keyed, written)",
    )
    table.add_row("whole cutover (pending + prewarm + switch)", f"{figures['cutover_total_seconds']:.2f} s")
    table.add_row(
        "check",
        f"old entries served: {figures['old_served']}/{figures['old_sampled']} sampled; "
        f"hot present under the new signature: {figures['hot_present']:,}/{figures['prewarm_hot']:,}",
    )
    console.print(table)
