"""The measuring code of ``freshkey bench keys``: semantic keys/s by batch size and the rekeying of a cutover.

See :mod:`pipeline.commands.bench` for what the figures mean. torch is imported inside each function, so
importing this module (and the command line) costs no torch.
"""

from __future__ import annotations

import hashlib
import statistics
import struct
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import torch

    from cache_writer.semantic import SemanticKeyer


def devices(choice: str) -> list[torch.device]:
    """The devices to measure: ``auto`` is the CPU, and CUDA too when present; else the one named."""
    import torch

    from cache_writer.semantic.keys import resolve_device

    if choice.strip().lower() == "auto":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    return [resolve_device(choice)]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer started after it measures only what follows."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(
    keyer: SemanticKeyer, size: int, dim: int, repeats: int, keys_per_run: int, seed: int
) -> dict[str, Any]:
    """Keys/s of ``keyer`` at batch ``size``: the median of ``repeats`` runs of at least ``keys_per_run``
    keys each."""
    import torch

    generator = torch.Generator().manual_seed(seed + size)
    batch = torch.randn(size, dim, generator=generator)
    calls = max(1, -(-keys_per_run // size))
    seconds: list[float] = []
    for _ in range(repeats):
        sync(keyer.device)
        start = time.perf_counter()
        for _ in range(calls):
            keyer.keys("text", batch)  # returns Python ints: the device work is finished
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {
        "device": keyer.device.type,
        "batch_size": size,
        "calls_per_run": calls,
        "repeats": repeats,
        "median_keys_per_s": size * calls / median,
        "median_ms_per_batch": median / calls * 1000,
    }


def rekey(
    keyer: SemanticKeyer, label: str, entries: int, batch_size: int, dim: int, seed: int
) -> dict[str, Any]:
    """Compute the keys of ``entries`` random embeddings in batches, as a cutover or a prewarm would,
    timing the keying apart from generating the embeddings; the SHA-256 of the keys shows they are
    bit-identical across devices."""
    import torch

    from cache_writer.semantic.keys import key_words

    generator = torch.Generator().manual_seed(seed + 1)
    digest = hashlib.sha256()
    keyed = 0
    seconds = 0.0
    words = keyer.key_bits // 64
    wall_start = time.perf_counter()
    while keyed < entries:
        n = min(batch_size, entries - keyed)
        batch = torch.randn(n, dim, generator=generator)
        start = time.perf_counter()
        keys = keyer.keys("text", batch)
        seconds += time.perf_counter() - start
        digest.update(
            struct.pack(
                f"<{n * words}Q", *(key_word for key in keys for key_word in key_words(key, keyer.key_bits))
            )
        )
        keyed += len(keys)
    return {
        "device": keyer.device.type,
        "what": label,
        "entries": keyed,
        "batch_size": batch_size,
        "seconds": seconds,
        "wall_seconds": time.perf_counter() - wall_start,
        "keys_per_s": keyed / seconds if seconds else float("inf"),
        "keys_sha256": digest.hexdigest(),
    }


def render(report: dict[str, Any], console: Console) -> None:
    """Print the throughput and the rekeying tables of ``report`` on ``console``."""
    title = (
        f"semantic keys: dim {report['dim']} -> {report['shared_dim']} -> {report['key_bits']} bits, "
        f"torch {report['torch']}, {report['cpu_threads']} CPU threads"
    )
    table = Table(title=title)
    for column in ("device", "batch", "keys/s (median)", "ms/batch (median)", "runs x calls"):
        table.add_column(column, justify="right")
    for row in report["throughput"]:
        table.add_row(
            row["device"],
            f"{row['batch_size']:,}",
            f"{row['median_keys_per_s']:,.0f}",
            f"{row['median_ms_per_batch']:.3f}",
            f"{row['repeats']} x {row['calls_per_run']}",
        )
    console.print(table)
    batches = sorted({row["batch_size"] for row in report["cutover"]})
    rekey = Table(
        title=f"rekeying in batches of {', '.join(f'{b:,}' for b in batches)}: every key computed "
        "(keying s: keys only; wall s: with generating the embeddings)"
    )
    for column in ("device", "what", "entries", "keying s", "keys/s", "wall s", "keys sha256"):
        rekey.add_column(column, justify="right")
    for row in report["cutover"]:
        rekey.add_row(
            row["device"],
            row["what"],
            f"{row['entries']:,}",
            f"{row['seconds']:.2f}",
            f"{row['keys_per_s']:,.0f}",
            f"{row['wall_seconds']:.2f}",
            row["keys_sha256"][:12],
        )
    console.print(rekey)
