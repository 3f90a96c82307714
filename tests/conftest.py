"""Shared fixtures: a clean Redis per test, the queue, locmem mail, real SMTP and Redis servers, worker subprocesses."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import mail
from django.db import connections
from hypothesis import settings as hypothesis_settings

from outbox.queue import RedisQueue
from outbox.worker import Worker
from tests.esp import FakeESP
from tests.paths import ROOT
from tests.servers import RedisServer, SMTPRecorder, subprocess_env, wait_until

# django-anymail's own tests, vendored unchanged: they run through the outbox, by
# tests/upstream/test_anymail_backends.py, never on their own.
collect_ignore = ["anymail_upstream"]

# A failing example is printed with the blob that replays it (@reproduce_failure):
# a failure seen once in CI can be run again here.
hypothesis_settings.register_profile("outbox", print_blob=True)
hypothesis_settings.load_profile("outbox")


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test databases; before they are dropped, no one else is on them.

    PostgreSQL refuses to drop a database another session is connected to, and
    pytest-django then only warns, without a name. A thread that used the ORM
    and ended leaves its connection to the garbage collector (a Django
    connection is a reference cycle), so collect first. A session still there
    after that belongs to something a test left running: wait a little for a
    process on its way out, then warn, naming what each session last ran.
    """
    yield
    gc.collect()
    with django_db_blocker.unblock():
        try:
            wait_until(lambda: not _other_sessions(), 10, interval=0.1)
            others = []
        except AssertionError:
            others = _other_sessions()
        for connection in connections.all():
            connection.close()
    if others:
        warnings.warn(
            pytest.PytestWarning(f"sessions still on the test database: {others}"), stacklevel=1
        )


def _other_sessions() -> list[tuple[Any, ...]]:
    """(pid, application, state, when, last query) of each other session on a PostgreSQL test database."""
    found: list[tuple[Any, ...]] = []
    for connection in connections.all():
        if connection.vendor != "postgresql" or not _set_up(connection):
            continue
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, state, query_start,"
                " CASE WHEN length(query) <= 240 THEN query"
                " ELSE left(query, 120) || ' ... ' || right(query, 120) END"
                " FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            found += cursor.fetchall()
    return found


def _set_up(connection: Any) -> bool:
    """Whether this run made the test database of ``connection``'s alias (it then bears its name).

    An alias no test of the run asked for (tests/settings.py's "routed") has no
    test database, and its own database may not exist.
    """
    settings = connection.settings_dict
    return settings["NAME"] == (settings.get("TEST") or {}).get("NAME", settings["NAME"])


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Every test starts with an empty Redis database."""
    queue = RedisQueue()
    queue.redis.flushdb()
    yield


@pytest.fixture(autouse=True)
def _no_worker_left_running() -> Iterator[None]:
    """A test that started an in-process worker has stopped it when it ends.

    A worker thread left running would go on claiming from the same Redis
    database and sending the next tests' rows, which then fail far from the
    cause; the test that left it fails here instead.
    """
    yield
    try:
        wait_until(lambda: not _worker_threads(), 30, interval=0.05)
    except AssertionError:
        pytest.fail(f"the test left worker threads running: {_worker_threads()}")


def _worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("outbox-")]


@pytest.fixture
def queue() -> RedisQueue:
    return RedisQueue()


@pytest.fixture
def outbox_mail() -> list:
    """Messages the locmem delivery backend received in this test."""
    mail.outbox = []
    return mail.outbox


@pytest.fixture
def smtp_server() -> Iterator[SMTPRecorder]:
    server = SMTPRecorder().start()
    yield server
    server.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server that the test may restart."""
    server = RedisServer().start()
    yield server
    server.close()


def _command_processes(command: str):
    """Start ``manage.py <command>`` subprocesses on the test database; kill them after."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", command, *args],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture
def worker_process():
    """Start `manage.py outbox_worker` subprocesses on the test database."""
    yield from _command_processes("outbox_worker")


@pytest.fixture
def sweeper_process():
    """Start `manage.py outbox_sweep` subprocesses on the test database."""
    yield from _command_processes("outbox_sweep")


@pytest.fixture
def running() -> Iterator:
    """Start in-process workers (not burst), each in a thread; stopped at the end."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(**kwargs: Any) -> Worker:
        worker = Worker(**kwargs)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def esp() -> Iterator[FakeESP]:
    """The fake ESP (tests/esp.py), one per module; a module's fixture resets it per test."""
    server = FakeESP().start()
    yield server
    server.stop()
