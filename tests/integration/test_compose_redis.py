"""The redis services of docker-compose.yml, run for real without Docker: the same redis-server command
lines, the same healthcheck and the same ``redis-cluster-create`` script, each taken from the compose file
as Compose interpolates it (default, and profile ``redis-cluster`` with deploy/redis-cluster.env).

Without Docker there is no network of service names, so two small shims stand in for it on ``PATH``:
``getent hosts <service>`` answers a made-up address per service, and ``redis-cli`` sends ``-h <service>``,
a made-up ``<address>:6379`` and a bare call (the container's own server) to the test's servers on
loopback. Everything else (the shell logic, redis-cli's replies, ``--cluster create``) is the real thing.

- standalone: the redis service's healthcheck passes on its command line and fails once it is stopped;
- cluster: the healthcheck fails while the three cluster-enabled nodes have no slots (what keeps the
  connector and the worker waiting), the create job forms the cluster (3 masters, 16384 slots), the
  healthcheck then passes, and the job run again leaves the formed cluster alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.compose import command_args, load_compose, load_profile, services

pytestmark = pytest.mark.integration

REDIS_CLI = shutil.which("redis-cli") or ""
REDIS_SERVER = shutil.which("redis-server") or ""

_REDIS_CLI_SHIM = """#!{python}
import os, sys
ports = {ports!r}
addresses = {addresses!r}
args, out, host = sys.argv[1:], [], None
i = 0
while i < len(args):
    arg = args[i]
    if arg == "-h":
        host = args[i + 1]
        i += 2
        continue
    if arg in addresses:
        arg = "127.0.0.1:%d" % ports[addresses[arg]]
    out.append(arg)
    i += 1
port = ports[host or "redis"]
os.execv({redis_cli!r}, [{redis_cli!r}, "-h", "127.0.0.1", "-p", str(port), *out])
"""

_GETENT_SHIM = """#!{python}
import sys
names = {names!r}
if sys.argv[1:2] != ["hosts"] or sys.argv[2] not in names:
    sys.exit(2)
print("%s       %s" % (names[sys.argv[2]], sys.argv[2]))
"""


def _free_port() -> int:
    """A free loopback port P with P + 10000 (a cluster node's bus port) free as well."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port P with P + 10000 free")


class ComposeRedis:
    """The compose file's redis services as local processes, with the shims on ``PATH``."""

    def __init__(self, compose: dict[str, Any], workdir: Path) -> None:
        assert REDIS_CLI and REDIS_SERVER
        self.compose = compose
        self.nodes = sorted(
            n for n, s in services(compose).items() if command_args(s)[:1] == ["redis-server"]
        )
        self.ports = {name: _free_port() for name in self.nodes}
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        bin_dir = workdir / "bin"
        bin_dir.mkdir(parents=True)
        names = {name: f"10.77.0.{i + 1}" for i, name in enumerate(self.nodes)}
        addresses = {f"{address}:6379": name for name, address in names.items()}
        shims = {
            "redis-cli": _REDIS_CLI_SHIM.format(
                python=sys.executable, ports=self.ports, addresses=addresses, redis_cli=REDIS_CLI
            ),
            "getent": _GETENT_SHIM.format(python=sys.executable, names=names),
        }
        for name, text in shims.items():
            path = bin_dir / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def start(self, name: str) -> None:
        """The service's own command line, on a loopback port and a private directory."""
        args = command_args(services(self.compose)[name])
        directory = self.workdir / name
        directory.mkdir(exist_ok=True)
        command = [REDIS_SERVER, *args[1:], "--port", str(self.ports[name]), "--bind", "127.0.0.1"]
        command += ["--dir", str(directory), "--logfile", str(directory / "redis.log")]
        self.processes[name] = subprocess.Popen(command, start_new_session=True)
        deadline = time.monotonic() + 15
        while self.cli(name, "ping") != "PONG":
            assert self.processes[name].poll() is None, (directory / "redis.log").read_text()
            assert time.monotonic() < deadline, f"{name} does not answer PING"
            time.sleep(0.05)

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def cli(self, name: str, *args: str) -> str:
        assert REDIS_CLI
        result = subprocess.run(
            [REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.ports[name]), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return result.stdout.strip()

    def healthcheck(self, name: str) -> subprocess.CompletedProcess[str]:
        """The service's healthcheck as Docker runs it (CMD-SHELL: ``sh -c``), in its "container"."""
        test = services(self.compose)[name]["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL", test
        return subprocess.run(["sh", "-c", test[1]], env=self.env, capture_output=True, text=True, timeout=30)

    def run_job(self, name: str) -> subprocess.CompletedProcess[str]:
        """A one-shot service's command (``sh -ec <script>``)."""
        return subprocess.run(
            command_args(services(self.compose)[name]),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def compose_redis(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], ComposeRedis]]:
    if not (REDIS_CLI and REDIS_SERVER):
        pytest.fail("redis-server and redis-cli are needed (apt-get install -y redis-server)")
    made: list[ComposeRedis] = []

    def make(compose: dict[str, Any]) -> ComposeRedis:
        made.append(ComposeRedis(compose, tmp_path / f"stack{len(made)}"))
        return made[-1]

    yield make
    for stack in made:
        stack.close()


def test_standalone_redis_healthcheck(compose_redis: Callable[[dict[str, Any]], ComposeRedis]) -> None:
    stack = compose_redis(load_compose())
    assert stack.nodes == ["redis"]
    stack.start("redis")
    assert stack.cli("redis", "config", "get", "cluster-enabled").splitlines() == ["cluster-enabled", "no"]
    healthy = stack.healthcheck("redis")
    assert healthy.returncode == 0, healthy
    stack.stop("redis")
    assert stack.healthcheck("redis").returncode != 0, "a stopped server must be unhealthy"


def test_redis_cluster_profile_forms_a_cluster(
    compose_redis: Callable[[dict[str, Any]], ComposeRedis],
) -> None:
    stack = compose_redis(load_profile(("redis-cluster",)))
    assert stack.nodes == ["redis", "redis-2", "redis-3"]
    for name in stack.nodes:
        stack.start(name)
    assert stack.cli("redis", "config", "get", "cluster-enabled").splitlines() == ["cluster-enabled", "yes"]
    before = stack.healthcheck("redis")
    assert before.returncode != 0, "cluster nodes without slots must not count as healthy"
    assert "cluster_state:fail" in stack.cli("redis", "cluster", "info")

    created = stack.run_job("redis-cluster-create")
    assert created.returncode == 0, created.stdout + created.stderr
    assert "All 16384 slots covered" in created.stdout, created.stdout
    deadline = time.monotonic() + 30
    while stack.healthcheck("redis").returncode != 0:
        assert time.monotonic() < deadline, stack.cli("redis", "cluster", "info")
        time.sleep(0.2)
    for name in stack.nodes:  # the others learn the slots by gossip, a moment after the first
        while True:
            info = dict(
                line.split(":", 1) for line in stack.cli(name, "cluster", "info").splitlines() if ":" in line
            )
            if info["cluster_state"] == "ok" or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        assert info["cluster_state"] == "ok" and info["cluster_size"] == "3", (name, info)
        assert info["cluster_known_nodes"] == "3" and info["cluster_slots_assigned"] == "16384", (name, info)
    nodes_before = stack.cli("redis", "cluster", "myid")

    again = stack.run_job("redis-cluster-create")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "--cluster create" not in again.stdout and "slots" not in again.stdout, (
        "the job re-created a formed cluster"
    )
    assert stack.cli("redis", "cluster", "myid") == nodes_before
    print(
        "\ncompose redis-cluster: healthcheck before the create job: exit",
        before.returncode,
        "; after: 0; cluster_size 3, 16384 slots; second run of the job: no change",
        json.dumps(stack.ports),
    )
