"""``freshkey model ...``: publish model updates, make key-hash weights, sweep old entries.

``publish`` sends one model update to the model-update topic (``FRESHKEY_KAFKA_MODEL_UPDATE_TOPIC``);
the workers check it (newer than the active model of each namespace, known namespaces, the weights'
digest) and cut the namespaces over, or dead-letter it with the reason. The weights file must be
readable by every worker at the path (or ``file://`` URI) given here, or relative to
``FRESHKEY_MODEL_WEIGHTS_DIR``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from connectors.exceptions import ConnectorError
from connectors.kafka.settings import KafkaSettings
from pipeline.commands import EnvFile
from pipeline.config import load_settings
from schemas.model_updates import ModelUpdate

console = Console()
model_app = typer.Typer(
    name="model",
    help="Model updates: publish one, make key-hash weights, sweep entries of old signatures.",
    no_args_is_help=True,
)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]✗[/red] {escape(message)}")
    return typer.Exit(2)


def _read_schema(path: Path) -> dict[str, object]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(f"cannot read the input schema {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise _fail(f"{path} is not JSON or YAML: {exc}") from None
    if not isinstance(data, dict):
        raise _fail(f"{path}: an input schema is a JSON object")
    return data


def build_update(
    *,
    model: str,
    version: str,
    tokenizer: str,
    schema: dict[str, object],
    weights: Path,
    weights_sha256: str | None,
    namespaces: list[str],
    key_bits: int | None,
    weights_ref: str | None = None,
) -> tuple[ModelUpdate, list[str]]:
    """The update to publish and warnings. The digest is the file's unless one is given (a different
    one is published as given: the workers reject it, which is how a wrong digest is tested)."""
    from cache_writer.semantic import KeyHashWeights
    from cache_writer.semantic.exceptions import WeightsError

    warnings: list[str] = []
    try:
        data = weights.read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read the weights {weights}: {exc.strerror}") from None
    actual = hashlib.sha256(data).hexdigest()
    try:
        parsed = KeyHashWeights.from_bytes(data)
    except WeightsError as exc:
        raise _fail(f"{weights} is not a key-hash weights file: {exc}") from None
    digest = (weights_sha256 or actual).lower()
    if digest != actual:
        warnings.append(
            f"--weights-sha256 {digest[:12]}… is not the file's {actual[:12]}…: workers will reject it"
        )
    try:
        update = ModelUpdate(
            model=model,
            model_version=version,
            tokenizer_version=tokenizer,
            input_schema=schema,
            weights_ref=weights_ref or str(weights.resolve()),
            weights_sha256=digest,
            namespaces=tuple(namespaces),
            key_bits=key_bits or parsed.key_bits,  # type: ignore[arg-type]
            ts_ms=int(time.time() * 1000),
        )
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise _fail("invalid model update:\n" + "\n".join(lines)) from None
    return update, warnings


@model_app.command("publish")
def publish(
    model: Annotated[str, typer.Option("--model", help="Model name.")],
    version: Annotated[str, typer.Option("--version", help="Semantic version (MAJOR.MINOR.PATCH[-pre]).")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Tokenizer version.")],
    schema: Annotated[Path, typer.Option("--schema", help="Input schema file (JSON Schema, JSON or YAML).")],
    weights: Annotated[
        Path, typer.Option("--weights", help="Key-hash weights file (freshkey model init-weights).")
    ],
    namespaces: Annotated[list[str], typer.Option("--namespace", help="A namespace it serves (repeatable).")],
    weights_sha256: Annotated[
        str | None, typer.Option("--weights-sha256", help="Digest to announce (default: the file's).")
    ] = None,
    key_bits: Annotated[
        int | None, typer.Option("--key-bits", help="64 or 128 (default: the file's).")
    ] = None,
    weights_ref: Annotated[
        str | None,
        typer.Option(
            "--weights-ref",
            help="Reference the workers resolve (relative: to FRESHKEY_MODEL_WEIGHTS_DIR); "
            "default: the file's absolute path here.",
        ),
    ] = None,
    env_file: EnvFile = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the update here.")] = None,
) -> None:
    """Publish one model update to the model-update topic and wait until Kafka has it."""
    from connectors.kafka.producer import ChangeProducer
    from connectors.kafka.topics import ensure_topics

    kafka = load_settings(KafkaSettings, env_file)
    update, warnings = build_update(
        model=model,
        version=version,
        tokenizer=tokenizer,
        schema=_read_schema(schema),
        weights=weights,
        weights_sha256=weights_sha256,
        namespaces=namespaces,
        key_bits=key_bits,
        weights_ref=weights_ref,
    )
    for warning in warnings:
        console.print(f"[yellow]![/yellow] {escape(str(warning))}")
    try:
        ensure_topics(kafka, [kafka.model_update_topic])
    except ConnectorError as exc:
        raise _fail(str(exc)) from None
    value = update.model_dump_json().encode()
    producer = ChangeProducer(kafka)
    delivered: list[bool] = []
    producer.produce(kafka.model_update_topic, update.model.encode(), value, lambda: delivered.append(True))
    remaining = producer.close(30.0)
    try:
        producer.raise_if_failed()
    except ConnectorError as exc:
        raise _fail(str(exc)) from None
    if remaining or not delivered:
        raise _fail(f"Kafka did not acknowledge the update within 30 s ({kafka.bootstrap})")
    console.print(
        f"[green]✓[/green] published {escape(update.model)} {escape(update.model_version)} for "
        f"{escape(', '.join(update.namespaces))} (weights {update.weights_sha256[:12]}…) "
        f"to {escape(kafka.model_update_topic)}"
    )
    if json_path is not None:
        json_path.write_bytes(value + b"\n")


def _parse_dims(text: str) -> dict[str, int]:
    dims: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if not name or not value.strip().isdigit():
            raise _fail(f"--dims takes modality=dim pairs separated by commas, got {text!r}")
        dims[name.strip()] = int(value)
    return dims


@model_app.command("init-weights")
def init_weights(
    out: Annotated[Path, typer.Option("--out", help="Weights file to write.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random int8 matrices.")],
    dims: Annotated[
        str, typer.Option("--dims", help="Embedding dimension per modality: text=384,image=512,audio=128.")
    ] = "text=384,image=512,audio=128",
    shared_dim: Annotated[int, typer.Option("--shared-dim", help="Shared projection dimension.")] = 256,
    key_bits: Annotated[int, typer.Option("--key-bits", help="64 or 128.")] = 64,
) -> None:
    """Write random key-hash weights (deterministic for a seed and torch version) and print the digest."""
    from cache_writer.semantic import KeyHashWeights
    from cache_writer.semantic.exceptions import WeightsError

    try:
        weights = KeyHashWeights.generate(seed, _parse_dims(dims), shared_dim=shared_dim, key_bits=key_bits)
        digest = weights.save(out)
    except (WeightsError, OSError) as exc:
        raise _fail(str(exc)) from None
    dims = ", ".join(f"{m}={weights.dim(m)}" for m in weights.modalities)
    console.print(f"[green]✓[/green] {escape(str(out))}: {dims}")
    print(digest)


@model_app.command("sweep")
def sweep(
    namespace: Annotated[str, typer.Option("--namespace", help="Namespace to sweep.")],
    env_file: EnvFile = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Keys per SCAN step.")] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only.")] = False,
) -> None:
    """Delete the namespace's entries built under another signature than its active one (SCAN-based,
    safe on a live server: each deletion re-checks the entry in Lua). Tombstones and leases stay."""
    from cache_writer.redis.tier import connect
    from cache_writer.settings import RedisSettings
    from cache_writer.sweep import sweep_namespace

    redis_settings = load_settings(RedisSettings, env_file)

    async def run() -> tuple[int, int]:
        client = connect(redis_settings)
        try:
            return await sweep_namespace(
                client, redis_settings.key_prefix, namespace, batch=batch, dry_run=dry_run
            )
        finally:
            await client.aclose()

    scanned, deleted = asyncio.run(run())
    verb = "would delete" if dry_run else "deleted"
    console.print(
        f"[green]✓[/green] {escape(namespace)}: scanned {scanned:,} keys, {verb} {deleted:,} old-signature "
        "entries"
    )
