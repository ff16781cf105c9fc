"""Model updates end to end on real services: ``freshkey model publish`` -> Kafka -> worker checks ->
cutover (prewarm of the hot set, one signature write) -> no old-signature entry served by any tier;
semantic keys in the change path; DDL changing the signature; rejects with their reason."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from confluent_kafka import Producer

from cache_writer.client import CacheClient, Hit, Miss
from cache_writer.entries import parse_entry
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import InvalidationListener, L1Cache
from cache_writer.layout import entry_key, invalidation_channel, signature_key
from cache_writer.semantic import HashingTextEmbedder, KeyHashWeights, SemanticKeyer, format_key
from connectors.settings import MySQLSettings
from pipeline.verify.judge import VerifyReport
from pipeline.verify.run import run_verification
from schemas import parse_bindings
from tests.support.kafka import read_topic
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SEMANTIC = "    semantic: {modality: text, text_column: content}\n"
DIMS = {"text": 64, "image": 16}


def cli(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], env=p.env, capture_output=True, text=True, timeout=120
    )


def publish(
    p: Pipeline, version: str, weights: Path, *, namespace: str | None = None, sha: str | None = None
) -> None:
    schema = p.workdir / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    args = ["model", "publish", "--model", "minilm", "--version", version, "--tokenizer", "tok-1"]
    args += ["--schema", str(schema), "--weights", str(weights), "--namespace", namespace or p.namespace]
    if sha:
        args += ["--weights-sha256", sha]
    done = cli(p, *args)
    assert done.returncode == 0, done.stdout + done.stderr


def make_weights(p: Pipeline, seed: int) -> tuple[Path, KeyHashWeights]:
    path = p.workdir / f"weights-{seed}.fkw"
    weights = KeyHashWeights.generate(seed, DIMS, shared_dim=32)
    weights.save(path)
    return path, weights


def semantic_key(p: Pipeline, weights: KeyHashWeights, content: str) -> str:
    key = SemanticKeyer(weights, "cpu").keys(
        "text", HashingTextEmbedder(weights.dim("text")).embed([content])
    )
    return entry_key(p.prefix, p.namespace, [format_key(key[0])])


def page(p: Pipeline, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}{path}", timeout=5) as response:
        return json.loads(response.read())


def cutovers(p: Pipeline) -> list[dict[str, Any]]:
    try:
        return list(page(p, "/freshkey/cutovers"))
    except OSError:
        return []


def wait_cutover(p: Pipeline, count: int, timeout: float = 90) -> dict[str, Any]:
    p.wait(lambda: len(cutovers(p)) >= count, timeout, f"cutover #{count}")
    return cutovers(p)[count - 1]


def active_signature(p: Pipeline) -> str | None:
    value = p.redis.hget(signature_key(p.prefix, p.namespace), "s")
    return value.decode() if value else None


def events(p: Pipeline) -> dict[str, int]:
    return dict((p.stats() or {}).get("events", {}))


def verify(p: Pipeline) -> VerifyReport:
    """``freshkey verify``'s check of the namespace: entries of another signature count as absent."""
    binding = parse_bindings(p.bindings_text).bindings[0]
    settings = MySQLSettings(
        host=p.mysql.host,
        port=p.mysql.port,
        user=p.mysql.admin_user,
        password=p.mysql.admin_password,  # type: ignore[arg-type]
    )

    async def run() -> VerifyReport:
        client = aioredis.Redis.from_url(p.redis_url)
        try:
            result = await run_verification(
                settings, [binding], [("redis", client)], prefix=p.prefix, window_ms=300
            )
        finally:
            await client.aclose()
        return result.reports[0]

    return asyncio.run(run())


def test_model_updates_are_checked_and_bad_ones_dead_lettered_with_their_reason(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(binding_extra=SEMANTIC)
    p.start("worker")
    w1 = p.workdir / "w1.fkw"
    made = cli(p, "model", "init-weights", "--out", str(w1), "--seed", "1", "--dims", "text=64,image=16",
               "--shared-dim", "32")  # fmt: skip
    assert made.returncode == 0, made.stderr
    digest1 = made.stdout.strip().splitlines()[-1]
    w2, _ = make_weights(p, 2)

    publish(p, "1.0.0", w1)
    first = wait_cutover(p, 1)
    assert first["model_version"] == "1.0.0" and active_signature(p) == first["signature"]

    publish(p, "0.9.0", w2)  # older than the active one
    publish(p, "1.0.0+rebuild", w2)  # equal precedence: not newer either
    publish(p, "2.0.0", w2, sha=digest1)  # the file does not hash to the announced digest
    publish(p, "2.0.0", w2, namespace="nobody_binds_this")
    letters = [orjson.loads(v) for _, v in read_topic(p.kafka, p.dead_letter_topic, expect=4)]
    reasons = sorted(letter["reason"].split(":", 1)[0] for letter in letters)
    assert reasons == ["digest-mismatch", "not-newer", "not-newer", "unknown-namespace"], letters
    assert all(letter["stage"] == "model-update" for letter in letters)
    originals = [orjson.loads(base64.b64decode(letter["original_b64"])) for letter in letters]
    assert {o["model_version"] for o in originals} == {"0.9.0", "1.0.0+rebuild", "2.0.0"}

    # A replay of the active update is a harmless duplicate; the signature never moved backwards.
    (_, raw), *_ = read_topic(p.kafka, p.model_update_topic, expect=5)
    producer = Producer({"bootstrap.servers": p.kafka})
    producer.produce(p.model_update_topic, key=b"minilm", value=raw)
    assert producer.flush(10) == 0
    p.wait(lambda: events(p).get("model_update_duplicate", 0) >= 1, 60, "the replay to be handled")
    assert active_signature(p) == first["signature"]
    assert len(cutovers(p)) == 1 and events(p).get("dead_lettered", 0) == 4


@pytest.mark.parametrize("mode", ["prewarm-then-switch", "switch-then-prewarm"])
def test_cutover_prewarms_the_hot_set_and_no_tier_serves_an_old_signature_entry(
    make_pipeline: Callable[..., Pipeline], mode: str
) -> None:
    p = make_pipeline(binding_extra=SEMANTIC)
    p.start("connector")
    p.start("worker", FRESHKEY_MODEL_CUTOVER=mode, FRESHKEY_MODEL_PREWARM_TOP_N="8")
    w1, weights1 = make_weights(p, 11)
    w2, weights2 = make_weights(p, 12)
    publish(p, "1.0.0", w1)
    wait_cutover(p, 1)

    contents = {i: f"a photo of cat number {i}" for i in range(1, 21)}
    values = ", ".join(f"({i}, 'text', '{c}', NULL, UTC_TIMESTAMP(6))" for i, c in contents.items())
    p.sql(f"INSERT INTO {p.database}.assets VALUES {values}")
    old_keys = {i: semantic_key(p, weights1, c) for i, c in contents.items()}
    p.wait(lambda: all(p.redis.exists(k) for k in old_keys.values()), 60, "semantic entries of model 1")
    entry = parse_entry(old_keys[3], p.redis.hgetall(old_keys[3]))  # type: ignore[arg-type]
    assert entry is not None and b"cat number 3" in (entry.value or b"")
    assert p.redis.hget(old_keys[3], "k") == b"3", "a semantic entry records its row"

    # An UPDATE that changes the content: the old semantic key is invalidated, the new one written.
    p.sql(f"UPDATE {p.database}.assets SET content = 'a photo of a dog' WHERE id = 20")
    dog = semantic_key(p, weights1, "a photo of a dog")
    p.wait(lambda: p.redis.exists(dog) == 1, 60, "the updated row's new key")
    gone = parse_entry(old_keys[20], p.redis.hgetall(old_keys[20]))  # type: ignore[arg-type]
    assert gone is not None and gone.tombstone, "the old semantic key was not invalidated"
    assert p.redis.hget(dog, "k") == b"20"
    del old_keys[20]

    async def scenario() -> None:
        redis_client = aioredis.Redis.from_url(p.redis_url)
        l1 = L1Cache()
        listener = InvalidationListener(
            aioredis.Redis.from_url(p.redis_url), invalidation_channel(p.prefix), [l1]
        )
        listener.start()
        await asyncio.wait_for(listener.subscribed.wait(), 10)
        hits = HitRecorder(p.prefix, flush_every=1)
        client = CacheClient(redis_client, prefix=p.prefix, l1=l1, hits=hits)
        base = f"{p.prefix}:{{{p.namespace}}}:"

        async def get(key: str) -> Hit | Miss:
            return await client.get(p.namespace, [key[len(base) :]])

        try:
            hot = [1, 2, 3, 4, 5]
            for _ in range(5):
                for i in hot:
                    assert isinstance(await get(old_keys[i]), Hit)
            for i in (6, 7):  # warm, not hot
                assert isinstance(await get(old_keys[i]), Hit)
            assert any(k.startswith(base) for k, _ in l1.items()), "L1 holds model-1 entries"
            await asyncio.to_thread(
                p.wait,
                lambda: (page(p, "/freshkey/hotness") or {}).get("entries", 0) >= 7,
                60,
                "the hit counts to reach the hotness table",
            )
            publish(p, "2.0.0", w2)
            report = await asyncio.to_thread(wait_cutover, p, 2)
            assert report["mode"] == mode and report["model_version"] == "2.0.0"
            assert report["prewarm"]["hot"] == 7 and report["prewarm"]["written"] == 7, report
            assert active_signature(p) == report["signature"]

            # No tier serves an entry built under model 1: L2 through the read script, L1 through the
            # broadcast (flushed) and the signature check on put.
            for _ in range(200):
                if not any(k.startswith(base) for k, _ in l1.items()):
                    break
                await asyncio.sleep(0.01)
            assert not any(k.startswith(base) for k, _ in l1.items()), "L1 kept model-1 entries"
            for i, key in old_keys.items():
                result = await get(key)
                assert isinstance(result, Miss), f"row {i}: an old-signature entry was served"
            # The hot set is present under the new signature, keyed with the new weights.
            for i in (*hot, 6, 7):
                result = await get(semantic_key(p, weights2, contents[i]))
                assert isinstance(result, Hit), f"hot row {i} was not prewarmed"
                assert result.signature == report["signature"] and contents[i].encode() in result.value
            cold = await get(semantic_key(p, weights2, contents[15]))
            assert isinstance(cold, Miss), "a row nobody read was prewarmed"
        finally:
            await listener.stop()
            await redis_client.aclose()

    asyncio.run(scenario())

    # After the switch, changes are keyed with the new model only.
    p.sql(f"UPDATE {p.database}.assets SET content = 'a photo of a bird' WHERE id = 1")
    bird = semantic_key(p, weights2, "a photo of a bird")
    p.wait(lambda: p.redis.exists(bird) == 1, 60, "a change keyed with model 2")
    old_hot = parse_entry(
        semantic_key(p, weights2, contents[1]),
        p.redis.hgetall(semantic_key(p, weights2, contents[1])),  # type: ignore[arg-type]
    )
    assert old_hot is not None and old_hot.tombstone, "the prewarmed entry of the old content stayed"
    assert p.redis.hget(bird, "s") == active_signature(p).encode()  # type: ignore[union-attr]
    report = verify(p)  # rows keyed under the active model; old-model entries do not count
    assert report.stale == 0 and report.rows == 20 and report.checked == 7, report  # the hot set


def test_ddl_that_changes_the_value_projection_changes_the_signature(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(value_columns=False)  # every column is cached
    p.start("connector")
    p.start("worker")
    w1, _ = make_weights(p, 21)
    publish(p, "1.0.0", w1)
    first = wait_cutover(p, 1)
    p.sql(f"INSERT INTO {p.database}.assets VALUES (1, 'text', 'before', NULL, UTC_TIMESTAMP(6))")
    p.wait(lambda: p.redis.exists(p.key(1)) == 1, 60, "the entry")
    assert p.redis.hget(p.key(1), "s") == first["signature"].encode()

    async def get() -> Hit | Miss:
        client = aioredis.Redis.from_url(p.redis_url)
        try:
            return await CacheClient(client, prefix=p.prefix).get(p.namespace, [1])
        finally:
            await client.aclose()

    assert isinstance(asyncio.run(get()), Hit)
    p.sql(f"ALTER TABLE {p.database}.assets ADD COLUMN extra INT NOT NULL DEFAULT 7")
    p.wait(lambda: active_signature(p) not in (None, first["signature"]), 60, "the DDL to move the signature")
    miss = asyncio.run(get())
    assert isinstance(miss, Miss), "an entry without the new column was served after the ALTER"
    p.sql(f"UPDATE {p.database}.assets SET content = 'after' WHERE id = 1")
    p.wait(lambda: p.redis.hget(p.key(1), "s") == active_signature(p).encode(), 60, "the rewrite")  # type: ignore[union-attr]
    hit = asyncio.run(get())
    assert isinstance(hit, Hit) and orjson.loads(hit.value)["extra"] == 7
    report = verify(p)
    assert report.stale == 0 and report.checked == 1, report


def test_model_updates_from_a_registry_table_in_mysql(make_pipeline: Callable[..., Pipeline]) -> None:
    """The connector turns inserts into a registry table into model updates; a bad row is a dead letter."""
    p = make_pipeline(binding_extra=SEMANTIC)
    registry = f"{p.database}.model_registry"
    p.sql(
        f"CREATE TABLE {registry} (id BIGINT AUTO_INCREMENT PRIMARY KEY, model VARCHAR(200) NOT NULL, "
        "model_version VARCHAR(100) NOT NULL, tokenizer_version VARCHAR(200) NOT NULL, "
        "input_schema JSON NOT NULL, weights_ref VARCHAR(1000) NOT NULL, weights_sha256 CHAR(64) NOT NULL, "
        "namespaces JSON NOT NULL, key_bits SMALLINT NOT NULL DEFAULT 64)"
    )
    p.env["FRESHKEY_CONNECTOR_MODEL_REGISTRY_TABLE"] = registry
    p.start("connector")
    p.start("worker")
    path, weights = make_weights(p, 5)
    insert = (
        f"INSERT INTO {registry} (model, model_version, tokenizer_version, input_schema, weights_ref, "
        "weights_sha256, namespaces) VALUES (%s, %s, 'tok-1', %s, %s, %s, %s)"
    )
    schema, namespaces = json.dumps(SCHEMA), json.dumps([p.namespace])
    p.sql(insert, ("minilm", "1.0.0", schema, str(path), weights.sha256, namespaces))
    first = wait_cutover(p, 1)
    assert first["model_version"] == "1.0.0" and active_signature(p) == first["signature"]

    p.sql(insert, ("minilm", "not-a-version", schema, str(path), weights.sha256, "[]"))
    letters = [orjson.loads(v) for _, v in read_topic(p.kafka, p.dead_letter_topic, expect=1)]
    assert letters[0]["stage"] == "model-registry"
    assert "model_version" in letters[0]["reason"] or "namespaces" in letters[0]["reason"], letters
    p.sql(insert, ("minilm", "1.1.0", schema, str(path), weights.sha256, namespaces))
    second = wait_cutover(p, 2)
    assert second["model_version"] == "1.1.0", "the connector went on after the bad row"
