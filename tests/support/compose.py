"""The compose linter: docker-compose.yml read the way Compose reads it and checked against the code it
deploys (no Docker engine here). Each check returns a list of problems; tests/unit/pipeline/test_compose.py
runs them on the real file and on broken copies."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from cache_writer.settings import L3Settings, RedisSettings
from connectors.heartbeat import HeartbeatSettings
from connectors.kafka.settings import KafkaSettings
from connectors.settings import ConnectorSettings, MySQLSettings
from pipeline.demo import stack as demo
from pipeline.settings import (
    BindingSettings,
    HotnessSettings,
    ModelSettings,
    SlaSettings,
    TelemetrySettings,
    WorkerSettings,
)
from pipeline.web.settings import WebSettings
from schemas import BindingError, parse_bindings
from schemas import metrics as metric_names
from schemas.metrics import PROMETHEUS_METRIC_NAMES

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PATH = REPO_ROOT / "docker-compose.yml"
HEALTHCHECK_SCRIPT = REPO_ROOT / "deploy" / "healthcheck.py"
HEALTHCHECK_TARGET = "/etc/freshkey/healthcheck.py"
"""Where docker-compose.yml mounts deploy/healthcheck.py in the connector and the worker."""
PROFILES: dict[str, Path] = {
    "kafka-cluster": REPO_ROOT / "deploy" / "kafka-cluster.env",
    "redis-cluster": REPO_ROOT / "deploy" / "redis-cluster.env",
}
"""Each profile of docker-compose.yml and its env file (``--profile P --env-file F``)."""
SCALED_SERVICE = "worker"
"""The service `docker compose up --scale worker=N` replicates."""

SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    MySQLSettings,
    KafkaSettings,
    ConnectorSettings,
    RedisSettings,
    WorkerSettings,
    BindingSettings,
    TelemetrySettings,
    ModelSettings,
    HotnessSettings,
    SlaSettings,
    L3Settings,
    HeartbeatSettings,
    WebSettings,
)
REQUIRED_SERVICES = ("mysql", "kafka", "redis", "connector", "worker", "heartbeat", "prometheus", "grafana")
APP_SERVICES = ("connector", "worker")
"""The services that read the change flow (Kafka, Redis, the bindings)."""
HEARTBEAT_SERVICE = "heartbeat"
"""Runs ``freshkey heartbeat``: needs MySQL only."""
MYSQL_CLIENTS = (*APP_SERVICES, HEARTBEAT_SERVICE)
HEARTBEAT_WRITE_PRIVILEGES = frozenset({"CREATE", "INSERT", "DELETE"})
"""What the prober needs on its table: create it when missing, REPLACE its row (INSERT and DELETE)."""
SIGNAL_PRIVILEGES = frozenset({"CREATE", "SELECT", "INSERT", "UPDATE", "DELETE"})
"""What the connector's account needs on the signal table of snapshots (connectors/snapshot/signals.py)."""
INIT_SQL_DIR = "/docker-entrypoint-initdb.d/"
METRICS_PORT_FIELDS = {"worker": "prometheus_port", "connector": "connector_prometheus_port"}
"""The TelemetrySettings field that gives each app's /metrics port."""
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"

Compose = dict[str, Any]
Problems = list[str]


# --- reading the compose file like Compose does --------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable substitution: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``, ..."""

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["plain"]
        value, op, arg = env.get(name), match["op"], match["arg"] or ""
        # With a colon, an empty value counts as unset (as in Compose and the shell).
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in (":-", "-"):
            return arg if missing else str(value)
        if op in (":?", "?"):
            if missing:
                raise ValueError(f"{text!r}: ${{{name}}} is required ({arg})")
            return str(value)
        if op in (":+", "+"):
            return "" if missing else arg
        return value or ""

    return _VARIABLE.sub(substitute, text)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolated(value, env) for value in node]
    return node


def load_compose(
    path: Path = COMPOSE_PATH, env: Mapping[str, str] | None = None, profiles: tuple[str, ...] = ()
) -> Compose:
    """The compose file as Compose sees it with ``env`` (by default: no overrides, every default used) and
    ``profiles`` active: a service with ``profiles:`` is there only when one of them is active."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: not a YAML mapping"
    result: Compose = _interpolated(data, env or {})
    result["services"] = {
        name: service
        for name, service in (result.get("services") or {}).items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }
    return result


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file as Compose reads it for ``--env-file`` (comments and blank lines
    skipped, no quoting used here)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{path}:{number}: not KEY=VALUE"
        values[name] = value
    return values


def load_profile(names: tuple[str, ...], path: Path = COMPOSE_PATH) -> Compose:
    """The compose file with these profiles and their env files (later files win, as with several
    ``--env-file``)."""
    env: dict[str, str] = {}
    for name in names:
        env.update(read_env_file(PROFILES[name]))
    return load_compose(path, env, names)


def services(compose: Compose) -> dict[str, dict[str, Any]]:
    found = compose.get("services") or {}
    assert isinstance(found, dict), "`services:` is not a mapping"
    return found


def environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    """A service's environment, from either form (mapping, or a list of ``KEY=VALUE``)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = [item.split("=", 1) if "=" in item else [item, None] for item in raw]
        return {str(k): v for k, v in pairs}
    return {str(k): (None if v is None else str(v)) for k, v in raw.items()}


def command_args(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(arg) for arg in command]


def mysqld_options(service: Mapping[str, Any]) -> dict[str, str]:
    """``--binlog-format=ROW`` -> ``{"binlog_format": "ROW"}`` (MySQL treats - and _ alike)."""
    options: dict[str, str] = {}
    for arg in command_args(service):
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            options[name.replace("-", "_").lower()] = value if value else "ON"
    return options


def published_ports(service: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """(host ip or None for all interfaces, container port) of each ``ports:`` entry, either syntax."""
    result: list[tuple[str | None, str]] = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            result.append((entry.get("host_ip"), str(entry.get("target")).split("/")[0]))
            continue
        text = str(entry).split("/")[0]
        parts = text.rsplit(":", 2)
        host_ip = parts[0] if len(parts) == 3 and parts[0] else None
        result.append((host_ip, parts[-1]))
    return result


def volume_mounts(service: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of each ``volumes:`` entry, either syntax."""
    mounts: list[tuple[str, str, bool]] = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append((str(entry.get("source", "")), str(entry["target"]), bool(entry.get("read_only"))))
            continue
        source, _, rest = str(entry).partition(":")
        target, _, mode = rest.partition(":")
        mounts.append((source, target, "ro" in mode.split(",")))
    return mounts


def is_bind_mount(source: str) -> bool:
    return source.startswith(("./", "../", "/", "~"))


def host_path(source: str) -> Path:
    return (COMPOSE_PATH.parent / source).resolve()


# --- the settings the code really has -----------------------------------------------------------------


def settings_env_names() -> dict[str, type[BaseSettings]]:
    """Every ``FRESHKEY_*`` variable some settings class reads -> that class."""
    names: dict[str, type[BaseSettings]] = {}
    for cls in SETTINGS_CLASSES:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for field in cls.model_fields:
            names[f"{prefix}{field}".upper()] = cls
    return names


def effective_env(service: Mapping[str, Any], name: str, cls: type[BaseSettings], field: str) -> str:
    """The value the service's process sees for ``name``: its environment, else the field's default."""
    value = environment(service).get(name)
    return str(cls.model_fields[field].default) if value is None else value


# --- the checks -----------------------------------------------------------------------------------------


def check_services(compose: Compose) -> Problems:
    problems = [f"service {name!r} is missing" for name in REQUIRED_SERVICES if name not in services(compose)]
    for name in MYSQL_CLIENTS:
        service = services(compose).get(name)
        if service is None:
            continue
        want = ["freshkey", name]
        if command_args(service) != want:
            problems.append(f"{name}: command is {command_args(service)}, want {want}")
        if service.get("restart") != "unless-stopped":
            problems.append(f"{name}: restart is {service.get('restart')!r}, want 'unless-stopped'")
        depends = service.get("depends_on") or {}
        for dependency in ("mysql", "kafka", "redis") if name in APP_SERVICES else ("mysql",):
            condition = depends.get(dependency, {}).get("condition") if isinstance(depends, dict) else None
            if condition != "service_healthy":
                problems.append(
                    f"{name}: depends_on {dependency} has condition {condition!r}, want 'service_healthy'"
                )
            elif "healthcheck" not in services(compose).get(dependency, {}):
                problems.append(f"{name} waits for {dependency} to be healthy but it has no healthcheck")
    return problems


def check_mysql_binlog(compose: Compose) -> Problems:
    """The server settings ``freshkey doctor`` requires (connectors/doctor.py), set on the command line."""
    options = mysqld_options(services(compose).get("mysql", {}))
    problems: Problems = []
    if "log_bin" not in options or options.get("skip_log_bin") or options.get("disable_log_bin"):
        problems.append("mysql: binlog not enabled: add --log-bin=binlog to its command")
    want = {"binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
    for option, value in want.items():
        found = options.get(option)
        if found is None or found.upper() != value:
            flag = "--" + option.replace("_", "-")
            problems.append(f"mysql: {flag} is {found!r}, freshkey doctor wants {flag}={value}")
    server_id = options.get("server_id", "")
    if not server_id.isdigit() or int(server_id) == 0:
        problems.append(f"mysql: --server-id is {server_id or None!r}: set a non-zero id")
    for option in ("binlog_transaction_compression", "log_bin_compress"):
        if option in options and options[option].upper() not in ("OFF", "0"):
            problems.append(
                f"mysql: --{option.replace('_', '-')}={options[option]}: compressed binlog events "
                "cannot be decoded; remove it or set it OFF"
            )
    return problems


def check_env_names(compose: Compose) -> Problems:
    """Every FRESHKEY_* variable in any service names a field of one of the settings classes."""
    valid = settings_env_names()
    problems: Problems = []
    for name, service in services(compose).items():
        for variable in environment(service):
            if variable.upper().startswith("FRESHKEY_") and variable not in valid:
                close = [v for v in valid if v.split("_")[:2] == variable.split("_")[:2]]
                problems.append(
                    f"{name}: {variable} is not a freshkey setting (no settings class reads it); "
                    f"settings with that prefix: {', '.join(sorted(close)) or 'none'}"
                )
    for name in APP_SERVICES:
        if name in services(compose) and "FRESHKEY_BINDINGS" not in environment(services(compose)[name]):
            problems.append(f"{name}: FRESHKEY_BINDINGS is not set (the default path is not mounted)")
    return problems


def check_env_values(compose: Compose, monkeypatch: pytest.MonkeyPatch) -> Problems:
    """Each app service's environment, set for real, makes every settings class validate."""
    problems: Problems = []
    for name in MYSQL_CLIENTS:
        env = environment(services(compose).get(name, {}))
        with monkeypatch.context() as patch:
            for variable in [v for v in os.environ if v.upper().startswith("FRESHKEY_")]:
                patch.delenv(variable)
            for variable, value in env.items():
                if value is not None:
                    patch.setenv(variable, value)
            for cls in SETTINGS_CLASSES:
                try:
                    cls()
                except ValidationError as exc:
                    prefix = str(cls.model_config.get("env_prefix", ""))
                    for error in exc.errors(include_url=False):
                        variable = f"{prefix}{error['loc'][0]}".upper()
                        field = cls.model_fields.get(str(error["loc"][0]))
                        secret = field is not None and "SecretStr" in str(field.annotation)
                        shown = "<hidden>" if secret else repr(error.get("input"))
                        problems.append(f"{name}: {variable}={shown}: {error['msg']}")
    return problems


def check_wiring(compose: Compose) -> Problems:
    """The apps (and the heartbeat) point at the mysql service, the apps at the kafka service's internal
    listener and the redis service."""
    problems: Problems = []
    svc = services(compose)
    mysql_port = mysqld_options(svc.get("mysql", {})).get("port", "3306")
    redis_args = command_args(svc.get("redis", {}))
    redis_port = redis_args[redis_args.index("--port") + 1] if "--port" in redis_args else "6379"
    for name in MYSQL_CLIENTS:
        service = svc.get(name, {})
        host = effective_env(service, "FRESHKEY_MYSQL_HOST", MySQLSettings, "host")
        port = effective_env(service, "FRESHKEY_MYSQL_PORT", MySQLSettings, "port")
        if (host, port) != ("mysql", mysql_port):
            problems.append(
                f"{name}: FRESHKEY_MYSQL_HOST/PORT is {host}:{port}, "
                f"want the mysql service, mysql:{mysql_port}"
            )
    for name in APP_SERVICES:
        service = svc.get(name, {})
        bootstrap = effective_env(service, "FRESHKEY_KAFKA_BOOTSTRAP", KafkaSettings, "bootstrap")
        for address in bootstrap.split(","):
            address = address.strip()
            broker = address.rpartition(":")[0]
            kafka_env = environment(svc.get(broker, {})) if broker in kafka_services(compose) else {}
            advertised = _listeners(kafka_env.get("KAFKA_ADVERTISED_LISTENERS"))
            bound = _listeners(kafka_env.get("KAFKA_LISTENERS"))
            protocols = dict(
                item.split(":", 1)
                for item in (kafka_env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP") or "").split(",")
                if ":" in item
            )
            listener = next((n for n, hp in advertised.items() if hp == address), None)
            if listener is None:
                problems.append(
                    f"{name}: FRESHKEY_KAFKA_BOOTSTRAP={bootstrap} is not an advertised listener of running "
                    f"kafka services on their service names: {address} (kafka services: "
                    f"{sorted(kafka_services(compose))}; advertised by {broker or address}: {advertised})"
                )
            elif listener not in bound or bound[listener].split(":")[-1] != address.split(":")[-1]:
                problems.append(
                    f"{name}: kafka listener {listener} advertised as {address} but not bound there"
                )
            elif protocols.get(listener) != "PLAINTEXT":
                problems.append(
                    f"{name}: kafka listener {listener} is {protocols.get(listener)}, not PLAINTEXT"
                )
        url = urlsplit(effective_env(service, "FRESHKEY_REDIS_URL", RedisSettings, "url"))
        if url.scheme != "redis" or url.hostname != "redis" or str(url.port or 6379) != redis_port:
            problems.append(
                f"{name}: FRESHKEY_REDIS_URL={url.geturl()} does not point at the redis service "
                f"(redis://redis:{redis_port}/0)"
            )
    return problems


def _listeners(spec: str | None) -> dict[str, str]:
    """``PLAINTEXT://kafka:9092,HOST://...`` -> ``{"PLAINTEXT": "kafka:9092", ...}``."""
    result: dict[str, str] = {}
    for item in filter(None, (spec or "").split(",")):
        listener, _, address = item.strip().partition("://")
        result[listener] = address
    return result


def check_server_ids(compose: Compose) -> Problems:
    """The connector registers as a replica: its id must differ from the server's (doctor's check)."""
    server_id = mysqld_options(services(compose).get("mysql", {})).get("server_id")
    problems: Problems = []
    for name in APP_SERVICES:
        replica_id = effective_env(
            services(compose).get(name, {}), "FRESHKEY_MYSQL_SERVER_ID", MySQLSettings, "server_id"
        )
        if replica_id == server_id:
            problems.append(
                f"{name}: FRESHKEY_MYSQL_SERVER_ID={replica_id} equals the mysql --server-id={server_id}; "
                "the binlog reader needs an id no server or replica uses"
            )
    return problems


def check_ports(compose: Compose) -> Problems:
    """Every published port binds 127.0.0.1; the worker publishes its web port and listens on it."""
    problems: Problems = []
    for name, service in services(compose).items():
        for host_ip, container_port in published_ports(service):
            if host_ip != "127.0.0.1":
                problems.append(
                    f"{name}: port {container_port} is published on {host_ip or 'every interface'}, "
                    "want 127.0.0.1 only"
                )
    worker = services(compose).get("worker", {})
    web_port = effective_env(worker, "FRESHKEY_WORKER_WEB_PORT", WorkerSettings, "web_port")
    if web_port not in [port for _, port in published_ports(worker)]:
        problems.append(
            f"worker: FRESHKEY_WORKER_WEB_PORT={web_port} but the published container ports are "
            f"{[port for _, port in published_ports(worker)]}"
        )
    web_bind = effective_env(worker, "FRESHKEY_WORKER_WEB_BIND", WorkerSettings, "web_bind")
    if web_bind != "0.0.0.0":
        problems.append(
            f"worker: FRESHKEY_WORKER_WEB_BIND={web_bind}: inside the container it must be 0.0.0.0, "
            "or the published port reaches nothing"
        )
    return problems


def kafka_services(compose: Compose) -> dict[str, dict[str, Any]]:
    """The running services that are Kafka nodes (the apache/kafka image)."""
    return {n: s for n, s in services(compose).items() if str(s.get("image", "")).startswith("apache/kafka:")}


def _roles(service: Mapping[str, Any]) -> set[str]:
    return set(filter(None, (environment(service).get("KAFKA_PROCESS_ROLES") or "").split(",")))


def _healthcheck_text(service: Mapping[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test") or []
    return test if isinstance(test, str) else " ".join(str(part) for part in test)


def check_kafka(compose: Compose) -> Problems:
    """Each Kafka node: no topic auto-creation, a valid cluster id; together: one cluster (one id, unique
    node ids, every controller a voter and every voter a running controller listening where the voters
    say), the kafka service (the apps' dependency) healthy only once every running broker registered,
    and replication factors the running brokers can meet."""
    problems: Problems = []
    nodes = kafka_services(compose)
    if "kafka" not in nodes:
        return ["kafka: the service the apps depend on is not a running apache/kafka node"]
    if _roles(nodes["kafka"]) != {"broker", "controller"}:
        problems.append(
            f"kafka: KAFKA_PROCESS_ROLES={environment(nodes['kafka']).get('KAFKA_PROCESS_ROLES')!r}, "
            "want broker,controller"
        )
    ids: dict[str, str] = {}
    for name, node in nodes.items():
        env = environment(node)
        auto_create = env.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE")
        if str(auto_create).lower() != "false":
            problems.append(
                f"{name}: KAFKA_AUTO_CREATE_TOPICS_ENABLE={auto_create!r}, want 'false' "
                "(freshkey creates its topics with the configured partition count)"
            )
        cluster_id = env.get("CLUSTER_ID") or ""
        try:
            valid_id = len(base64.urlsafe_b64decode(cluster_id + "==")) == 16 and len(cluster_id) == 22
        except ValueError:
            valid_id = False
        if not valid_id:
            problems.append(f"{name}: CLUSTER_ID={cluster_id!r} is not a base64url-encoded 16-byte UUID")
        ids[name] = env.get("KAFKA_NODE_ID") or ""
    if len({environment(n).get("CLUSTER_ID") for n in nodes.values()}) > 1:
        problems.append(
            f"kafka nodes {sorted(nodes)} have different CLUSTER_IDs: they would not form one cluster"
        )
    if len(set(ids.values())) != len(ids):
        problems.append(f"kafka nodes share a KAFKA_NODE_ID: {ids}")
    for name, node in nodes.items():
        env = environment(node)
        voters = [
            v.strip() for v in (env.get("KAFKA_CONTROLLER_QUORUM_VOTERS") or "").split(",") if v.strip()
        ]
        for voter in voters:
            node_id, _, address = voter.partition("@")
            host, _, port = address.rpartition(":")
            target = nodes.get(host)
            controller = _listeners((environment(target) if target else {}).get("KAFKA_LISTENERS")).get(
                (env.get("KAFKA_CONTROLLER_LISTENER_NAMES") or "CONTROLLER").split(",")[0], ""
            )
            if target is None or "controller" not in _roles(target) or ids.get(host) != node_id:
                problems.append(
                    f"{name}: KAFKA_CONTROLLER_QUORUM_VOTERS names {voter}, but no running kafka node "
                    f"{host} with KAFKA_NODE_ID {node_id} and the controller role"
                )
            elif controller.rpartition(":")[2] != port:
                problems.append(
                    f"{name}: voter {voter}, but {host} listens for controllers on {controller!r}"
                )
        if "controller" in _roles(node) and f"{ids[name]}@{name}" not in {
            v.rpartition(":")[0] for v in voters
        }:
            problems.append(
                f"{name}: a controller missing from its own KAFKA_CONTROLLER_QUORUM_VOTERS {voters}"
            )
    brokers = [n for n, node in nodes.items() if "broker" in _roles(node)]
    wait = re.search(r"-ge (\d+)", _healthcheck_text(nodes["kafka"]))
    if wait is None or int(wait[1]) != len(brokers):
        problems.append(
            f"kafka: its healthcheck waits for {wait[1] if wait else 'no count of'} registered brokers, "
            f"but {len(brokers)} run ({', '.join(brokers)}): set KAFKA_BROKERS"
        )
    kafka_env = environment(nodes["kafka"])
    factors = {
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": kafka_env.get("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"),
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": kafka_env.get(
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"
        ),
    }
    for name in APP_SERVICES:
        factors[f"{name}: FRESHKEY_KAFKA_REPLICATION_FACTOR"] = effective_env(
            services(compose).get(name, {}),
            "FRESHKEY_KAFKA_REPLICATION_FACTOR",
            KafkaSettings,
            "replication_factor",
        )
    worker = services(compose).get("worker", {})
    faust_factor = environment(worker).get("TOPIC_REPLICATION_FACTOR") or "1"
    if faust_factor != factors["worker: FRESHKEY_KAFKA_REPLICATION_FACTOR"]:
        problems.append(
            f"worker: TOPIC_REPLICATION_FACTOR={faust_factor} (Faust's own topics: the hotness table's "
            "changelog) differs from its FRESHKEY_KAFKA_REPLICATION_FACTOR="
            f"{factors['worker: FRESHKEY_KAFKA_REPLICATION_FACTOR']}"
        )
    min_isr = int(kafka_env.get("KAFKA_MIN_INSYNC_REPLICAS") or 1)
    for what, value in factors.items():
        factor = int(value or 1)
        if factor > len(brokers):
            problems.append(f"{what}={factor}, but only {len(brokers)} kafka broker(s) run")
        elif min_isr > factor:
            problems.append(
                f"{what}={factor} is below KAFKA_MIN_INSYNC_REPLICAS={min_isr}: no acks=all write succeeds"
            )
    return problems


def _redis_args(service: Mapping[str, Any]) -> dict[str, str]:
    args = command_args(service)
    if args[:1] != ["redis-server"]:
        return {}
    return {
        a[2:]: (args[i + 1] if i + 1 < len(args) else "") for i, a in enumerate(args) if a.startswith("--")
    }


def check_redis_cluster(compose: Compose) -> Problems:
    """FRESHKEY_REDIS_CLUSTER matches the redis service's cluster mode; a cluster has at least three
    running cluster-enabled masters, all of them in the create job's list, and the redis service (the
    apps' dependency) is healthy only once the cluster serves every slot."""
    svc = services(compose)
    problems: Problems = []
    cluster_nodes = sorted(n for n, s in svc.items() if _redis_args(s).get("cluster-enabled") == "yes")
    redis_mode = _redis_args(svc.get("redis", {})).get("cluster-enabled", "no")
    for name in APP_SERVICES:
        flag = effective_env(svc.get(name, {}), "FRESHKEY_REDIS_CLUSTER", RedisSettings, "cluster")
        if (flag.lower() in ("true", "1", "yes")) != (redis_mode == "yes"):
            problems.append(
                f"{name}: FRESHKEY_REDIS_CLUSTER={flag} but the redis service runs "
                f"--cluster-enabled {redis_mode}"
            )
    creators = [n for n, s in svc.items() if "--cluster create" in " ".join(command_args(s))]
    if redis_mode != "yes":
        problems += [
            f"{name}: runs redis-cli --cluster create, but the redis service is standalone "
            "(--cluster-enabled no): the job fails; use the profile's env file (REDIS_CLUSTER_ENABLED=yes)"
            for name in creators
        ]
        return problems
    if len(cluster_nodes) < 3:
        problems.append(f"redis: a Redis Cluster needs three masters, running: {cluster_nodes}")
    if not creators:
        problems.append("redis: cluster mode, but no running service runs redis-cli --cluster create")
    for name in creators:
        listed = re.search(r"for host in ([^;]+);", " ".join(command_args(svc[name])))
        hosts = sorted(listed[1].split()) if listed else []
        if hosts != cluster_nodes:
            problems.append(
                f"{name}: creates the cluster of {hosts}, but the cluster nodes are {cluster_nodes}"
            )
    if "cluster_state:ok" not in _healthcheck_text(svc.get("redis", {})):
        problems.append("redis: in cluster mode its healthcheck must wait for cluster_state:ok")
    return problems


_PINNED = re.compile(r"^[^:@]+:v?\d+\.\d+(\.\d+)*([-.][A-Za-z0-9.-]+)?$")


def check_images(compose: Compose) -> Problems:
    """Every image pulled (and the Dockerfile's base) is pinned to a minor version or finer: ``redis:7``
    or ``latest`` changes under a running deployment at the next pull."""
    problems: Problems = []
    for name, service in services(compose).items():
        image = str(service.get("image", ""))
        if "build" in service:
            continue
        if not _PINNED.match(image):
            problems.append(f"{name}: image {image!r} is not pinned to a minor version (e.g. redis:7.4)")
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM ") and not _PINNED.match(line.split()[1]):
            problems.append(f"Dockerfile: {line!r} is not pinned to a minor version")
    return problems


def check_healthchecks(compose: Compose) -> Problems:
    """The connector and the worker run deploy/healthcheck.py, mounted read-only where the test runs it."""
    problems: Problems = []
    for name in APP_SERVICES:
        service = services(compose).get(name, {})
        want = ["CMD", "python", HEALTHCHECK_TARGET, name]
        test = (service.get("healthcheck") or {}).get("test")
        if test != want:
            problems.append(f"{name}: healthcheck test is {test!r}, want {want}")
        mount = next((m for m in volume_mounts(service) if m[1] == HEALTHCHECK_TARGET), None)
        if mount is None or not is_bind_mount(mount[0]) or host_path(mount[0]) != HEALTHCHECK_SCRIPT:
            problems.append(f"{name}: ./deploy/healthcheck.py is not mounted at {HEALTHCHECK_TARGET}")
        elif not mount[2]:
            problems.append(f"{name}: the healthcheck mount {mount[0]}:{mount[1]} is not read-only (add :ro)")
    return problems


def duration_s(text: str) -> float:
    """A compose duration (``40s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


STOP_GRACE_FIELDS: dict[str, tuple[type[BaseSettings], str, str]] = {
    "worker": (WorkerSettings, "shutdown_grace_s", "FRESHKEY_WORKER_SHUTDOWN_GRACE_S"),
    "connector": (ConnectorSettings, "flush_timeout_s", "FRESHKEY_CONNECTOR_FLUSH_TIMEOUT_S"),
}
"""The setting that bounds how long each app takes to stop after SIGTERM."""


def check_stop_grace(compose: Compose) -> Problems:
    """Docker waits stop_grace_period (default 10 s) after SIGTERM, then kills: longer than the app's own
    bound on a clean stop, or a stop becomes a kill (the worker's partitions then wait a session
    timeout; the connector loses its last acknowledgements and replays)."""
    problems: Problems = []
    for name, (cls, field, variable) in STOP_GRACE_FIELDS.items():
        service = services(compose).get(name, {})
        grace = duration_s(str(service.get("stop_grace_period", "10s")))
        needed = float(effective_env(service, variable, cls, field))
        if grace <= needed:
            problems.append(
                f"{name}: stop_grace_period {grace:g} s is not above {variable}={needed:g} s: "
                "Docker kills it before it stops cleanly"
            )
    return problems


def check_scale(compose: Compose) -> Problems:
    """``docker compose up --scale worker=N`` starts N replicas: no fixed container name or hostname, and
    no fixed host port (two replicas cannot bind one; host port ranges are not shared out by Compose v2)."""
    service = services(compose).get(SCALED_SERVICE, {})
    problems: Problems = []
    for key in ("container_name", "hostname"):
        if key in service:
            problems.append(f"{SCALED_SERVICE}: {key}={service[key]!r} stops `--scale {SCALED_SERVICE}=N`")
    for entry in service.get("ports") or []:
        host_port = (
            entry.get("published")
            if isinstance(entry, dict)
            else (str(entry).split("/")[0].rsplit(":", 2)[-2] if ":" in str(entry) else "")
        )
        if host_port:
            problems.append(
                f"{SCALED_SERVICE}: port {entry!r} fixes host port {host_port}: a second replica cannot bind "
                "it; publish 127.0.0.1::<container port>"
            )
    return problems


def check_bindings_mount(compose: Compose) -> Problems:
    """The file mounted at FRESHKEY_BINDINGS exists, parses, is read-only and is the demo's bindings."""
    problems: Problems = []
    want = parse_bindings(demo.BINDINGS, source="pipeline.demo.stack.BINDINGS")
    for name in APP_SERVICES:
        service = services(compose).get(name, {})
        target = effective_env(service, "FRESHKEY_BINDINGS", BindingSettings, "bindings")
        mount = next((m for m in volume_mounts(service) if m[1] == target), None)
        if mount is None:
            problems.append(f"{name}: nothing is mounted at FRESHKEY_BINDINGS={target}")
            continue
        source, _, read_only = mount
        if not read_only:
            problems.append(f"{name}: the bindings mount {source}:{target} is not read-only (add :ro)")
        path = host_path(source)
        if not is_bind_mount(source) or not path.is_file():
            problems.append(f"{name}: the bindings mount source {source} is not a file in the repository")
            continue
        try:
            got = parse_bindings(path.read_bytes(), source=str(path))
        except BindingError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if [b.table for b in got.bindings] != [b.table for b in want.bindings]:
            problems.append(
                f"{name}: {source} binds tables {[b.table for b in got.bindings]}, "
                f"pipeline/demo/stack.py BINDINGS binds {[b.table for b in want.bindings]}"
            )
        elif got != want:
            problems.append(f"{name}: {source} differs from pipeline/demo/stack.py BINDINGS: {got} != {want}")
    return problems


def check_referenced_files(compose: Compose) -> Problems:
    """Bind-mount sources and build contexts/Dockerfiles exist; named volumes are declared."""
    problems: Problems = []
    declared = set((compose.get("volumes") or {}).keys())
    for name, service in services(compose).items():
        for source, target, _ in volume_mounts(service):
            if is_bind_mount(source):
                if not host_path(source).exists():
                    problems.append(f"{name}: volume source {source} (mounted at {target}) does not exist")
            elif source and source not in declared:
                problems.append(f"{name}: named volume {source!r} is not declared under top-level volumes:")
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            if not host_path(context).is_dir():
                problems.append(f"{name}: build context {context} is not a directory")
            elif not (host_path(context) / dockerfile).is_file():
                problems.append(f"{name}: build Dockerfile {context}/{dockerfile} does not exist")
    return problems


def _mount_source(service: Mapping[str, Any], target: str) -> Path | None:
    """The host path bind-mounted at ``target`` (or at a directory above it) in ``service``."""
    for source, mounted_at, _ in volume_mounts(service):
        if is_bind_mount(source) and (
            target == mounted_at or target.startswith(mounted_at.rstrip("/") + "/")
        ):
            return host_path(source) / Path(target).relative_to(mounted_at)
    return None


def _option(service: Mapping[str, Any], name: str, default: str) -> str:
    """``--name=value`` from a service's command."""
    for arg in command_args(service):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return default


def _scrape_targets(config: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(host, port) of every static or DNS-discovered scrape target."""
    targets: set[tuple[str, str]] = set()
    for job in config.get("scrape_configs") or []:
        for static in job.get("static_configs") or []:
            for target in static.get("targets") or []:
                host, _, port = str(target).rpartition(":")
                targets.add((host, port))
        for dns in job.get("dns_sd_configs") or []:
            if str(dns.get("type", "SRV")).upper() in ("A", "AAAA"):
                targets.update((str(name), str(dns.get("port"))) for name in dns.get("names") or [])
    return targets


def check_metrics_scrape(compose: Compose) -> Problems:
    """Each app serves /metrics on a port bound beyond loopback, and Prometheus scrapes that port."""
    problems: Problems = []
    svc = services(compose)
    prometheus = svc.get("prometheus", {})
    config_path = _option(prometheus, "config.file", "/etc/prometheus/prometheus.yml")
    source = _mount_source(prometheus, config_path)
    if source is None or not source.is_file():
        return [f"prometheus: nothing from the repository is mounted at --config.file={config_path}"]
    targets = _scrape_targets(yaml.safe_load(source.read_text()) or {})
    for name, field in METRICS_PORT_FIELDS.items():
        service = svc.get(name, {})
        variable = f"FRESHKEY_TELEMETRY_{field.upper()}"
        port = effective_env(service, variable, TelemetrySettings, field)
        bind = effective_env(
            service, "FRESHKEY_TELEMETRY_PROMETHEUS_BIND", TelemetrySettings, "prometheus_bind"
        )
        if port == "0":
            problems.append(f"{name}: {variable}=0 turns its metrics off")
        if bind != "0.0.0.0":
            problems.append(
                f"{name}: FRESHKEY_TELEMETRY_PROMETHEUS_BIND={bind}: inside the container it must be "
                "0.0.0.0, or Prometheus cannot scrape it"
            )
        if (name, port) not in targets:
            problems.append(
                f"{name}: serves metrics on {port} ({variable}) but no scrape job in "
                f"{source.name} reaches {name}:{port} (targets: {sorted(targets)})"
            )
    return problems


EXPORTED_LABELS = frozenset(
    str(getattr(metric_names, n)).replace(".", "_") for n in dir(metric_names) if n.startswith("ATTR_")
) | {"job", "instance", "le", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
"""Labels a rule may use: the code's attributes as Prometheus writes them, and what Prometheus adds."""
_MATCHERS = re.compile(r"\{([^}]*)\}")
_GROUP_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABELS_IN_TEXT = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")


def check_alert_rules(compose: Compose) -> Problems:
    """Every rule file Prometheus loads is mounted from the repository; each alert has an expression and
    a severity, and uses only series the worker or the connector export (or Prometheus's ``up``), labels
    they carry, and scrape jobs prometheus.yml defines."""
    prometheus = services(compose).get("prometheus", {})
    config_path = _option(prometheus, "config.file", "/etc/prometheus/prometheus.yml")
    source = _mount_source(prometheus, config_path)
    if source is None or not source.is_file():
        return []  # reported by check_metrics_scrape
    config = yaml.safe_load(source.read_text()) or {}
    jobs = {str(job.get("job_name")) for job in config.get("scrape_configs") or []}
    problems: Problems = []
    rule_files = config.get("rule_files") or []
    if not rule_files:
        problems.append(f"prometheus: {source.name} loads no rule_files: nothing alerts")
    for rule_file in rule_files:
        path = _mount_source(prometheus, str(rule_file))
        if path is None or not path.is_file():
            problems.append(f"prometheus: rule file {rule_file} is not mounted from the repository")
            continue
        groups = (yaml.safe_load(path.read_text()) or {}).get("groups") or []
        for rule in [r for g in groups for r in g.get("rules") or []]:
            name, expr = rule.get("alert", "?"), str(rule.get("expr", ""))
            if not expr:
                problems.append(f"{path.name}: alert {name} has no expr")
            if (rule.get("labels") or {}).get("severity") not in ("page", "warning"):
                problems.append(f"{path.name}: alert {name} has no severity label (page or warning)")
            without_strings = re.sub(r'"[^"]*"', '""', expr)
            for series in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*[{\[)=<>!]|\s*$)", without_strings):
                if series.startswith("freshkey_") and series not in PROMETHEUS_METRIC_NAMES:
                    problems.append(f"{path.name}: alert {name} uses {series}, which nothing exports")
            labels = [
                m.split("=")[0].strip(" !~") for group in _MATCHERS.findall(expr) for m in group.split(",")
            ]
            labels += [label.strip() for group in _GROUP_BY.findall(expr) for label in group.split(",")]
            text = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
            labels += _LABELS_IN_TEXT.findall(text)
            for label in filter(None, labels):
                if label not in EXPORTED_LABELS:
                    problems.append(
                        f"{path.name}: alert {name} uses label {label!r}, which no series carries"
                    )
            for job in re.findall(r'job\s*=\s*"([^"]*)"', expr):
                if job not in jobs:
                    problems.append(
                        f"{path.name}: alert {name} names job {job!r}; the scrape jobs are {sorted(jobs)}"
                    )
    return problems


def check_grafana(compose: Compose) -> Problems:
    """Provisioning mounted; the datasource is the prometheus service; the dashboards dir is mounted."""
    problems: Problems = []
    svc = services(compose)
    grafana = svc.get("grafana", {})
    provisioning = _mount_source(grafana, GRAFANA_PROVISIONING)
    if provisioning is None or not provisioning.is_dir():
        return [f"grafana: no repository directory is mounted at {GRAFANA_PROVISIONING}"]
    listen = _option(svc.get("prometheus", {}), "web.listen-address", ":9090")
    want_url = f"http://prometheus:{listen.rpartition(':')[2]}"
    sources = [
        d
        for f in sorted((provisioning / "datasources").glob("*.y*ml"))
        for d in (yaml.safe_load(f.read_text()) or {}).get("datasources") or []
    ]
    prometheus_sources = [d for d in sources if d.get("type") == "prometheus"]
    if not prometheus_sources:
        problems.append(f"grafana: no prometheus datasource under {provisioning / 'datasources'}")
    for source in prometheus_sources:
        if str(source.get("url", "")).rstrip("/") != want_url:
            problems.append(
                f"grafana: datasource {source.get('name')!r} url is {source.get('url')!r}, want {want_url}"
            )
    providers = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for p in (yaml.safe_load(f.read_text()) or {}).get("providers") or []
    ]
    if not providers:
        problems.append(f"grafana: no dashboards provider under {provisioning / 'dashboards'}")
    for provider in providers:
        path = str((provider.get("options") or {}).get("path", ""))
        mounted = _mount_source(grafana, path)
        if mounted is None or not any(mounted.glob("*.json")):
            problems.append(
                f"grafana: dashboards provider reads {path}, where no directory of dashboards is mounted"
            )
    home = environment(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        mounted = _mount_source(grafana, home)
        if mounted is None or not mounted.is_file():
            problems.append(
                f"grafana: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH={home} is not a mounted file"
            )
    return problems


def sql_statements(text: str) -> list[str]:
    """The statements of a SQL script, comments dropped, whitespace collapsed."""
    without_comments = re.sub(r"--[^\n]*", "", text)
    return [" ".join(s.split()) for s in without_comments.split(";") if s.strip()]


def init_statements(compose: Compose) -> list[str]:
    """Every statement of the SQL scripts mounted into the mysql service's init directory."""
    statements: list[str] = []
    for source, target, _ in volume_mounts(services(compose).get("mysql", {})):
        if is_bind_mount(source) and target.startswith(INIT_SQL_DIR) and target.endswith(".sql"):
            path = host_path(source)
            if path.is_file():
                statements += sql_statements(path.read_text())
    return statements


_GRANT = re.compile(r"^GRANT (?P<privileges>.+?) ON (?P<object>\S+) TO '(?P<user>[^']*)'", re.IGNORECASE)


def granted(
    statements: list[str],
    user: str,
    database: str,
    table: str,
    all_privileges: frozenset[str] = HEARTBEAT_WRITE_PRIVILEGES,
) -> set[str]:
    """Privileges the statements grant ``user`` on ``database.table`` (directly, or on the database or
    everything); ``ALL [PRIVILEGES]`` counts as ``all_privileges`` (what the caller needs)."""
    covering = {"*.*", f"{database}.*", f"{database}.{table}"}
    found: set[str] = set()
    for statement in statements:
        match = _GRANT.match(statement)
        if match is None or match["user"] != user or match["object"].replace("`", "") not in covering:
            continue
        privileges = {p.strip().upper() for p in match["privileges"].split(",")}
        found |= all_privileges if privileges & {"ALL", "ALL PRIVILEGES"} else privileges
    return found


def _heartbeat_env(service: Mapping[str, Any], field: str) -> str:
    return effective_env(service, f"FRESHKEY_HEARTBEAT_{field.upper()}", HeartbeatSettings, field)


def check_heartbeat(compose: Compose) -> Problems:
    """The heartbeat service writes the table the worker's SLA watches, at the interval it expects; the
    worker's bindings bind that table with a precise commit clock; an init script creates it and lets
    the heartbeat's account write it (the prober runs CREATE ... IF NOT EXISTS and REPLACE)."""
    svc = services(compose)
    heartbeat = svc.get(HEARTBEAT_SERVICE)
    if heartbeat is None:
        return [
            f"service {HEARTBEAT_SERVICE!r} is missing: nothing writes heartbeats, so the SLA's "
            "heartbeat target never has data"
        ]
    worker = svc.get("worker", {})
    problems: Problems = []
    database, table = _heartbeat_env(heartbeat, "database"), _heartbeat_env(heartbeat, "table")
    watched = f"{_heartbeat_env(worker, 'database')}.{_heartbeat_env(worker, 'table')}"
    if f"{database}.{table}" != watched:
        problems.append(
            f"heartbeat: writes {database}.{table} (FRESHKEY_HEARTBEAT_DATABASE/_TABLE) but the worker's "
            f"SLA watches {watched}"
        )
    beats, expected = _heartbeat_env(heartbeat, "interval_ms"), _heartbeat_env(worker, "interval_ms")
    if float(beats) != float(expected):
        problems.append(
            f"heartbeat: beats every {beats} ms (FRESHKEY_HEARTBEAT_INTERVAL_MS) but the worker expects "
            f"one every {expected} ms"
        )
    target = effective_env(worker, "FRESHKEY_BINDINGS", BindingSettings, "bindings")
    source = _mount_source(worker, target)
    if source is not None and source.is_file():
        try:
            bindings = parse_bindings(source.read_bytes(), source=str(source))
        except BindingError:
            bindings = None  # reported by check_bindings_mount
        binding = None if bindings is None else bindings.for_table(database, table)
        if bindings is not None and binding is None:
            problems.append(
                f"worker: {database}.{table} is not bound in {source.name}: the SLA finds no heartbeat "
                "namespace (bind it with version_column and commit_time_column beat_at)"
            )
        elif binding is not None and binding.commit_time_column is None:
            problems.append(
                f"worker: the binding of {database}.{table} has no commit_time_column: heartbeats get the "
                "binlog's one-second clock, which the SLA heartbeat target ignores"
            )
    statements = init_statements(compose)
    creates = re.compile(
        rf"^CREATE TABLE (IF NOT EXISTS )?`?{re.escape(database)}`?\.`?{re.escape(table)}`? ", re.IGNORECASE
    )
    if not any(creates.match(statement) for statement in statements):
        problems.append(f"mysql: no init script creates the heartbeat table {database}.{table}")
    # The prober's own account when set, else the MySQL one (connectors.heartbeat).
    user = environment(heartbeat).get("FRESHKEY_HEARTBEAT_USER") or effective_env(
        heartbeat, "FRESHKEY_MYSQL_USER", MySQLSettings, "user"
    )
    missing = HEARTBEAT_WRITE_PRIVILEGES - granted(statements, user, database, table)
    if missing:
        problems.append(
            f"mysql: no init script grants {user!r} {', '.join(sorted(missing))} on {database}.{table}, "
            f"which `freshkey heartbeat` needs (GRANT CREATE, INSERT, DELETE ON {database}.* TO '{user}'@'%')"
        )
    return problems


def check_signal_table(compose: Compose) -> Problems:
    """The connector's account may create and write the signal table of snapshots
    (FRESHKEY_CONNECTOR_SIGNAL_TABLE): an init script grants it what ``freshkey doctor`` asks for."""
    connector = services(compose).get("connector", {})
    table = effective_env(connector, "FRESHKEY_CONNECTOR_SIGNAL_TABLE", ConnectorSettings, "signal_table")
    database, _, name = table.partition(".")
    user = effective_env(connector, "FRESHKEY_MYSQL_USER", MySQLSettings, "user")
    missing = SIGNAL_PRIVILEGES - granted(init_statements(compose), user, database, name, SIGNAL_PRIVILEGES)
    if not missing:
        return []
    return [
        f"mysql: no init script grants {user!r} {', '.join(sorted(missing))} on {table}, the signal table "
        f"of `freshkey snapshot` (GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON {database}.* "
        f"TO '{user}'@'%')"
    ]


def check_compose_schema(path: Path = COMPOSE_PATH) -> Problems:
    """The file against the compose specification's JSON schema (check-jsonschema's vendored copy, so
    offline): what ``docker compose config`` would refuse before anything starts."""
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        return ["check-jsonschema is not installed: pip install -e '.[dev]'"]
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode == 0:
        return []
    return [f"not valid under the compose specification:\n{result.stdout}{result.stderr}".rstrip()]


CHECKS: dict[str, Callable[[Compose], Problems]] = {
    "services": check_services,
    "mysql_binlog": check_mysql_binlog,
    "env_names": check_env_names,
    "wiring": check_wiring,
    "server_ids": check_server_ids,
    "ports": check_ports,
    "kafka": check_kafka,
    "redis_cluster": check_redis_cluster,
    "images": check_images,
    "healthchecks": check_healthchecks,
    "scale": check_scale,
    "stop_grace": check_stop_grace,
    "bindings_mount": check_bindings_mount,
    "referenced_files": check_referenced_files,
    "metrics_scrape": check_metrics_scrape,
    "grafana": check_grafana,
    "alert_rules": check_alert_rules,
    "heartbeat": check_heartbeat,
    "signal_table": check_signal_table,
}


def report(problems: Problems) -> str:
    return "docker-compose.yml:\n" + "\n".join(f"  - {p}" for p in problems)
