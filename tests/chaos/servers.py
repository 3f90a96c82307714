"""The chaos run's servers and database: redis-server, the SMTP server, PostgreSQL or SQLite.

``ServersMixin`` is the part of ``Child`` that starts a private redis-server and
the SMTP server on 127.0.0.1 and free ports, creates the run's own database
(``chaos_<policy>_<random>`` on the PostgreSQL server named by
OUTBOX_TEST_PG_HOST/PORT/USER, or a SQLite file), sets Django up on it, and
stops, closes and drops all of it at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from typing import Any

from tests.chaos.smtp import ChaosSMTPHandler


class ServersMixin:
    """The part of ``Child`` that owns servers (see child.py for the attributes)."""

    def start_servers(self) -> None:
        from aiosmtpd.controller import Controller

        from tests.servers import RedisServer, free_port

        self.redis_server = RedisServer().start()
        self.say(f"redis-server on 127.0.0.1:{self.redis_server.port}")
        self.smtp = ChaosSMTPHandler(
            self.receipts_path,
            seed=self.config.seed,
            permanent=self.permanent,
            transient_fraction=self.config.transient_fraction,
            delay=self.config.smtp_delay,
        )
        # A stall outlasts the workers' SEND_TIMEOUT (tests/chaos/settings.py).
        self.smtp.stall_seconds = self.config.send_timeout + 3
        # A slow reply outlasts the heartbeat timeout, not SEND_TIMEOUT (faults/long_send.py).
        self.smtp.slow_seconds = min(
            self.config.heartbeat_timeout + 1.5,
            (self.config.heartbeat_timeout + self.config.send_timeout) / 2,
        )
        port = free_port()
        self.controller = Controller(self.smtp, hostname="127.0.0.1", port=port)
        self.controller.start()
        self.smtp_port = port
        self.say(f"SMTP server on 127.0.0.1:{port}, receipts in {self.receipts_path}")
        self.start_proxies()

    def redis_client(self) -> Any:
        """The harness's own client of the run's redis-server (it reconnects after a restart)."""
        if self._redis is None:
            import redis

            self._redis = redis.Redis(
                host="127.0.0.1", port=self.redis_server.port, socket_timeout=5
            )
        return self._redis

    def create_database(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        if self.config.db == "postgres":
            import psycopg

            self.db_name = f"chaos_{self.config.policy}_{suffix}"
            with psycopg.connect(**self._pg_params("postgres"), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.db_name}"')
            self.db_created = True
        else:
            self.sqlite_dir = tempfile.mkdtemp(prefix="outbox-chaos-sqlite-")
            self.db_name = os.path.join(self.sqlite_dir, f"chaos_{self.config.policy}.sqlite3")
        self.say(f"database {self.db_name} ({self.config.db})")

    def _pg_params(self, dbname: str) -> dict[str, Any]:
        return {
            "host": os.environ.get("OUTBOX_TEST_PG_HOST", "127.0.0.1"),
            "port": int(os.environ.get("OUTBOX_TEST_PG_PORT", "5432")),
            "user": os.environ.get("OUTBOX_TEST_PG_USER", "postgres"),
            "dbname": dbname,
            "connect_timeout": 10,
        }

    def setup_django(self) -> None:
        self.env = {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "OUTBOX_CHAOS_SEND_TIMEOUT": str(self.config.send_timeout),
            "OUTBOX_TEST_DB": self.config.db,
            "OUTBOX_TEST_DB_NAME": self.db_name,
            "OUTBOX_TEST_REDIS_URL": self.redis_server.url,
            "OUTBOX_TEST_SMTP_PORT": str(self.smtp_port),
            "OUTBOX_TEST_ABANDONED_POLICY": self.config.policy,
            "OUTBOX_TEST_HEARTBEAT_TIMEOUT": str(self.config.heartbeat_timeout),
            "OUTBOX_TEST_HEARTBEAT_INTERVAL": str(self.config.heartbeat_interval),
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(self.env)
        for name in ("OUTBOX_FAULT_POINT", "OUTBOX_FAULT_COUNT"):
            os.environ.pop(name, None)
        import logging

        import django
        from django.core.management import call_command

        django.setup()
        # The harness enqueues while Redis is down on purpose: those warnings are expected.
        logging.getLogger("outbox").setLevel(logging.ERROR)
        call_command("migrate", verbosity=0, interactive=False)

    def cleanup(self, keep_db: bool) -> None:
        for proc in [*self.procs, *([self.sweeper] if self.sweeper else [])]:
            if proc.proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.proc.kill()
                except ProcessLookupError:
                    pass
            try:
                proc.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.controller is not None:
            self.controller.stop()
        self.close_proxies()
        if self.redis_server is not None:
            self.redis_server.close()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django may never have been set up
            pass
        if self.db_created and not keep_db:
            import psycopg

            with psycopg.connect(**self._pg_params("postgres"), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        if self.sqlite_dir and not keep_db:
            shutil.rmtree(self.sqlite_dir, ignore_errors=True)
