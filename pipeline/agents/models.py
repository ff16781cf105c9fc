"""The model-update agent: each update is checked once, then becomes one cutover command per namespace.

Commands go to the hotness topic keyed by namespace, where the worker that holds the namespace's hit
counts prewarms and switches (``pipeline.agents.hotness``). A rejected update is a dead letter with the
reason; the agent goes on (invariant 8).
"""

from __future__ import annotations

import logging

import faust
import orjson

from pipeline.context import Worker
from pipeline.cutover import CutoverRejected
from pipeline.outages import crash, until_done

log = logging.getLogger(__name__)


def install(w: Worker) -> None:
    processor = w.processor
    prefix = w.settings.redis.key_prefix

    @w.app.agent(w.topics["model_updates"])
    async def check_model_updates(stream: faust.StreamT) -> None:
        try:
            async for events in stream.noack_take(16, within=0.05):  # type: ignore[attr-defined]
                await w.tiers.ready.wait()
                for event in events:
                    await check(event)
                for event in events:
                    await stream.ack(event)
        except Exception as exc:
            crash("the model-update agent", exc)

    async def check(event: faust.types.EventT) -> None:
        raw = event.message.value or b""
        try:
            checked = await until_done("checking a model update", lambda: w.cutovers.check(raw))
        except CutoverRejected as exc:
            processor.observers.on_event("model_update_rejected")
            await w.dead_letters.send(event, "model-update", exc.reason)
            return
        except Exception as exc:  # bad input never stops the pipeline (invariant 8)
            log.exception("model update could not be checked")
            processor.observers.on_event("model_update_rejected")
            await w.dead_letters.send(event, "model-update", f"check-failed: {exc!r}")
            return
        if checked is None:
            processor.observers.on_event("model_update_duplicate")
            log.info("model update already active on every namespace it serves: %s", raw[:200])
            return
        for namespace in checked.namespaces:
            command = {"kind": "cutover", "prefix": prefix, "namespace": namespace, "update": raw.decode()}
            future = await w.topics["hotness"].send(key=namespace.encode(), value=orjson.dumps(command))
            await future
        processor.observers.on_event("model_update")
