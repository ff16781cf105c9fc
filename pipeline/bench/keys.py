"""The measuring code of ``freshkey bench keys``: semantic keys/s by batch size (the bulk path with each
engine beside the Python-int and the reference paths) and the rekeying of a cutover.

See :mod:`pipeline.commands.bench` for what the figures mean. torch is imported inside each function, so
importing this module (and the command line) costs no torch.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
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


PATHS = ("words int8", "words float64", "ints", "reference")
"""What :func:`throughput` times: the bulk path (``SemanticKeyer.words``: a uint64 tensor, no Python int
per key) with each engine, ``SemanticKeyer.keys`` (the words, then one Python int per key, with the
keyer's engine) and the reference path the bulk path is checked against (``USHash.bits`` then
``pack_bits``: float64 quantize and GEMM, Python ints; what ``keys`` computed before the bulk path).
On a CPU, ``words`` keys batches of fewer than 128 rows with the reference path (faster there)."""


def throughput(
    keyer: SemanticKeyer, size: int, dim: int, repeats: int, keys_per_run: int, seed: int
) -> dict[str, Any]:
    """Keys/s at batch ``size`` of each of :data:`PATHS`: the median of ``repeats`` runs of at least
    ``keys_per_run`` keys each, the paths taking turns within each repeat (side by side, so that a
    noisy host slows them alike). ``median_keys_per_s`` is the bulk path with the keyer's engine."""
    import torch

    from cache_writer.semantic import SemanticKeyer
    from cache_writer.semantic.ushash import USHash, pack_bits

    generator = torch.Generator().manual_seed(seed + size)
    batch = torch.randn(size, dim, generator=generator)
    calls = max(1, -(-keys_per_run // size))
    engines = {
        "int8": keyer if keyer.engine == "int8" else SemanticKeyer(keyer.weights, keyer.device, "int8"),
        "float64": keyer
        if keyer.engine == "float64"
        else SemanticKeyer(keyer.weights, keyer.device, "float64"),
    }
    reference = USHash(keyer.weights, keyer.device)
    runs: dict[str, Callable[[], object]] = {
        # words stay on the device: sync() after the calls waits for them
        "words int8": lambda: engines["int8"].words("text", batch),
        "words float64": lambda: engines["float64"].words("text", batch),
        "ints": lambda: keyer.keys("text", batch),
        "reference": lambda: pack_bits(reference.bits("text", batch)),
    }
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    for run in runs.values():  # warm-up: fused matrices, self-checks, kernels, allocator
        run()
    for _ in range(repeats):
        for path, run in runs.items():
            sync(keyer.device)
            start = time.perf_counter()
            for _ in range(calls):
                run()
            sync(keyer.device)
            seconds[path].append(time.perf_counter() - start)
    paths = {
        path: {
            "median_keys_per_s": size * calls / statistics.median(times),
            "min_keys_per_s": size * calls / max(times),
            "max_keys_per_s": size * calls / min(times),
            "median_ms_per_batch": statistics.median(times) / calls * 1000,
        }
        for path, times in seconds.items()
    }
    words = paths[f"words {keyer.engine}"]
    return {
        "device": keyer.device.type,
        "engine": keyer.engine,
        "batch_size": size,
        "calls_per_run": calls,
        "repeats": repeats,
        "median_keys_per_s": words["median_keys_per_s"],
        "median_ms_per_batch": words["median_ms_per_batch"],
        "paths": paths,
    }


def rekey(
    keyer: SemanticKeyer, label: str, entries: int, batch_size: int, dim: int, seed: int
) -> dict[str, Any]:
    """Compute the keys of ``entries`` random embeddings in batches on the bulk path (``words``), as a
    cutover or a prewarm would, timing the keying (and the words' copy to the host) apart from generating
    the embeddings; the SHA-256 of the keys (little-endian unsigned 64-bit words, word 0 the low one)
    shows they are bit-identical across devices."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    digest = hashlib.sha256()
    keyed = 0
    seconds = 0.0
    wall_start = time.perf_counter()
    while keyed < entries:
        n = min(batch_size, entries - keyed)
        batch = torch.randn(n, dim, generator=generator)
        start = time.perf_counter()
        words = keyer.words("text", batch).view(torch.int64).cpu()  # the copy waits for the device
        seconds += time.perf_counter() - start
        digest.update(words.numpy().astype("<i8").tobytes())
        keyed += len(words)
    return {
        "device": keyer.device.type,
        "engine": keyer.engine,
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
    title += (
        "; keys/s (median) by path: words with the int8 and the float64 engine, Python ints, reference; "
        "then the keyer's words over ints and over the reference"
    )
    table = Table(title=title)
    columns = ["device", "engine", "batch", "int8", "float64", "ints", "ref", "÷ ints", "÷ ref", "runs"]
    for column in columns:
        table.add_column(column, justify="right")
    for row in report["throughput"]:
        paths = row["paths"]
        words = paths[f"words {row['engine']}"]["median_keys_per_s"]
        table.add_row(
            row["device"],
            row["engine"],
            f"{row['batch_size']:,}",
            *(f"{paths[path]['median_keys_per_s']:,.0f}" for path in PATHS),
            f"{words / paths['ints']['median_keys_per_s']:.2f}x",
            f"{words / paths['reference']['median_keys_per_s']:.2f}x",
            f"{row['repeats']}x{row['calls_per_run']}",
        )
    console.print(table)
    batches = sorted({row["batch_size"] for row in report["cutover"]})
    rekey = Table(
        title=f"rekeying in batches of {', '.join(f'{b:,}' for b in batches)} on the bulk path (words): "
        "every key computed (keying s: keys only; wall s: with generating the embeddings)"
    )
    for column in ("device", "engine", "what", "entries", "keying s", "keys/s", "wall s", "keys sha256"):
        rekey.add_column(column, justify="right")
    for row in report["cutover"]:
        rekey.add_row(
            row["device"],
            row["engine"],
            row["what"],
            f"{row['entries']:,}",
            f"{row['seconds']:.2f}",
            f"{row['keys_per_s']:,.0f}",
            f"{row['wall_seconds']:.2f}",
            row["keys_sha256"][:12],
        )
    console.print(rekey)
