"""The worker's JSON routes (besides the dashboard's own): health, stats, SLA, consumer lag,
verification, signature changes. Who may read them: :mod:`pipeline.web.auth`."""

from __future__ import annotations

from typing import Any

from cache_writer.layout import latest_verification_key
from pipeline.context import Worker
from pipeline.web.auth import HEALTH_PATH
from pipeline.web.health import health, redact_verification
from pipeline.web.settings import web_settings


def install_api(w: Worker) -> None:
    app, processor = w.app, w.processor
    show_values = web_settings(w.settings).web_show_values

    @app.page(HEALTH_PATH)
    async def health_page(web: Any, request: Any) -> Any:
        """200 when the change agent consumes and every tier answers, 503 otherwise (no secrets, and
        no token needed: see pipeline.web.health)."""
        status, body = await health(w)
        return web.json(body, status=status, headers={"Cache-Control": "no-store"})

    @app.page("/freshkey/stats")
    async def stats_page(web: Any, request: Any) -> Any:
        """Counts and lag figures (pipeline.observe.stats), each tier's health (ok, failing, fenced) and
        whether the dead-letter topic is blocking consumption."""
        body = processor.stats.snapshot()
        body["tiers"] = {name: guard.snapshot() for name, guard in processor.guards.items()}
        body["dead_letters_blocked_s"] = w.dead_letters.blocked_s
        return web.json(body)

    @app.page("/freshkey/sla")
    async def sla_page(web: Any, request: Any) -> Any:
        """The SLA state (pipeline.observe.sla.SlaState as JSON), as of the last evaluation."""
        return web.json(w.sla.state.model_dump(mode="json"))

    @app.page("/freshkey/consumer-lag")
    async def consumer_lag_page(web: Any, request: Any) -> Any:
        """``{"topic/partition": PartitionProgress JSON}`` (see the README)."""
        return web.json(w.progress.report())

    @app.page("/freshkey/verify")
    async def verify_page(web: Any, request: Any) -> Any:
        """The latest ``freshkey verify`` result (it stores it in Redis), 404 before the first run. Its
        examples show keys and versions; row values only with FRESHKEY_WORKER_WEB_SHOW_VALUES=true."""
        if not w.tiers.ready.is_set():
            return web.json({"error": "tiers not ready"}, status=503)
        raw = await w.tiers.l2.get(latest_verification_key(w.settings.redis.key_prefix))
        if raw is None:
            return web.json({"error": "no verification yet"}, status=404)
        return web.bytes(raw if show_values else redact_verification(raw), content_type="application/json")

    @app.page("/freshkey/cutovers")
    async def cutovers_page(web: Any, request: Any) -> Any:
        """The last signature changes (cutovers, DDL, fences) this worker made, oldest first."""
        return web.json(w.signature_log.entries)
