"""Health checks of freshkey's compose services (docker-compose.yml mounts this file read-only at
/etc/freshkey/healthcheck.py and runs it in the service's container). Standard library only.

    python /etc/freshkey/healthcheck.py connector
        GET http://127.0.0.1:$FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT/metrics. Healthy when it
        answers and ``freshkey_connector_connected`` is 1 (it reads the binlog and produces to Kafka);
        unhealthy while it waits to reconnect (0), before its first session (no such series) and when
        the endpoint does not answer.
    python /etc/freshkey/healthcheck.py worker
        GET http://127.0.0.1:$FRESHKEY_WORKER_WEB_PORT/freshkey/health: 200 healthy (the change agent
        consumes and every cache tier answers), 503 unhealthy with the worker's reasons. A worker that
        does not serve that route yet (404) is healthy when /freshkey/stats answers. With
        FRESHKEY_WORKER_WEB_TOKEN set, the token goes along as a bearer token (never printed).

Exit status 0 healthy, 1 unhealthy (Docker reserves 2); one line on stdout says why (``docker inspect``
shows it).
tests/unit/pipeline/test_compose.py runs this file against stand-in servers.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0
CONNECTED = "freshkey_connector_connected"
WORKER_WEB_PORT = "6066"
"""FRESHKEY_WORKER_WEB_PORT's default (pipeline/settings.py WorkerSettings.web_port)."""
CONNECTOR_METRICS_PORT = "9465"
"""FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT's default (TelemetrySettings.connector_prometheus_port)."""


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error status is an answer too. Raises OSError when nothing
    answers."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _series(text: str, name: str) -> float | None:
    """The value of the first sample of ``name`` (any labels) in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def connector() -> tuple[bool, str]:
    port = os.environ.get("FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT") or CONNECTOR_METRICS_PORT
    if port == "0":
        return False, "the connector's metrics are off (FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT=0)"
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        status, body = _get(url)
    except OSError as exc:
        return False, f"{url} does not answer ({exc})"
    if status != 200:
        return False, f"{url} answered {status}"
    connected = _series(body.decode(errors="replace"), CONNECTED)
    if connected is None:
        return False, f"no {CONNECTED} yet: the connector has not started its first session"
    if connected < 1:
        return False, "the connector waits to reconnect to the database or the broker (see its log)"
    return True, "the connector reads the binlog and produces to Kafka"


def worker() -> tuple[bool, str]:
    base = f"http://127.0.0.1:{os.environ.get('FRESHKEY_WORKER_WEB_PORT') or WORKER_WEB_PORT}"
    token = os.environ.get("FRESHKEY_WORKER_WEB_TOKEN") or None
    try:
        status, body = _get(f"{base}/freshkey/health", token)
        if status == 404:
            status, body = _get(f"{base}/freshkey/stats", token)
            return status == 200, f"/freshkey/health absent; /freshkey/stats answered {status}"
    except OSError as exc:
        return False, f"{base} does not answer ({exc})"
    text = body.decode(errors="replace").strip()[:300]
    return status == 200, f"/freshkey/health answered {status}: {text}"


def main(argv: list[str]) -> int:
    checks = {"connector": connector, "worker": worker}
    if len(argv) != 2 or argv[1] not in checks:
        print(f"usage: healthcheck.py {'|'.join(checks)}")
        return 1  # Docker reserves 2
    healthy, why = checks[argv[1]]()
    print(("healthy: " if healthy else "unhealthy: ") + why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
