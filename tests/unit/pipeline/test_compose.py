"""docker-compose.yml, checked against the code it deploys (no Docker engine here: nothing calls docker).

The stack cannot be started on these machines, so this test reads the compose file the way Compose
would (YAML, merge keys, ``${VAR:-default}`` interpolation with no overrides set) and checks what would
otherwise only fail after ``docker compose up``: every ``FRESHKEY_*`` variable names a real setting (the
set of names is built from the pydantic-settings classes, so renaming a setting breaks this test), the
values parse, the services point at each other, MySQL has the binlog settings ``freshkey doctor``
demands, the bindings file is the demo's, only 127.0.0.1 is published, and the referenced files exist;
the heartbeat service writes the table the worker's SLA watches (bound, created and writable); the
file is valid under the compose specification's JSON schema; and the monitoring: Prometheus scrapes
the port each app serves its metrics on (bound so it can be reached), Grafana's provisioning is
mounted where Grafana reads it, its datasource is the prometheus service and its dashboards provider
reads a mounted directory of dashboards.

Each check is a function that returns a list of problems; the negative tests feed broken copies of the
compose file to the same functions and assert that the problem is reported.
"""

from __future__ import annotations

import copy
import http.server
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors import heartbeat as heartbeat_module
from connectors.heartbeat import HeartbeatSettings
from connectors.kafka.settings import KafkaSettings
from connectors.metrics import ConnectorMetrics
from pipeline.demo import stack as demo
from pipeline.faust_app import FreshkeyApp
from pipeline.observe.telemetry import configure_telemetry
from pipeline.settings import TelemetrySettings, WorkerSettings
from schemas import parse_bindings
from tests.support import compose as compose_linter
from tests.support.compose import (
    APP_SERVICES,
    CHECKS,
    COMPOSE_PATH,
    HEALTHCHECK_SCRIPT,
    HEARTBEAT_SERVICE,
    MYSQL_CLIENTS,
    PROFILES,
    REPO_ROOT,
    SETTINGS_CLASSES,
    Compose,
    check_alert_rules,
    check_bindings_mount,
    check_compose_schema,
    check_env_names,
    check_env_values,
    check_grafana,
    check_heartbeat,
    check_kafka,
    check_metrics_scrape,
    check_redis_cluster,
    check_signal_table,
    check_wiring,
    effective_env,
    environment,
    host_path,
    interpolate,
    is_bind_mount,
    load_compose,
    load_profile,
    read_env_file,
    report,
    services,
    settings_env_names,
    sql_statements,
    volume_mounts,
)

# --- the real compose file ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> Compose:
    assert COMPOSE_PATH.is_file(), f"{COMPOSE_PATH} is missing"
    return load_compose()


@pytest.mark.parametrize("check", list(CHECKS))
def test_compose_file(compose: Compose, check: str) -> None:
    problems = CHECKS[check](compose)
    assert not problems, report(problems)


def test_compose_env_values_parse(compose: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    problems = check_env_values(compose, monkeypatch)
    assert not problems, report(problems)


def test_compose_sets_the_settings_the_stack_needs(compose: Compose) -> None:
    """Not only valid names: the variables that differ from the defaults for containers are set."""
    heartbeat = {"FRESHKEY_HEARTBEAT_DATABASE", "FRESHKEY_HEARTBEAT_TABLE", "FRESHKEY_HEARTBEAT_INTERVAL_MS"}
    wanted = {
        "connector": {"FRESHKEY_CONNECTOR_CHECKPOINT_PATH"},
        "worker": {
            "FRESHKEY_WORKER_WEB_BIND",
            "FRESHKEY_WORKER_WEB_PORT",
            "FRESHKEY_WORKER_DATA_DIR",
            "FRESHKEY_WORKER_FETCH_MAX_WAIT_MS",  # Apache Kafka: no 100 idle fetches a second
            *heartbeat,
        },
        HEARTBEAT_SERVICE: heartbeat,
    }
    common = {
        "FRESHKEY_MYSQL_HOST",
        "FRESHKEY_MYSQL_PORT",
        "FRESHKEY_MYSQL_USER",
        "FRESHKEY_MYSQL_PASSWORD",
        "FRESHKEY_MYSQL_SERVER_ID",
        "FRESHKEY_KAFKA_BOOTSTRAP",
        "FRESHKEY_KAFKA_PARTITIONS",
        "FRESHKEY_REDIS_URL",
        "FRESHKEY_BINDINGS",
    }
    common_to = {**dict.fromkeys(APP_SERVICES, common), HEARTBEAT_SERVICE: {"FRESHKEY_MYSQL_HOST"}}
    for name, extra in wanted.items():
        missing = (common_to[name] | extra) - set(environment(services(compose)[name]))
        assert not missing, f"{name}: not set in docker-compose.yml: {sorted(missing)}"


def test_state_lives_on_named_volumes(compose: Compose) -> None:
    """The connector checkpoint and the worker data dir survive a container rebuild."""
    for name, variable in (
        ("connector", "FRESHKEY_CONNECTOR_CHECKPOINT_PATH"),
        ("worker", "FRESHKEY_WORKER_DATA_DIR"),
    ):
        service = services(compose)[name]
        path = Path(str(environment(service)[variable]))
        holders = [
            source
            for source, target, _ in volume_mounts(service)
            if not is_bind_mount(source) and (path == Path(target) or Path(target) in path.parents)
        ]
        assert holders, f"{name}: {variable}={path} is not on a named volume ({volume_mounts(service)})"


def test_mysql_user_password_is_the_connectors(compose: Compose) -> None:
    """The image creates the freshkey user with MYSQL_PASSWORD: it must be FRESHKEY_MYSQL_PASSWORD."""
    mysql_env = environment(services(compose)["mysql"])
    for name in MYSQL_CLIENTS:
        env = environment(services(compose)[name])
        assert mysql_env.get("MYSQL_USER") == env["FRESHKEY_MYSQL_USER"], f"{name}: MySQL user differs"
        assert mysql_env.get("MYSQL_PASSWORD") == env["FRESHKEY_MYSQL_PASSWORD"], f"{name}: password differs"
    overridden = load_compose(env={"FRESHKEY_MYSQL_PASSWORD": "s3cret"})
    assert environment(services(overridden)["mysql"])["MYSQL_PASSWORD"] == "s3cret"
    assert environment(services(overridden)["connector"])["FRESHKEY_MYSQL_PASSWORD"] == "s3cret"


def test_init_sql_creates_the_demo_schema_and_grants(compose: Compose) -> None:
    init = next(
        host_path(source)
        for source, target, _ in volume_mounts(services(compose)["mysql"])
        if target.startswith("/docker-entrypoint-initdb.d/")
    )
    statements = sql_statements(init.read_text())
    for statement in sql_statements(demo.SCHEMA):
        assert statement in statements, (
            f"{init}: lacks (or differs from) pipeline/demo/stack.py SCHEMA: {statement}"
        )
    grant = "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'freshkey'@'%'"
    assert grant in statements, f"{init}: lacks `{grant}` (what freshkey doctor checks)"
    heartbeat = "GRANT CREATE, INSERT, DELETE ON freshkey.* TO 'freshkey'@'%'"
    assert heartbeat in statements, f"{init}: lacks `{heartbeat}` (what the heartbeat service needs)"


def test_one_heartbeat_table_everywhere(compose: Compose) -> None:
    """The settings' default, the demo, the bindings file, compose, init.sql and the docs: one name."""
    defaults = HeartbeatSettings.model_construct()
    table = f"{defaults.database}.{defaults.table}"
    assert f"{demo.HEARTBEAT_DATABASE}.{demo.HEARTBEAT_TABLE}" == table
    demo_binding = parse_bindings(demo.BINDINGS).for_table(defaults.database, defaults.table)
    assert demo_binding is not None and demo_binding.namespace == demo.HEARTBEAT_NAMESPACE, demo.BINDINGS
    assert demo_binding.commit_time_column == "beat_at", "heartbeat lags need the µs commit clock"
    deployed = parse_bindings((REPO_ROOT / "deploy" / "bindings.yaml").read_bytes())
    assert deployed.for_table(defaults.database, defaults.table) == demo_binding
    for name in ("worker", HEARTBEAT_SERVICE):
        service = services(compose)[name]
        got = ".".join(
            effective_env(service, f"FRESHKEY_HEARTBEAT_{f.upper()}", HeartbeatSettings, f)
            for f in ("database", "table")
        )
        assert got == table, f"{name}: FRESHKEY_HEARTBEAT_DATABASE/_TABLE name {got}, the default is {table}"
    assert f"CREATE TABLE IF NOT EXISTS {table} (" in " ".join(
        sql_statements((REPO_ROOT / "deploy" / "mysql" / "init.sql").read_text())
    )
    doc = heartbeat_module.__doc__ or ""
    assert f"table: {table}\n" in doc, "connectors/heartbeat.py documents another table in its binding"


def test_compose_file_follows_the_compose_specification() -> None:
    problems = check_compose_schema()
    assert not problems, report(problems)


def test_schema_check_reports_an_invalid_compose_file(tmp_path: Path) -> None:
    """A key Compose does not know and a port of the wrong type: refused by the schema."""
    data = yaml.safe_load(COMPOSE_PATH.read_text())
    data["services"]["worker"]["restart_policy"] = "always"
    data["services"]["redis"]["ports"] = 6379
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data))
    problems = check_compose_schema(broken)
    assert problems and "restart_policy" in problems[0], problems


def test_dockerfile_installs_cpu_torch_first() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    torch_line = re.search(r"^RUN pip install[^\n]*torch==(?P<version>[\d.]+)[^\n]*", text, re.MULTILINE)
    assert torch_line, "Dockerfile: no pinned `pip install torch==...`"
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line[0], "torch not from the CPU index"
    project = re.search(r"^RUN pip install \.", text, re.MULTILINE)
    assert project, "Dockerfile: no `RUN pip install .`"
    assert project.start() > torch_line.start(), "torch must be installed before `pip install .`"
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    spec = re.search(r'"torch([^"]*)"', pyproject)
    assert spec, "pyproject.toml has no torch requirement"
    assert SpecifierSet(spec[1]).contains(torch_line["version"]), (
        f"Dockerfile torch=={torch_line['version']} is outside pyproject's torch{spec[1]}: "
        "`pip install .` would download another (CUDA) build"
    )
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    for path in (".venv", ".git", "artifacts"):
        assert path in ignored, f".dockerignore does not exclude {path}"


# --- the checks catch what they claim to (broken copies of the compose file) ---------------------------


def _env(service: str) -> Callable[[Compose], dict[str, Any]]:
    def get(compose: Compose) -> dict[str, Any]:
        env: dict[str, Any] = services(compose)[service]["environment"]
        return env

    return get


def _rename(mapping: dict[str, Any], old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _replace_arg(service: str, prefix: str, new: str | None) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        args = [a for a in services(compose)[service]["command"] if not a.startswith(prefix)]
        services(compose)[service]["command"] = [*args, new] if new else args

    return mutate


BROKEN: list[tuple[str, Callable[[Compose], object], str, str]] = [
    (
        "misspelled FRESHKEY_ variable",
        lambda c: _rename(_env("worker")(c), "FRESHKEY_KAFKA_BOOTSTRAP", "FRESHKEY_KAFKA_BOOTSTRAPS"),
        "env_names",
        "FRESHKEY_KAFKA_BOOTSTRAPS is not a freshkey setting",
    ),
    (
        "variable of a renamed setting",
        lambda c: _rename(_env("connector")(c), "FRESHKEY_CONNECTOR_CHECKPOINT_PATH", "FRESHKEY_CHECKPOINT"),
        "env_names",
        "FRESHKEY_CHECKPOINT is not a freshkey setting",
    ),
    ("missing redis service", lambda c: services(c).pop("redis"), "services", "service 'redis' is missing"),
    (
        "missing grafana service",
        lambda c: services(c).pop("grafana"),
        "services",
        "service 'grafana' is missing",
    ),
    (
        "statement-based binlog",
        _replace_arg("mysql", "--binlog-format", "--binlog-format=MIXED"),
        "mysql_binlog",
        "--binlog-format is 'MIXED'",
    ),
    (
        "no row metadata",
        _replace_arg("mysql", "--binlog-row-metadata", None),
        "mysql_binlog",
        "--binlog-row-metadata is None",
    ),
    (
        "minimal row image",
        _replace_arg("mysql", "--binlog-row-image", "--binlog_row_image=MINIMAL"),
        "mysql_binlog",
        "--binlog-row-image is 'MINIMAL'",
    ),
    (
        "compressed binlog",
        _replace_arg("mysql", "--binlog-transaction-compression", "--binlog-transaction-compression=ON"),
        "mysql_binlog",
        "compressed binlog events",
    ),
    ("no server id", _replace_arg("mysql", "--server-id", None), "mysql_binlog", "--server-id is None"),
    (
        "replica id equals server id",
        lambda c: _env("connector")(c).update(FRESHKEY_MYSQL_SERVER_ID="1"),
        "server_ids",
        "FRESHKEY_MYSQL_SERVER_ID=1 equals the mysql --server-id=1",
    ),
    (
        "bootstrap at localhost",
        lambda c: _env("worker")(c).update(FRESHKEY_KAFKA_BOOTSTRAP="localhost:9092"),
        "wiring",
        "FRESHKEY_KAFKA_BOOTSTRAP=localhost:9092 is not an advertised listener",
    ),
    (
        "bootstrap at the host listener",
        lambda c: _env("worker")(c).update(FRESHKEY_KAFKA_BOOTSTRAP="127.0.0.1:29092"),
        "wiring",
        "FRESHKEY_KAFKA_BOOTSTRAP=127.0.0.1:29092 is not an advertised listener",
    ),
    (
        "mysql host unset (default 127.0.0.1)",
        lambda c: _env("connector")(c).pop("FRESHKEY_MYSQL_HOST"),
        "wiring",
        "FRESHKEY_MYSQL_HOST/PORT is 127.0.0.1:3306",
    ),
    (
        "redis url at another host",
        lambda c: _env("worker")(c).update(FRESHKEY_REDIS_URL="redis://cache:6379/0"),
        "wiring",
        "FRESHKEY_REDIS_URL=redis://cache:6379/0 does not point at the redis service",
    ),
    (
        "port on every interface",
        lambda c: services(c)["redis"].update(ports=["6379:6379"]),
        "ports",
        "redis: port 6379 is published on every interface",
    ),
    (
        "worker web port not published",
        lambda c: _env("worker")(c).update(FRESHKEY_WORKER_WEB_PORT="7000"),
        "ports",
        "FRESHKEY_WORKER_WEB_PORT=7000 but the published container ports are ['6066', '9464']",
    ),
    (
        "worker web bind loopback in the container",
        lambda c: _env("worker")(c).pop("FRESHKEY_WORKER_WEB_BIND"),
        "ports",
        "FRESHKEY_WORKER_WEB_BIND=127.0.0.1",
    ),
    (
        "kafka auto-creates topics",
        lambda c: _env("kafka")(c).update(KAFKA_AUTO_CREATE_TOPICS_ENABLE="true"),
        "kafka",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE='true'",
    ),
    (
        "bindings mounted elsewhere",
        lambda c: _env("worker")(c).update(FRESHKEY_BINDINGS="/etc/bindings.yaml"),
        "bindings_mount",
        "nothing is mounted at FRESHKEY_BINDINGS=/etc/bindings.yaml",
    ),
    (
        "bindings file not YAML",
        lambda c: services(c)["connector"].update(
            volumes=["./deploy/mysql/init.sql:/etc/freshkey/bindings.yaml:ro"]
        ),
        "bindings_mount",
        "init.sql: not valid YAML/JSON",
    ),
    (
        "bindings mounted writable",
        lambda c: services(c)["worker"].update(
            volumes=[
                "./deploy/bindings.yaml:/etc/freshkey/bindings.yaml",
                "worker-data:/var/lib/freshkey/worker",
            ]
        ),
        "bindings_mount",
        "is not read-only",
    ),
    (
        "missing mounted file",
        lambda c: services(c)["mysql"]["volumes"].append(
            "./deploy/mysql/nope.sql:/docker-entrypoint-initdb.d/x.sql"
        ),
        "referenced_files",
        "volume source ./deploy/mysql/nope.sql",
    ),
    (
        "undeclared named volume",
        lambda c: c["volumes"].pop("worker-data"),
        "referenced_files",
        "named volume 'worker-data' is not declared",
    ),
    (
        "worker metrics bound to loopback",
        lambda c: _env("worker")(c).update(FRESHKEY_TELEMETRY_PROMETHEUS_BIND="127.0.0.1"),
        "metrics_scrape",
        "worker: FRESHKEY_TELEMETRY_PROMETHEUS_BIND=127.0.0.1",
    ),
    (
        "worker metrics on a port nobody scrapes",
        lambda c: _env("worker")(c).update(FRESHKEY_TELEMETRY_PROMETHEUS_PORT="9999"),
        "metrics_scrape",
        "worker: serves metrics on 9999 (FRESHKEY_TELEMETRY_PROMETHEUS_PORT) but no scrape job",
    ),
    (
        "connector metrics off",
        lambda c: _env("connector")(c).update(FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT="0"),
        "metrics_scrape",
        "connector: FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT=0 turns its metrics off",
    ),
    (
        "prometheus config not mounted",
        lambda c: services(c)["prometheus"].update(volumes=["prometheus-data:/prometheus"]),
        "metrics_scrape",
        "nothing from the repository is mounted at --config.file=/etc/prometheus/prometheus.yml",
    ),
    (
        "prometheus on another port",
        _replace_arg("prometheus", "--web.listen-address", "--web.listen-address=:9091"),
        "grafana",
        "want http://prometheus:9091",
    ),
    (
        "grafana provisioning not mounted",
        lambda c: services(c)["grafana"].update(
            volumes=["./deploy/grafana/dashboards:/etc/grafana/dashboards:ro"]
        ),
        "grafana",
        "no repository directory is mounted at /etc/grafana/provisioning",
    ),
    (
        "grafana dashboards mounted elsewhere",
        lambda c: services(c)["grafana"].update(
            volumes=[
                "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro",
                "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro",
            ]
        ),
        "grafana",
        "dashboards provider reads /etc/grafana/dashboards, where no directory of dashboards is mounted",
    ),
    (
        "grafana published on every interface",
        lambda c: services(c)["grafana"].update(ports=["3000:3000"]),
        "ports",
        "grafana: port 3000 is published on every interface",
    ),
    (
        "missing heartbeat service",
        lambda c: services(c).pop("heartbeat"),
        "services",
        "service 'heartbeat' is missing",
    ),
    (
        "heartbeat service gone (its own check)",
        lambda c: services(c).pop("heartbeat"),
        "heartbeat",
        "nothing writes heartbeats",
    ),
    (
        "heartbeat runs another command",
        lambda c: services(c)["heartbeat"].update(command=["freshkey", "connector"]),
        "services",
        "heartbeat: command is ['freshkey', 'connector'], want ['freshkey', 'heartbeat']",
    ),
    (
        "heartbeat does not wait for mysql",
        lambda c: services(c)["heartbeat"].pop("depends_on"),
        "services",
        "heartbeat: depends_on mysql has condition None",
    ),
    (
        "heartbeat at localhost",
        lambda c: _env("heartbeat")(c).pop("FRESHKEY_MYSQL_HOST"),
        "wiring",
        "heartbeat: FRESHKEY_MYSQL_HOST/PORT is 127.0.0.1:3306",
    ),
    (
        "heartbeat writes another table than the worker watches",
        lambda c: _env("heartbeat")(c).update(FRESHKEY_HEARTBEAT_TABLE="beats"),
        "heartbeat",
        "heartbeat: writes freshkey.beats (FRESHKEY_HEARTBEAT_DATABASE/_TABLE) but the worker's SLA "
        "watches freshkey.heartbeat",
    ),
    (
        "heartbeat slower than the worker expects",
        lambda c: _env("heartbeat")(c).update(FRESHKEY_HEARTBEAT_INTERVAL_MS="2000"),
        "heartbeat",
        "heartbeat: beats every 2000 ms (FRESHKEY_HEARTBEAT_INTERVAL_MS) but the worker expects one every",
    ),
    (
        "heartbeat table not bound",
        lambda c: [_env(n)(c).update(FRESHKEY_HEARTBEAT_DATABASE="ops") for n in ("worker", "heartbeat")],
        "heartbeat",
        "worker: ops.heartbeat is not bound in bindings.yaml",
    ),
    (
        "heartbeat table not created",
        lambda c: [_env(n)(c).update(FRESHKEY_HEARTBEAT_DATABASE="ops") for n in ("worker", "heartbeat")],
        "heartbeat",
        "mysql: no init script creates the heartbeat table ops.heartbeat",
    ),
    (
        "heartbeat account without the grant",
        lambda c: _env("heartbeat")(c).update(FRESHKEY_HEARTBEAT_USER="beater"),
        "heartbeat",
        "mysql: no init script grants 'beater' CREATE, DELETE, INSERT on freshkey.heartbeat",
    ),
    (
        "redis image on a major version only",
        lambda c: services(c)["redis"].update(image="redis:7"),
        "images",
        "redis: image 'redis:7' is not pinned to a minor version",
    ),
    (
        "grafana image latest",
        lambda c: services(c)["grafana"].update(image="grafana/grafana:latest"),
        "images",
        "grafana: image 'grafana/grafana:latest' is not pinned",
    ),
    (
        "image without a tag",
        lambda c: services(c)["mysql"].update(image="mysql"),
        "images",
        "mysql: image 'mysql' is not pinned",
    ),
    (
        "connector without a healthcheck",
        lambda c: services(c)["connector"].pop("healthcheck"),
        "healthchecks",
        "connector: healthcheck test is None, want "
        "['CMD', 'python', '/etc/freshkey/healthcheck.py', 'connector']",
    ),
    (
        "worker checks the connector",
        lambda c: services(c)["worker"]["healthcheck"].update(
            test=["CMD", "python", "/etc/freshkey/healthcheck.py", "connector"]
        ),
        "healthchecks",
        "worker: healthcheck test is",
    ),
    (
        "healthcheck script not mounted",
        lambda c: services(c)["worker"].update(
            volumes=[v for v in services(c)["worker"]["volumes"] if "healthcheck" not in v]
        ),
        "healthchecks",
        "worker: ./deploy/healthcheck.py is not mounted at /etc/freshkey/healthcheck.py",
    ),
    (
        "healthcheck script mounted writable",
        lambda c: services(c)["connector"].update(
            volumes=[
                v.replace("healthcheck.py:ro", "healthcheck.py") for v in services(c)["connector"]["volumes"]
            ]
        ),
        "healthchecks",
        "connector: the healthcheck mount ./deploy/healthcheck.py:/etc/freshkey/healthcheck.py "
        "is not read-only",
    ),
    (
        "worker with a container name",
        lambda c: services(c)["worker"].update(container_name="freshkey-worker"),
        "scale",
        "worker: container_name='freshkey-worker' stops `--scale worker=N`",
    ),
    (
        "worker on a fixed host port",
        lambda c: services(c)["worker"].update(ports=["127.0.0.1:6066:6066", "127.0.0.1::9464"]),
        "scale",
        "worker: port '127.0.0.1:6066:6066' fixes host port 6066",
    ),
    (
        "worker on a fixed host port, long syntax",
        lambda c: services(c)["worker"].update(
            ports=[{"target": 6066, "published": "6066", "host_ip": "127.0.0.1"}, "127.0.0.1::9464"]
        ),
        "scale",
        "fixes host port 6066",
    ),
    (
        "worker on a host port range",
        lambda c: services(c)["worker"].update(ports=["127.0.0.1:6066-6069:6066", "127.0.0.1::9464"]),
        "scale",
        "fixes host port 6066-6069",
    ),
    (
        "redis in cluster mode, apps not",
        lambda c: services(c)["redis"].update(
            command=["redis-server", "--save", "", "--appendonly", "no", "--cluster-enabled", "yes"]
        ),
        "redis_cluster",
        "connector: FRESHKEY_REDIS_CLUSTER=false but the redis service runs --cluster-enabled yes",
    ),
    (
        "Faust's changelog replicated otherwise",
        lambda c: _env("worker")(c).update(TOPIC_REPLICATION_FACTOR="3"),
        "kafka",
        "worker: TOPIC_REPLICATION_FACTOR=3 (Faust's own topics: the hotness table's changelog) differs",
    ),
    (
        "worker killed before its shutdown grace",
        lambda c: services(c)["worker"].pop("stop_grace_period"),
        "stop_grace",
        "worker: stop_grace_period 10 s is not above FRESHKEY_WORKER_SHUTDOWN_GRACE_S=15 s",
    ),
    (
        "connector flush longer than its grace",
        lambda c: _env("connector")(c).update(FRESHKEY_CONNECTOR_FLUSH_TIMEOUT_S="45"),
        "stop_grace",
        "connector: stop_grace_period 40 s is not above FRESHKEY_CONNECTOR_FLUSH_TIMEOUT_S=45 s",
    ),
    (
        "kafka replication factor above the brokers",
        lambda c: _env("connector")(c).update(FRESHKEY_KAFKA_REPLICATION_FACTOR="3"),
        "kafka",
        "connector: FRESHKEY_KAFKA_REPLICATION_FACTOR=3, but only 1 kafka broker(s) run",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "check", "expected"),
    [pytest.param(mutate, check, expected, id=case) for case, mutate, check, expected in BROKEN],
)
def test_checks_report_a_broken_compose_file(
    compose: Compose, mutate: Callable[[Compose], object], check: str, expected: str
) -> None:
    assert not CHECKS[check](compose), "the real compose file must pass this check first"
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = CHECKS[check](broken)
    assert any(expected in p for p in problems), f"expected a problem containing {expected!r}, got {problems}"


class _RenamedKafkaSettings(BaseSettings):
    """KafkaSettings as it would be after renaming ``bootstrap`` to ``bootstrap_servers``."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_KAFKA_", extra="ignore")

    bootstrap_servers: str = "127.0.0.1:9092"
    partitions: int = 4
    replication_factor: int = 1


def test_renaming_a_setting_breaks_the_compose_check(
    compose: Compose, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "FRESHKEY_KAFKA_BOOTSTRAP" in settings_env_names()
    renamed = tuple(_RenamedKafkaSettings if c is KafkaSettings else c for c in SETTINGS_CLASSES)
    monkeypatch.setattr(compose_linter, "SETTINGS_CLASSES", renamed)
    problems = check_env_names(compose)
    assert any("FRESHKEY_KAFKA_BOOTSTRAP is not a freshkey setting" in p for p in problems), problems
    assert any("FRESHKEY_KAFKA_BOOTSTRAP_SERVERS" in p for p in problems), "the message names the new setting"


def test_bindings_check_reports_other_tables(compose: Compose, tmp_path: Path) -> None:
    other = tmp_path / "bindings.yaml"
    other.write_text("bindings:\n  - table: freshkey_demo.assets\n    namespace: assets\n")
    broken = copy.deepcopy(compose)
    services(broken)["worker"]["volumes"] = [f"{other}:/etc/freshkey/bindings.yaml:ro"]
    problems = check_bindings_mount(broken)
    assert any(
        "binds tables ['freshkey_demo.assets'], pipeline/demo/stack.py BINDINGS binds" in p for p in problems
    ), problems
    other.write_text(demo.BINDINGS.replace("namespace: assets", "namespace: assets_v2"))
    problems = check_bindings_mount(broken)
    assert any("differs from pipeline/demo/stack.py BINDINGS" in p for p in problems), problems


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("FRESHKEY_KAFKA_PARTITIONS", "four", "FRESHKEY_KAFKA_PARTITIONS='four'"),
        ("FRESHKEY_MYSQL_PORT", "0", "FRESHKEY_MYSQL_PORT='0'"),
        ("FRESHKEY_WORKER_WEB_PORT", "http", "FRESHKEY_WORKER_WEB_PORT='http'"),
    ],
)
def test_env_value_check_reports_unparsable_values(
    compose: Compose, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    broken = copy.deepcopy(compose)
    services(broken)["worker"]["environment"][variable] = value
    problems = check_env_values(broken, monkeypatch)
    assert any(expected in p for p in problems), f"expected a problem containing {expected!r}, got {problems}"


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    cases = {
        "${SET:-d}": "x",
        "${UNSET:-d}": "d",
        "${EMPTY:-d}": "d",
        "${EMPTY-d}": "",
        "${UNSET-d}": "d",
        "$$SET": "$SET",
        "a${SET}b$SET": "axbx",
        "${SET:+y}": "y",
        "${UNSET:+y}": "",
    }
    for text, want in cases.items():
        assert interpolate(text, env) == want, text
    with pytest.raises(ValueError, match="required"):
        interpolate("${UNSET:?set it}", env)


def test_no_secret_is_baked_into_the_image_build() -> None:
    """Passwords come from the environment with local defaults, never from the Dockerfile."""
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        instruction = line.split(maxsplit=1)[:1]
        assert not (instruction in (["ENV"], ["ARG"]) and "PASSWORD" in line.upper()), f"Dockerfile: {line}"
    raw = yaml.safe_load(COMPOSE_PATH.read_text())
    for name, env in ((n, environment(s)) for n, s in raw["services"].items()):
        for variable, value in env.items():
            if variable.endswith("PASSWORD"):
                assert value is not None, f"{name}: {variable} has no value"
                assert value.startswith("${"), (
                    f"{name}: {variable} is a literal; take it from the environment (${{VAR:-default}})"
                )


def test_grafana_check_reports_a_datasource_elsewhere(compose: Compose, tmp_path: Path) -> None:
    provisioning = tmp_path / "provisioning"
    shutil.copytree(REPO_ROOT / "deploy" / "grafana" / "provisioning", provisioning)
    datasource = provisioning / "datasources" / "prometheus.yml"
    datasource.write_text(datasource.read_text().replace("http://prometheus:9090", "http://localhost:9090"))
    broken = copy.deepcopy(compose)
    services(broken)["grafana"]["volumes"][0] = f"{provisioning}:/etc/grafana/provisioning:ro"
    problems = check_grafana(broken)
    assert any("url is 'http://localhost:9090', want http://prometheus:9090" in p for p in problems), problems


def test_scrape_check_reads_static_targets(compose: Compose, tmp_path: Path) -> None:
    """Static targets count like DNS-discovered ones; a target on the wrong host does not."""
    config = tmp_path / "prometheus.yml"
    jobs = [
        {"job_name": "w", "static_configs": [{"targets": ["worker:9464"]}]},
        {"job_name": "c", "static_configs": [{"targets": ["localhost:9465"]}]},
    ]
    config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    broken = copy.deepcopy(compose)
    services(broken)["prometheus"]["volumes"] = [f"{config}:/etc/prometheus/prometheus.yml:ro"]
    problems = check_metrics_scrape(broken)
    assert not any(p.startswith("worker:") for p in problems), problems
    assert any("connector: serves metrics on 9465" in p and "connector:9465" in p for p in problems), problems


def _with_init_sql(compose: Compose, tmp_path: Path, text: str) -> Compose:
    init = tmp_path / "init.sql"
    init.write_text(text)
    broken = copy.deepcopy(compose)
    services(broken)["mysql"]["volumes"] = [f"{init}:/docker-entrypoint-initdb.d/10-freshkey.sql:ro"]
    return broken


def test_heartbeat_check_reads_the_grants_of_init_sql(compose: Compose, tmp_path: Path) -> None:
    """Without the grant the prober cannot write; a grant of ALL on the table, or of the three
    privileges on every database, is enough."""
    real = (REPO_ROOT / "deploy" / "mysql" / "init.sql").read_text()
    grant = "GRANT CREATE, INSERT, DELETE ON freshkey.* TO 'freshkey'@'%';"
    assert grant in real
    problems = check_heartbeat(_with_init_sql(compose, tmp_path, real.replace(grant, "")))
    assert any("no init script grants 'freshkey' CREATE, DELETE, INSERT" in p for p in problems), problems
    partial = real.replace(grant, "GRANT INSERT ON freshkey.* TO 'freshkey'@'%';")
    problems = check_heartbeat(_with_init_sql(compose, tmp_path, partial))
    assert any("grants 'freshkey' CREATE, DELETE on freshkey.heartbeat" in p for p in problems), problems
    for enough in (
        "GRANT ALL PRIVILEGES ON `freshkey`.`heartbeat` TO 'freshkey'@'%';",
        "GRANT CREATE, INSERT, DELETE ON *.* TO 'freshkey'@'%';",
    ):
        assert not check_heartbeat(_with_init_sql(compose, tmp_path, real.replace(grant, enough)))


def test_heartbeat_check_wants_a_precise_commit_clock(compose: Compose, tmp_path: Path) -> None:
    bindings = tmp_path / "bindings.yaml"
    text = (REPO_ROOT / "deploy" / "bindings.yaml").read_text()
    bindings.write_text(text.replace("    commit_time_column: beat_at\n", ""))
    broken = copy.deepcopy(compose)
    services(broken)["worker"]["volumes"] = [f"{bindings}:/etc/freshkey/bindings.yaml:ro"]
    problems = check_heartbeat(broken)
    assert any("binding of freshkey.heartbeat has no commit_time_column" in p for p in problems), problems


# --- profiles: the file as `--profile P --env-file deploy/P.env` makes it -------------------------------

PROFILE_SETS = [("kafka-cluster",), ("redis-cluster",), ("kafka-cluster", "redis-cluster")]


@pytest.mark.parametrize("profiles", PROFILE_SETS, ids="+".join)
def test_compose_profiles_pass_every_check(
    profiles: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    compose = load_profile(profiles)
    problems = [p for check in CHECKS.values() for p in check(compose)]
    problems += check_env_values(compose, monkeypatch)
    assert not problems, report(problems)
    running = set(services(compose))
    app = environment(services(compose)["worker"])
    if "kafka-cluster" in profiles:
        assert {"kafka", "kafka-2", "kafka-3"} <= running
        assert app["FRESHKEY_KAFKA_REPLICATION_FACTOR"] == "3"
        assert environment(services(compose)["kafka"])["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    if "redis-cluster" in profiles:
        assert {"redis", "redis-2", "redis-3", "redis-cluster-create"} <= running
        assert app["FRESHKEY_REDIS_CLUSTER"] == "true"


@pytest.mark.parametrize("profiles", PROFILE_SETS, ids="+".join)
def test_compose_profiles_follow_the_compose_specification(profiles: tuple[str, ...], tmp_path: Path) -> None:
    """The interpolated file of each profile, every service as Compose would run it, against the schema."""
    compose = load_profile(profiles)
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(compose, sort_keys=False))
    problems = check_compose_schema(path)
    assert not problems, report(problems)


@pytest.mark.parametrize(
    ("env", "profiles", "expected"),
    [
        ("kafka-cluster", (), "FRESHKEY_REPLICATION_FACTOR=3, but only 1 kafka broker(s) run"),
        ("kafka-cluster", (), "kafka-2:9092 (kafka services: ['kafka']"),
        (None, ("kafka-cluster",), "its healthcheck waits for 1 registered brokers, but 3 run"),
        ("redis-cluster", (), "a Redis Cluster needs three masters, running: ['redis']"),
        (None, ("redis-cluster",), "redis-cluster-create: runs redis-cli --cluster create, but the redis"),
    ],
    ids=[
        "kafka env alone",
        "kafka env alone bootstrap",
        "kafka profile alone",
        "redis env alone",
        "redis profile alone",
    ],
)
def test_a_profile_without_its_env_file_is_reported(
    env: str | None, profiles: tuple[str, ...], expected: str
) -> None:
    compose = load_compose(env=read_env_file(PROFILES[env]) if env else {}, profiles=profiles)
    problems = [p for check in CHECKS.values() for p in check(compose)]
    assert any(
        expected.replace("FRESHKEY_REPLICATION", "FRESHKEY_KAFKA_REPLICATION") in p for p in problems
    ), problems


def _kafka_cluster() -> Compose:
    return load_profile(("kafka-cluster",))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda c: _env("kafka-3")(c).update(CLUSTER_ID="AAAAAAAAAAAAAAAAAAAAAA"),
            "have different CLUSTER_IDs",
        ),
        (lambda c: _env("kafka-3")(c).update(KAFKA_NODE_ID="2"), "kafka nodes share a KAFKA_NODE_ID"),
        (
            lambda c: _env("kafka-2")(c).update(KAFKA_CONTROLLER_QUORUM_VOTERS="1@kafka:9093,2@kafka-2:9093"),
            "names 2@kafka-2:9093, but no running kafka node kafka-2 with KAFKA_NODE_ID 2 and the controller",
        ),
        (
            lambda c: _env("kafka")(c).update(KAFKA_CONTROLLER_QUORUM_VOTERS="1@kafka:9094"),
            "voter 1@kafka:9094, but kafka listens for controllers on '0.0.0.0:9093'",
        ),
        (
            lambda c: _env("kafka")(c).update(
                KAFKA_MIN_INSYNC_REPLICAS="4", KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="4"
            ),
            "worker: FRESHKEY_KAFKA_REPLICATION_FACTOR=3 is below KAFKA_MIN_INSYNC_REPLICAS=4",
        ),
        (lambda c: services(c).pop("kafka-3"), "its healthcheck waits for 3 registered brokers, but 2 run"),
        (
            lambda c: _env("worker")(c).update(FRESHKEY_KAFKA_BOOTSTRAP="kafka:9092,kafka-4:9092"),
            "kafka-4:9092 (kafka services:",
        ),
    ],
    ids=["cluster id", "node id", "voters", "controller port", "min isr", "broker gone", "bootstrap"],
)
def test_kafka_cluster_checks_report_a_broken_cluster(
    mutate: Callable[[Compose], object], expected: str
) -> None:
    compose = _kafka_cluster()
    assert not check_kafka(compose) and not check_wiring(compose)
    mutate(compose)
    problems = check_kafka(compose) + check_wiring(compose)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda c: services(c).pop("redis-3"),
            "a Redis Cluster needs three masters, running: ['redis', 'redis-2']",
        ),
        (
            lambda c: services(c)["redis-cluster-create"]["command"].__setitem__(
                -1, services(c)["redis-cluster-create"]["command"][-1].replace(" redis-3;", ";")
            ),
            "creates the cluster of ['redis', 'redis-2'], but the cluster nodes are",
        ),
        (
            lambda c: services(c).pop("redis-cluster-create"),
            "no running service runs redis-cli --cluster create",
        ),
        (
            lambda c: services(c)["redis"].update(healthcheck={"test": ["CMD", "redis-cli", "ping"]}),
            "its healthcheck must wait for cluster_state:ok",
        ),
        (
            lambda c: _env("worker")(c).update(FRESHKEY_REDIS_CLUSTER="false"),
            "worker: FRESHKEY_REDIS_CLUSTER=false but the redis service runs --cluster-enabled yes",
        ),
    ],
    ids=["node gone", "create list", "no create job", "healthcheck", "client not in cluster mode"],
)
def test_redis_cluster_checks_report_a_broken_cluster(
    mutate: Callable[[Compose], object], expected: str
) -> None:
    compose = copy.deepcopy(load_profile(("redis-cluster",)))
    assert not check_redis_cluster(compose)
    mutate(compose)
    problems = check_redis_cluster(compose)
    assert any(expected in p for p in problems), problems


def test_env_files_are_what_the_docs_say() -> None:
    """The header of docker-compose.yml and each env file name the same command."""
    header = COMPOSE_PATH.read_text().split("\nname:", 1)[0]
    for profile, path in PROFILES.items():
        command = f"docker compose --profile {profile} --env-file {path.relative_to(REPO_ROOT)} up --build"
        assert command in header, f"docker-compose.yml does not document `{command}`"
        assert command in path.read_text(), f"{path} does not say how it is used"
        assert read_env_file(path), f"{path} sets nothing"


# --- deploy/healthcheck.py against stand-in servers -----------------------------------------------------


class _StandIn:
    """An HTTP server on a free loopback port that answers each path with a fixed (status, body) and
    keeps the Authorization header of every request."""

    def __init__(self, routes: dict[str, tuple[int, bytes]]) -> None:
        self.routes = routes
        self.authorization: list[str | None] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.authorization.append(self.headers.get("Authorization"))
                status, body = stand_in.routes.get(self.path, (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[Callable[[dict[str, tuple[int, bytes]]], _StandIn]]:
    started: list[_StandIn] = []

    def start(routes: dict[str, tuple[int, bytes]]) -> _StandIn:
        started.append(_StandIn(routes))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_healthcheck(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``python deploy/healthcheck.py ARGS`` as the container runs it: exit status and output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FRESHKEY_")}
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode, result.stdout + result.stderr


def _exposition(connected: int | None) -> bytes:
    """/metrics as the connector serves it: the real OpenTelemetry Prometheus exporter and the
    connector's real instruments, with its connection state ``connected`` (None: no connector runs)."""
    telemetry = configure_telemetry(
        TelemetrySettings(connector_prometheus_port=0), service="connector", set_global=False
    )
    try:
        instruments = ConnectorMetrics(telemetry.meter_provider.get_meter("test"))
        instruments.start_at_zero()
        if connected is not None:
            instruments.connection_states.append(lambda: connected)
        assert telemetry.registry is not None
        return prometheus_client.generate_latest(telemetry.registry)
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize(
    ("connected", "status", "healthy", "said"),
    [
        (1, 200, True, "healthy: the connector reads the binlog and produces to Kafka"),
        (0, 200, False, "unhealthy: the connector waits to reconnect"),
        (None, 200, False, "unhealthy: no freshkey_connector_connected yet"),
        (1, 500, False, "/metrics answered 500"),
    ],
    ids=["connected", "reconnecting", "no session yet", "server error"],
)
def test_connector_healthcheck(
    stand_in: Callable[[dict[str, tuple[int, bytes]]], _StandIn],
    connected: int | None,
    status: int,
    healthy: bool,
    said: str,
) -> None:
    body = _exposition(connected)
    if connected is not None:
        assert re.search(rb"^freshkey_connector_connected(\{[^}]*\})? %d\.0$" % connected, body, re.M), body
    server = stand_in({"/metrics": (status, body)})
    code, out = run_healthcheck(
        "connector", env={"FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(server.port)}
    )
    assert (code, said in out) == (0 if healthy else 1, True), out


def test_connector_healthcheck_without_an_answer() -> None:
    port = _free_port()
    code, out = run_healthcheck("connector", env={"FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(port)})
    assert code == 1 and f"http://127.0.0.1:{port}/metrics does not answer" in out, out
    code, out = run_healthcheck("connector", env={"FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": "0"})
    assert code == 1 and "metrics are off" in out, out


@pytest.mark.parametrize(
    ("routes", "healthy", "said"),
    [
        (
            {"/freshkey/health": (200, b'{"status": "ok"}')},
            True,
            '/freshkey/health answered 200: {"status": "ok"}',
        ),
        (
            {
                "/freshkey/health": (
                    503,
                    b'{"status": "unavailable", "reasons": ["the Kafka consumer is stopped"]}',
                )
            },
            False,
            "answered 503",
        ),
        ({"/freshkey/stats": (200, b"{}")}, True, "/freshkey/health absent; /freshkey/stats answered 200"),
        ({"/freshkey/stats": (401, b"")}, False, "/freshkey/stats answered 401"),
        ({}, False, "/freshkey/stats answered 404"),
    ],
    ids=["ok", "unavailable", "older worker", "older worker, no token", "nothing"],
)
def test_worker_healthcheck(
    stand_in: Callable[[dict[str, tuple[int, bytes]]], _StandIn],
    routes: dict[str, tuple[int, bytes]],
    healthy: bool,
    said: str,
) -> None:
    server = stand_in(routes)
    code, out = run_healthcheck("worker", env={"FRESHKEY_WORKER_WEB_PORT": str(server.port)})
    assert code == (0 if healthy else 1), out
    assert said in out, out
    if not healthy and "503" in said:
        assert "the Kafka consumer is stopped" in out, "the reasons are shown"


def test_worker_healthcheck_sends_the_token_and_never_prints_it(
    stand_in: Callable[[dict[str, tuple[int, bytes]]], _StandIn],
) -> None:
    server = stand_in({"/freshkey/stats": (200, b"{}")})
    token = "s3cret-token-for-the-test"
    code, out = run_healthcheck(
        "worker", env={"FRESHKEY_WORKER_WEB_PORT": str(server.port), "FRESHKEY_WORKER_WEB_TOKEN": token}
    )
    assert code == 0, out
    assert server.authorization == [f"Bearer {token}"] * 2, "health (404 here), then stats, with the token"
    assert token not in out
    code, out = run_healthcheck("worker", env={"FRESHKEY_WORKER_WEB_PORT": str(server.port)})
    assert server.authorization[-1] is None, "no token set, no header"


def test_worker_healthcheck_without_an_answer() -> None:
    port = _free_port()
    code, out = run_healthcheck("worker", env={"FRESHKEY_WORKER_WEB_PORT": str(port)})
    assert code == 1 and f"http://127.0.0.1:{port} does not answer" in out, out


def test_healthcheck_usage_and_defaults() -> None:
    for args in ((), ("database",), ("worker", "connector")):
        code, out = run_healthcheck(*args)
        assert code == 1 and "usage: healthcheck.py connector|worker" in out, (args, out)
    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert str(WorkerSettings.model_fields["web_port"].default) == module.WORKER_WEB_PORT
    assert (
        str(TelemetrySettings.model_fields["connector_prometheus_port"].default)
        == module.CONNECTOR_METRICS_PORT
    )


# --- alert rules -------------------------------------------------------------------------------------------


def _with_rules(compose: Compose, tmp_path: Path, rules: str, *, mounted: bool = True) -> Compose:
    """The compose file with Prometheus loading ``rules`` (a copy of prometheus.yml beside it)."""
    (tmp_path / "prometheus.yml").write_text(
        (REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    )
    (tmp_path / "alerts.yml").write_text(rules)
    broken = copy.deepcopy(compose)
    services(broken)["prometheus"]["volumes"] = [
        f"{tmp_path / 'prometheus.yml'}:/etc/prometheus/prometheus.yml:ro",
        *([f"{tmp_path / 'alerts.yml'}:/etc/prometheus/alerts.yml:ro"] if mounted else []),
        "prometheus-data:/prometheus",
    ]
    return broken


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "freshkey_sla_violated)",
            "freshkey_sla_violation)",
            "uses freshkey_sla_violation, which nothing exports",
        ),
        (
            "max(freshkey_connector_checkpoint_age_seconds)",
            "max(freshkey_connector_checkpoint_age)",
            "uses freshkey_connector_checkpoint_age, which nothing exports",
        ),
        ("max by (target)", "max by (slo)", "uses label 'slo', which no series carries"),
        ('{outcome="failed"}', '{result="failed"}', "uses label 'result', which no series carries"),
        ('job="freshkey-worker"', 'job="worker"', "names job 'worker'; the scrape jobs are"),
        ("          severity: page\n", "          team: db\n", "has no severity label"),
    ],
    ids=["metric", "metric before a comparison", "grouping label", "matcher label", "job", "severity"],
)
def test_alert_rule_check_reports_a_broken_rule(
    compose: Compose, tmp_path: Path, old: str, new: str, expected: str
) -> None:
    real = (REPO_ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    assert old in real
    assert not check_alert_rules(_with_rules(compose, tmp_path, real))
    problems = check_alert_rules(_with_rules(compose, tmp_path, real.replace(old, new, 1)))
    assert any(expected in p for p in problems), problems


def test_alert_rules_must_be_mounted(compose: Compose, tmp_path: Path) -> None:
    real = (REPO_ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    problems = check_alert_rules(_with_rules(compose, tmp_path, real, mounted=False))
    assert any("rule file /etc/prometheus/alerts.yml is not mounted" in p for p in problems), problems


def test_alert_rules_cover_the_sla_and_the_processes() -> None:
    """Every SLA target is alerted on through freshkey_sla_violated, and each process when it is gone."""
    rules = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert "max by (target) (freshkey_sla_violated) == 1" in exprs.values()
    for job in ("freshkey-worker", "freshkey-connector"):
        assert any(f'up{{job="{job}"}} == 1' in e for e in exprs.values()), f"no alert when {job} is absent"
    assert "max(freshkey_connector_connected) == 0" in exprs.values()


def test_faust_reads_its_replication_factor_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker's TOPIC_REPLICATION_FACTOR in docker-compose.yml relies on: Faust declares its
    own topics (a table's changelog) with conf.topic_replication_factor, read from that variable."""
    monkeypatch.setenv("TOPIC_REPLICATION_FACTOR", "3")
    assert FreshkeyApp("compose-test", broker="kafka://127.0.0.1:1").conf.topic_replication_factor == 3
    monkeypatch.delenv("TOPIC_REPLICATION_FACTOR")
    assert FreshkeyApp("compose-test", broker="kafka://127.0.0.1:1").conf.topic_replication_factor == 1
    compose = load_profile(("kafka-cluster",))
    assert environment(services(compose)["worker"])["TOPIC_REPLICATION_FACTOR"] == "3"


def test_worker_web_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: no token (the empty value is none); set: the worker gets it, and a short one is refused."""
    assert environment(services(load_compose())["worker"])["FRESHKEY_WORKER_WEB_TOKEN"] == ""
    token = "0123456789abcdef0123456789abcdef"
    compose = load_compose(env={"FRESHKEY_WORKER_WEB_TOKEN": token})
    assert environment(services(compose)["worker"])["FRESHKEY_WORKER_WEB_TOKEN"] == token
    assert not check_env_values(compose, monkeypatch)
    problems = check_env_values(load_compose(env={"FRESHKEY_WORKER_WEB_TOKEN": "tok-Zq9"}), monkeypatch)
    assert any("FRESHKEY_WORKER_WEB_TOKEN" in p and "16 characters" in p for p in problems), problems
    assert not any("tok-Zq9" in p for p in problems), "the refused token is not shown"


@pytest.mark.parametrize(
    ("profiles", "registered", "healthy"),
    [((), 1, True), ((), 0, False), (("kafka-cluster",), 3, True), (("kafka-cluster",), 2, False)],
    ids=["one broker", "no answer", "cluster complete", "cluster short of one"],
)
def test_kafka_healthcheck_counts_registered_brokers(
    profiles: tuple[str, ...], registered: int, healthy: bool, tmp_path: Path
) -> None:
    """The kafka service's healthcheck shell, as Compose interpolates it, with kafka-broker-api-versions.sh
    replaced by a stand-in that prints what the real tool prints per broker (``host:port (id: N rack:
    null) -> (`` and its API lines)."""
    test = services(load_profile(profiles))["kafka"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    tool = "/opt/kafka/bin/kafka-broker-api-versions.sh"
    assert tool in test[1]
    stand_in = tmp_path / "kafka-broker-api-versions.sh"
    blocks = "".join(
        f"kafka-{n}:9092 (id: {n} rack: null) -> (\\n\\tProduce(0): 0 to 11 [usable: 11],\\n)\\n"
        for n in range(1, registered + 1)
    )
    stand_in.write_text(f"#!/bin/sh\nprintf '{blocks}'\n" + ("" if registered else "exit 1\n"))
    stand_in.chmod(0o755)
    result = subprocess.run(
        ["sh", "-c", test[1].replace(tool, str(stand_in))], capture_output=True, timeout=30
    )
    assert (result.returncode == 0) == healthy, result


def test_signal_table_check_reads_the_grants_of_init_sql(compose: Compose, tmp_path: Path) -> None:
    """Without UPDATE on the signal table's database `freshkey snapshot` cannot work in the stack."""
    real = (REPO_ROOT / "deploy" / "mysql" / "init.sql").read_text()
    grant = "GRANT UPDATE ON freshkey.* TO 'freshkey'@'%';"
    assert grant in real
    assert not check_signal_table(_with_init_sql(compose, tmp_path, real))
    problems = check_signal_table(_with_init_sql(compose, tmp_path, real.replace(grant, "")))
    assert any("no init script grants 'freshkey' UPDATE on freshkey.signal" in p for p in problems), problems
    everything = real.replace(grant, "GRANT ALL PRIVILEGES ON freshkey.* TO 'freshkey'@'%';")
    assert not check_signal_table(_with_init_sql(compose, tmp_path, everything))
    elsewhere = copy.deepcopy(compose)
    services(elsewhere)["connector"]["environment"]["FRESHKEY_CONNECTOR_SIGNAL_TABLE"] = "ops.signal"
    problems = check_signal_table(elsewhere)
    assert any("CREATE, DELETE, INSERT, UPDATE on ops.signal" in p for p in problems), problems
