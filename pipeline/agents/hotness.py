"""Hotness and cutovers: client hit counts folded into a Faust table; cutover commands run where the
namespace's counts are (prewarm its hottest entries, then switch its signature)."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from typing import Any

import faust
import orjson
from redis.exceptions import RedisError

from cache_writer import TierUnavailableError
from cache_writer.layout import namespace_prefix
from pipeline.context import Worker
from pipeline.cutover import CutoverRejected
from pipeline.hotness import HitForwarder, merge_count, top_entries
from pipeline.outages import crash, until_done
from schemas import DecodeError
from schemas.model_updates import decode_model_update

log = logging.getLogger(__name__)


def install(w: Worker) -> None:
    app, processor = w.app, w.processor
    settings = w.settings
    prefix = settings.redis.key_prefix
    kafka = settings.kafka
    hot_table = app.Table("hotness", default=None, key_type=str, value_type=str, partitions=kafka.partitions)
    forwarder: list[HitForwarder] = []
    hotness_topic = w.topics["hotness"]

    @app.agent(hotness_topic)
    async def hotness(stream: faust.StreamT) -> None:
        """Fold hit counts into the hotness table; run cutover commands (prewarm + switch)."""
        try:
            async for event in stream.events():
                try:
                    data = orjson.loads(event.message.value or b"{}")
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(data, dict) or data.get("prefix") != prefix:
                    continue  # another deployment's message on a shared topic
                if data.get("kind") == "hits" and isinstance(data.get("counts"), dict):
                    for key, count in data["counts"].items():
                        if isinstance(count, list) and len(count) == 2 and all(type(c) is int for c in count):
                            hot_table[key] = merge_count(hot_table.get(key), count[0], count[1])
                elif data.get("kind") == "cutover" and isinstance(data.get("update"), str):
                    await run_cutover(event, str(data.get("namespace")), data["update"].encode())
        except Exception as exc:
            crash("the hotness agent", exc)

    async def run_cutover(event: Any, namespace: str, raw: bytes) -> None:
        await w.tiers.ready.wait()
        try:
            update = decode_model_update(raw)
        except DecodeError as exc:
            await w.dead_letters.send(event, "model-update", f"invalid: {exc.reason}", original=raw)
            return
        hot = top_entries(
            list(hot_table.items()),
            namespace_prefix(prefix, namespace),
            settings.model.prewarm_top_n,
            int(time.time() * 1000),
            settings.hotness,
        )
        try:
            report = await until_done(
                f"the cutover of {namespace}", lambda: w.cutovers.cutover(namespace, update, None, hot)
            )
        except CutoverRejected as exc:
            processor.observers.on_event("model_update_rejected")
            await w.dead_letters.send(event, "model-update", exc.reason, original=raw)
            return
        except Exception as exc:  # never let one cutover stop the hotness agent (invariant 8)
            log.exception("cutover of %s failed", namespace)
            processor.observers.on_event("model_update_rejected")
            await w.dead_letters.send(event, "model-update", f"cutover-failed: {exc!r}", original=raw)
            return
        processor.observers.on_event("cutover")
        w.signature_log.add(
            namespace,
            "model-update",
            model=update.model,
            model_version=update.model_version,
            signature=report.signature,
            previous=report.previous,
            mode=report.mode,
            switch_ms=report.switch_ms,
            prewarm=dataclasses.asdict(report.prewarm),
        )

    @app.timer(settings.hotness.forward_interval_s)
    async def forward_hits() -> None:
        if not w.tiers.ready.is_set():
            return
        if not forwarder:
            consumer = f"{settings.worker.app_id}@{socket.gethostname()}:{settings.worker.web_port}"
            forwarder.append(HitForwarder(w.tiers.l2, prefix, consumer))

        async def send(key: bytes, value: bytes) -> None:
            future = await hotness_topic.send(key=key, value=value)
            await future

        try:
            await forwarder[0].forward(send)
        except (TierUnavailableError, RedisError, OSError) as exc:
            log.debug("hit counts not forwarded this time: %r", exc)

    @app.page("/freshkey/hotness")
    async def hotness_page(web: Any, request: Any) -> Any:
        """Entries with hit counts in this worker's partitions of the hotness table."""
        return web.json({"entries": len(hot_table)})
