"""deploy/healthcheck.py (the compose healthchecks) against the real connector and worker.

A pipeline of the harness (tests/support/pipeline.py) on the session's services: the connector with
its /metrics on a port of the test, the worker with a web token. The script runs as Docker runs it in
the containers (``python healthcheck.py connector|worker``, the ports and the token from the
environment):

- the connector turns healthy once it reads the binlog and produces (``freshkey_connector_connected``
  1), and the worker once ``/freshkey/health`` answers 200 (that route needs no token; the check sends
  it anyway when set, never prints it);
- negative controls: a worker whose Redis does not answer is unhealthy with the route's own reason
  (503), a killed worker and a killed connector are unhealthy ("does not answer").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.support.compose import HEALTHCHECK_SCRIPT
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

TOKEN = "compose-healthcheck-token-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthcheck(service: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FRESHKEY_")}
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), service],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode, result.stdout + result.stderr


def wait_healthy(p: Pipeline, service: str, timeout: float, **env: str) -> tuple[float, str]:
    """Seconds until the check passed, and its line."""
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout:
        p.check_alive()
        code, last = healthcheck(service, **env)
        if code == 0:
            return time.monotonic() - started, last
        time.sleep(0.5)
    raise AssertionError(f"{service} not healthy within {timeout:.0f} s; last answer: {last}\n{p.logs()}")


def test_healthcheck_against_the_real_connector_and_worker(make_pipeline: Callable[..., Pipeline]) -> None:
    p = make_pipeline(version_column=True)
    metrics_port = str(_free_port())
    connector_env = {"FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": metrics_port}
    p.start("connector", **connector_env)
    connector_s, connector_line = wait_healthy(p, "connector", 60, **connector_env)
    assert connector_line.strip() == "healthy: the connector reads the binlog and produces to Kafka"

    worker_env = {"FRESHKEY_WORKER_WEB_PORT": str(p.web_port), "FRESHKEY_WORKER_WEB_TOKEN": TOKEN}
    p.launch("worker", FRESHKEY_WORKER_WEB_TOKEN=TOKEN)
    worker_s, worker_line = wait_healthy(p, "worker", 120, **worker_env)
    assert worker_line.startswith("healthy: /freshkey/health answered 200"), worker_line
    assert TOKEN not in worker_line
    code, line = healthcheck("worker", FRESHKEY_WORKER_WEB_PORT=str(p.web_port))
    assert code == 0, f"/freshkey/health needs no token: {line}"

    # A worker whose Redis does not answer: its own group, so the first one keeps its partitions.
    p.launch(
        "worker-2",
        FRESHKEY_REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0",
        FRESHKEY_WORKER_APP_ID=f"{p.app_id}-no-redis",
    )
    no_redis_env = {"FRESHKEY_WORKER_WEB_PORT": str(p.web_ports["worker-2"])}
    deadline = time.monotonic() + 90
    code, line = healthcheck("worker", **no_redis_env)
    while "answered 503" not in line:
        assert time.monotonic() < deadline, f"worker-2 never answered 503: {line}\n{p.logs()}"
        time.sleep(0.5)
        code, line = healthcheck("worker", **no_redis_env)
    assert code == 1, line
    unavailable = line.strip()
    p.stop("worker-2")

    p.kill9("worker")
    code, line = healthcheck("worker", **worker_env)
    assert code == 1 and "does not answer" in line, line
    p.kill9("connector")
    code, line = healthcheck("connector", **connector_env)
    assert code == 1 and "does not answer" in line, line
    print(
        f"\nhealthcheck: connector healthy {connector_s:.1f} s after its first checkpoint, worker"
        f" {worker_s:.1f} s after launch; a worker without Redis: {unavailable}; killed worker and"
        " connector: unhealthy"
    )
