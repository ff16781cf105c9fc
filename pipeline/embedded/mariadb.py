"""A private MariaDB with a binlog, for `freshkey demo` and the tests (see pipeline.embedded)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.embedded.process import HOST, LocalService, ServiceStartError, find_binary, log_tail
from pipeline.embedded.tls import TlsFiles

if TYPE_CHECKING:
    from pymysql.connections import Connection as _Conn


_MARIADB_SPEED = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=48M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--innodb-buffer-pool-dump-at-shutdown=0",
    "--innodb-buffer-pool-load-at-startup=0",
    "--sync-binlog=0",
)
_CONNECTOR_GRANTS = "SELECT, REPLICATION SLAVE, BINLOG MONITOR"


class LocalMariaDB(LocalService):
    """A private MariaDB with a ROW binlog, for the change-data-capture path.

    ``admin_user``/``admin_password`` (root, empty password) may do anything; ``user``/``password``
    (freshkey/freshkey) hold only ``SELECT, REPLICATION SLAVE, BINLOG MONITOR`` on ``*.*``, which is what
    ``SHOW MASTER STATUS`` and a binlog dump need on MariaDB 10.5+. ``start()`` checks that the
    ``freshkey`` account can read the binlog position before it returns.

    ``tls``: the server offers TLS with that certificate (``ssl_cert``/``ssl_key``/``ssl_ca``) and the
    ``freshkey`` account is created ``REQUIRE SSL`` (a plain connection as it is refused); the admin
    account may still connect without TLS, for the tests' own setup.
    """

    _kind = "mariadb"
    admin_user = "root"
    admin_password = ""
    user = "freshkey"
    password = "freshkey"

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        start_timeout: float = 30.0,
        *,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self.tls = tls
        self._mariadbd = ""
        self._install_db = ""

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket (TCP on ``host:port`` works as well)."""
        return self.workdir / "mariadb.sock"

    @property
    def datadir(self) -> Path:
        """The data directory; the binlog files are ``binlog.*`` inside it."""
        return self.workdir / "data"

    def _resolve_binaries(self) -> None:
        install = "apt-get update && apt-get install -y mariadb-server"
        self._mariadbd = find_binary(["mariadbd"], install)
        self._install_db = find_binary(["mariadb-install-db", "mysql_install_db"], install)

    def _log_paths(self) -> list[Path]:
        return [self.workdir / "install-db.log", self.workdir / "mariadb.err", self.workdir / "mariadb.out"]

    def _prepare(self) -> None:
        if (self.datadir / "mysql").is_dir():
            return  # a work directory passed in that already holds a data directory
        log = self.workdir / "install-db.log"
        with log.open("wb") as out:
            result = subprocess.run(
                [
                    self._install_db,
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    *_MARIADB_SPEED,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                timeout=120,
                check=False,
            )
        if result.returncode != 0:
            raise ServiceStartError(
                f"mariadb-install-db exited with status {result.returncode}\n" + log_tail([log])
            )

    def _launch(self) -> None:
        wd = self.workdir
        self._spawn(
            [
                self._mariadbd,
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--log-bin={self.datadir / 'binlog'}",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--binlog-row-metadata=FULL",
                "--server-id=1",
                "--user=root",
                f"--bind-address={HOST}",
                f"--port={self.port}",
                f"--socket={wd / 'mariadb.sock'}",
                f"--pid-file={wd / 'mariadb.pid'}",
                f"--log-error={wd / 'mariadb.err'}",
                "--skip-name-resolve",
                *_MARIADB_SPEED,
                *self._tls_args(),
            ]
        )
        self._wait_until(self._admin_ping, self._start_timeout, "accept a connection")

    def _admin_ping(self) -> bool:
        # Also checks that the server answering is this one (its datadir), not another that took the port.
        conn = self.connect(admin=True, connect_timeout=1)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@datadir")
                row = cur.fetchone()
        finally:
            conn.close()
        return row is not None and Path(str(row[0])).resolve() == self.datadir.resolve()

    def _after_ready(self) -> None:
        conn = self.connect(admin=True)
        try:
            with conn.cursor() as cur:
                for host in (HOST, "localhost"):
                    account = f"'{self.user}'@'{host}'"
                    cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY %s", (self.password,))
                    cur.execute(f"GRANT {_CONNECTOR_GRANTS} ON *.* TO {account}")
                    if self.tls is not None:
                        cur.execute(f"ALTER USER {account} REQUIRE SSL")
        finally:
            conn.close()
        conn = self.connect(admin=False)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
        finally:
            conn.close()
        if not row:
            raise ServiceStartError(
                "SHOW MASTER STATUS returned nothing for the freshkey account: the binlog is off\n"
                + log_tail(self._log_paths())
            )

    def connect(self, admin: bool = True, database: str | None = None, connect_timeout: float = 10) -> _Conn:
        """A new pymysql connection over TCP, as root (``admin=True``) or as the freshkey account.

        The caller closes it.
        """
        from connectors.mysql import Connection

        tls: dict[str, object] = {}
        if self.tls is not None and not admin:  # the account is REQUIRE SSL
            tls = {"ssl_ca": str(self.tls.ca), "ssl_verify_cert": True}
        return Connection(
            host=HOST,
            port=self.port,
            user=self.admin_user if admin else self.user,
            password=self.admin_password if admin else self.password,
            database=database,
            connect_timeout=connect_timeout,
            autocommit=True,
            **tls,
        )

    def _tls_args(self) -> list[str]:
        if self.tls is None:
            return []
        return [f"--ssl-cert={self.tls.cert}", f"--ssl-key={self.tls.key}", f"--ssl-ca={self.tls.ca}"]

    def halt(self, timeout: float = 20.0) -> None:
        """Stop the server process (SIGTERM, a clean shutdown) but keep its data directory, accounts and
        port, so that :meth:`resume` brings the same database back: a restart under running clients."""
        self._kill_child(timeout)

    def resume(self) -> None:
        """Start the server again on the same port and data directory after :meth:`halt`; returns once
        it answers (ServiceStartError otherwise). Its binlog continues in a new file."""
        if self.running:
            raise RuntimeError("mariadb is running: halt() it first")
        self._launch()


# --- Redis ---------------------------------------------------------------------------------------------
