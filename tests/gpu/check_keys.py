"""The prepared device check of the bulk keying path (issue 9, item 5): bit-exactness of every engine on
the device against the CPU reference, then keys/s at d = 512 per engine. One command, torch alone::

    PYTHONUNBUFFERED=1 python3 tests/gpu/check_keys.py --json $OUT/keys.json

(on the device tool: ``run`` with that command, nothing carried, ``timeout_s`` 420; it takes about two
minutes there. ``--device cpu --quick`` runs the same checks on a CPU, which is how it is tested here.)

Only torch is needed: the package ``__init__`` files of ``cache_writer`` and ``schemas`` import Redis,
pydantic and the rest of the pipeline, so this script registers those two packages (and
``cache_writer.semantic``) as bare namespaces and loads only the modules keys are made of (``bulk``,
``ushash``, ``weights``, ``exceptions``, ``schemas.errors``, ``schemas.signature``); it prints the
third-party modules it ended up with to show it.

Checks (exit status 1 on any failure, with what differed):

- for 64- and 128-bit keys, dims 512, 384, 100 (not a multiple of 8) and 96, float32, float16 and
  bfloat16 inputs, on the host and already on the device: the words of each engine (``int8``,
  ``float64``) on the device equal the CPU reference (``ushash.quantize`` + ``sign_bits``, float64) bit
  for bit on awkward rows (ties, +-128 alone and together, subnormal, tiny, huge, zero rows, rows on
  a prototype's hyperplane) at batch sizes 1, 16, 17, 1,000, 4,096 and 65,539 (across a device chunk);
- the engine's self-check passed (``USHash.bulk`` is not None): otherwise the keys would still be right,
  from the reference path, and the figures below would measure the wrong thing;
- ``SemanticKeyer.keys`` (Python ints) on the device equals the CPU's.

Figures: median keys/s of 5 timed runs (CUDA-synchronized) per engine, key size, input dtype and batch
size at d = 512 with the embeddings already on the device and the words left there; the int8 engine at
several device chunk sizes; the host-to-words path and the Python-int path at 4,096 for scale. Target:
>= 200 M keys/s on an H200 (memory-bound limit ~ 2 G/s: 2 KiB of float32 per row at ~4.3 TB/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
BARE_PACKAGES = ("cache_writer", "cache_writer.semantic", "schemas")
DIMS = {"d512": 512, "d384": 384, "d100": 100, "d96": 96}
SHARED_DIM = 256
SIZES = (1, 16, 17, 1000, 4096, 65539)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENGINES = ("int8", "float64")


def load_semantic() -> dict[str, Any]:
    """The semantic modules, loaded without the package ``__init__`` files (module docstring)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    before = set(sys.modules)
    for name in BARE_PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(ROOT.joinpath(*name.split(".")))]
            sys.modules[name] = package
    from cache_writer.semantic import bulk, keys, ushash, weights

    loaded = {name.split(".")[0] for name in set(sys.modules) - before}
    third_party = sorted(
        name
        for name in loaded
        if name not in sys.stdlib_module_names and not name.startswith("_") and name not in BARE_PACKAGES
    )
    third_party = [name for name in third_party if name not in ("cache_writer", "schemas")]
    return {"bulk": bulk, "keys": keys, "ushash": ushash, "weights": weights, "third_party": third_party}


def awkward_rows(mods: dict[str, Any], weights: Any, modality: str, size: int) -> torch.Tensor:
    """``size`` float32 rows: the bulk path's probes and rows on prototype hyperplanes among random ones."""
    dim = weights.dim(modality)
    fused = mods["ushash"].fused_matrix(weights, modality).t()  # (key_bits, dim), exact integers
    g = torch.Generator().manual_seed(dim + size)
    planes = []
    for bit in range(4):
        row = fused[bit]
        x = torch.randn(64, dim, generator=g, dtype=torch.float64)
        planes.append(x - (x @ row)[:, None] * row[None, :] / (row @ row))
    special = torch.cat([mods["bulk"].probe_embeddings(dim, seed=s) for s in range(4)] + planes).float()
    pool = torch.randn(size, dim, generator=g)
    count = min(size, len(special))
    pool[torch.randperm(size, generator=g)[:count]] = special[
        torch.randperm(len(special), generator=g)[:count]
    ]
    return pool


def check(mods: dict[str, Any], device: torch.device, quick: bool) -> list[str]:
    """Every exactness check of the module docstring; the failures, described."""
    ushash, bulk = mods["ushash"], mods["bulk"]
    failures: list[str] = []
    sizes = SIZES[:-1] if quick else SIZES
    for key_bits in (64, 128):
        weights = mods["weights"].KeyHashWeights.generate(5, DIMS, shared_dim=SHARED_DIM, key_bits=key_bits)
        cpu = ushash.USHash(weights, "cpu", "float64")
        hashers = {engine: ushash.USHash(weights, device, engine) for engine in ENGINES}
        for modality in DIMS:
            for engine, hasher in hashers.items():
                if hasher.bulk(modality) is None:
                    failures.append(f"{engine} {key_bits}-bit {modality}: self-check failed on {device}")
            for size in sizes:
                rows = awkward_rows(mods, weights, modality, size)
                for dtype_name, dtype in DTYPES.items():
                    x = rows.to(dtype)
                    x = x[torch.isfinite(x).all(dim=1)]
                    expected = bulk.reference_words(x, cpu.fused(modality))
                    for engine, hasher in hashers.items():
                        for where, batch in (("host", x), ("device", x.to(device))):
                            got = hasher.words(modality, batch).view(torch.int64).cpu()
                            if not torch.equal(got, expected):
                                bad = int((got != expected).any(dim=1).sum())
                                what = f"{engine} {key_bits}-bit {modality} {dtype_name} n={len(x)}"
                                failures.append(
                                    f"{what} from {where}: {bad} rows differ from the CPU reference"
                                )
        keyer = mods["keys"].SemanticKeyer(weights, device)
        host = mods["keys"].SemanticKeyer(weights, "cpu", "float64")
        x = awkward_rows(mods, weights, "d512", 3000)
        if keyer.keys("d512", x) != host.keys("d512", x):
            failures.append(f"{key_bits}-bit SemanticKeyer.keys on {device} differ from the CPU's")
        if host.keys("d512", x) != ushash.pack_bits(cpu.bits("d512", x)):
            failures.append(f"{key_bits}-bit SemanticKeyer.keys on the CPU differ from the reference bits")
    return failures


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], object], device: torch.device, keys: int, repeats: int) -> dict[str, float]:
    run()  # warm-up
    seconds = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        seconds.append(time.perf_counter() - start)
    return {
        "median_keys_per_s": keys / statistics.median(seconds),
        "min_keys_per_s": keys / max(seconds),
        "max_keys_per_s": keys / min(seconds),
    }


def round_trip(keyer: Any, host: torch.Tensor) -> torch.Tensor:
    """Embeddings from the host, words back on the host: what a prewarm that writes to Redis pays."""
    words: torch.Tensor = keyer.words("text", host)
    return words.cpu()


def bench(mods: dict[str, Any], device: torch.device, quick: bool, repeats: int) -> list[dict[str, Any]]:
    """Keys/s at d = 512 (module docstring)."""
    ushash = mods["ushash"]
    big = 1 << (14 if quick else 20)
    sizes = (4096, 1 << 16, big) if not quick else (4096, big)
    rows: list[dict[str, Any]] = []

    def add(figure: dict[str, float], **what: Any) -> None:
        rows.append({**what, **figure})
        print(
            "  ".join(f"{k}={v}" for k, v in what.items()),
            f"median {figure['median_keys_per_s'] / 1e6:,.3f} M keys/s "
            f"(min {figure['min_keys_per_s'] / 1e6:,.3f}, max {figure['max_keys_per_s'] / 1e6:,.3f})",
            flush=True,
        )

    g = torch.Generator().manual_seed(1)
    data = torch.randn(big, 512, generator=g).to(device)
    for key_bits in (64, 128):
        weights = mods["weights"].KeyHashWeights.generate(
            0, {"text": 512}, shared_dim=SHARED_DIM, key_bits=key_bits
        )
        for engine in ENGINES:
            hasher = ushash.USHash(weights, device, engine)
            if hasher.bulk("text") is None:
                continue  # reported by check(): the reference path would be measured
            for dtype_name in ("float32", "float16"):
                source = data.to(DTYPES[dtype_name])
                for size in sizes:
                    batch = source[:size]
                    add(
                        timed(partial(hasher.words, "text", batch), device, size, repeats),
                        path="words",
                        engine=engine,
                        key_bits=key_bits,
                        dtype=dtype_name,
                        batch=size,
                    )
        if key_bits == 64 and device.type == "cuda":
            hasher = ushash.USHash(weights, device, "int8")
            bulk = hasher.bulk("text")
            if bulk is not None:
                default = bulk.chunk_rows
                for chunk in (1 << 14, 1 << 16, 1 << 18, 1 << 20):
                    bulk.chunk_rows = chunk
                    add(
                        timed(partial(bulk.words, data), device, big, repeats),
                        path="words, chunk rows",
                        engine="int8",
                        key_bits=64,
                        dtype="float32",
                        batch=big,
                        chunk_rows=chunk,
                    )
                bulk.chunk_rows = default
            host = data[:4096].cpu()
            keyer = mods["keys"].SemanticKeyer(weights, device)
            add(
                timed(partial(round_trip, keyer, host), device, 4096, repeats),
                path="host -> words -> host",
                engine=keyer.engine,
                key_bits=64,
                dtype="float32",
                batch=4096,
            )
            add(
                timed(partial(keyer.keys, "text", data[:4096]), device, 4096, repeats),
                path="Python ints",
                engine=keyer.engine,
                key_bits=64,
                dtype="float32",
                batch=4096,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="smaller batches: a smoke run on a CPU")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    mods = load_semantic()
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "third_party_modules": mods["third_party"],
    }
    print(f"torch {report['torch']} on {report['device']} (CUDA {report['cuda']})", flush=True)
    loaded = ", ".join(mods["third_party"]) or "none"
    print(f"third-party modules loaded with the semantic ones, besides torch: {loaded}", flush=True)
    start = time.perf_counter()
    failures = check(mods, device, args.quick)
    report["check_seconds"] = time.perf_counter() - start
    report["failures"] = failures
    print(f"exactness: {len(failures)} failures in {report['check_seconds']:.1f} s", flush=True)
    for failure in failures:
        print(f"  FAIL {failure}", flush=True)
    report["bench"] = bench(mods, device, args.quick, args.repeats)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
