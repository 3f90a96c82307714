"""Shared fixtures: a clean Redis per test, the queue, locmem mail, real SMTP and Redis servers, worker subprocesses."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import mail

from outbox.queue import RedisQueue
from outbox.worker import Worker
from tests.servers import RedisServer, SMTPRecorder, subprocess_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Every test starts with an empty Redis database."""
    queue = RedisQueue()
    queue.redis.flushdb()
    yield


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


@pytest.fixture
def worker_process():
    """Start `manage.py outbox_worker` subprocesses on the test database."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_worker", *args],
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
