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
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors import heartbeat as heartbeat_module
from connectors.heartbeat import HeartbeatSettings
from connectors.settings import KafkaSettings
from pipeline.demo import stack as demo
from schemas import parse_bindings
from tests.support import compose as compose_linter
from tests.support.compose import (
    APP_SERVICES,
    CHECKS,
    COMPOSE_PATH,
    HEARTBEAT_SERVICE,
    MYSQL_CLIENTS,
    REPO_ROOT,
    SETTINGS_CLASSES,
    Compose,
    check_bindings_mount,
    check_compose_schema,
    check_env_names,
    check_env_values,
    check_grafana,
    check_heartbeat,
    check_metrics_scrape,
    effective_env,
    environment,
    host_path,
    interpolate,
    is_bind_mount,
    load_compose,
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
