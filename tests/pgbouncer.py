"""A private PgBouncer for tests: transaction pooling on 127.0.0.1, in front of the test PostgreSQL.

:class:`PgBouncer` runs its own ``pgbouncer`` process (Debian package
``pgbouncer``, installed by ``tests/lib.sh``'s ``ensure_tools``) with its
config, auth, log and pid files in a temporary directory, listening on
``127.0.0.1`` only (no Unix socket) and pooling in ``transaction`` mode. Every
database name is forwarded to one PostgreSQL server (``*`` in
``[databases]``), so the test databases need no entry of their own; the pool
of each database is ``pool_size`` server connections, fewer than the threads
of a worker on purpose.

It is started and stopped by its pid, never by name: :meth:`kill` SIGKILLs it
(what an OOM kill or a crashed host would do) and :meth:`start` brings it back
on the same port. What it takes:

- PgBouncer refuses to run as root: under root it runs as the ``postgres``
  user (which owns its directory), elsewhere as the current user;
- ``auth_type = trust`` still wants every user in ``auth_file``;
- the admin console (``SHOW POOLS``, :meth:`show`) is the database
  ``pgbouncer``, for the users of ``admin_users``; it speaks the simple query
  protocol only;
- prepared statements: PgBouncer 1.18 (Debian 12) passes a named prepared
  statement to whichever server connection the transaction got, where it may
  not exist, so a client must not prepare (psycopg's ``prepare_threshold``
  unset, Django's default). PgBouncer 1.21 and later track them per client
  with ``max_prepared_statements``, which is set when the binary is that new
  (:attr:`PgBouncer.prepared_statements`).

:func:`unavailable` says why it cannot run here.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.servers import free_port, wait_until

# Where Debian's package puts it; PATH first, for other systems.
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# PgBouncer refuses root; this user owns the test PostgreSQL too (tests/lib.sh).
ROOT_RUNS_AS = "postgres"


def unavailable() -> str | None:
    """Why a private PgBouncer cannot run here, or None."""
    if not os.access(PGBOUNCER, os.X_OK):
        return "PgBouncer is not installed (tests/run.sh installs it with apt-get)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(ROOT_RUNS_AS)
        except KeyError:
            return f"PgBouncer will not run as root, and there is no {ROOT_RUNS_AS} user"
    return None


def version() -> tuple[int, ...]:
    """PgBouncer's version, e.g. (1, 18, 0)."""
    out = subprocess.run(
        [PGBOUNCER, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    found = re.search(r"PgBouncer (\d+(?:\.\d+)+)", out)
    assert found, out
    return tuple(int(part) for part in found.group(1).split("."))


class PgBouncer:
    """PgBouncer on ``127.0.0.1:port`` pooling in transaction mode for ``pg_host:pg_port``."""

    def __init__(self, pg_host: str, pg_port: int, user: str, pool_size: int = 2) -> None:
        self.pg_host = pg_host
        self.pg_port = pg_port
        self.user = user  # the PostgreSQL user the clients log in as (trust)
        self.pool_size = pool_size
        self.port = free_port()
        self.version = version()
        # 1.21 tracks named prepared statements per client; older ones break them.
        self.prepared_statements = self.version >= (1, 21)
        # Under /tmp, not pytest's private folder: the postgres user must reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-", dir="/tmp"))
        self.ini = self.dir / "pgbouncer.ini"
        self.log = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> PgBouncer:
        """Start it (again, after :meth:`kill`, on the same port); wait until it answers."""
        assert self.process is None, "already running"
        self._write_config()
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            owner = pwd.getpwnam(ROOT_RUNS_AS)
            run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        # A pid file left by a SIGKILL would name a dead (or reused) pid.
        self.pidfile.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [PGBOUNCER, str(self.ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it logs to self.log as well
            start_new_session=True,  # a Ctrl-C of the test run is not its to get
            **run_as,
        )
        self.starts += 1
        try:
            wait_until(self._answers, timeout=30, interval=0.05)
        except AssertionError:
            self.kill()
            raise RuntimeError(f"PgBouncer did not start:\n{self.log_text()[-3000:]}") from None
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"PgBouncer exited with status {self.process.returncode}:\n{self.log_text()[-3000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
            self.show("VERSION")
        except Exception:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL it by pid: every client and server connection drops at once."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown) by pid, SIGKILL if it lingers."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGKILL)
                self.process.wait(timeout=30)
            self.process = None

    def restart(self) -> None:
        """SIGKILL, then start again on the same port."""
        self.kill()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (POOLS, SERVERS, CLIENTS, STATS, ...)."""
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=5,
            cursor_factory=psycopg.ClientCursor,  # the simple query protocol
            row_factory=dict_row,
        ) as conn:
            return list(conn.execute(f"SHOW {what}").fetchall())

    def servers(self, database: str) -> int:
        """How many server connections PgBouncer holds to ``database`` now."""
        return sum(1 for row in self.show("SERVERS") if row["database"] == database)

    def clients(self, database: str) -> int:
        """How many client connections PgBouncer holds for ``database`` now."""
        return sum(1 for row in self.show("CLIENTS") if row["database"] == database)

    def _write_config(self) -> None:
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        prepared = "max_prepared_statements = 200\n" if self.prepared_statements else ""
        self.ini.write_text(f"""\
[databases]
* = host={self.pg_host} port={self.pg_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "userlist.txt"}
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_reset_query =
query_wait_timeout = 60
server_login_retry = 1
logfile = {self.log}
pidfile = {self.pidfile}
syslog = 0
log_connections = 0
log_disconnections = 0
{prepared}""")
