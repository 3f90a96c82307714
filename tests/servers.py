"""Real servers for tests, on loopback, started and stopped by pid.

- :class:`RedisServer`: a private redis-server a test may stop, restart or wipe.
- :class:`SMTPRecorder`: an aiosmtpd SMTP server that records every accepted
  message (envelope recipients and Message-ID) and can refuse chosen ones.
"""

from __future__ import annotations

import email
import email.policy
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


class RedisServer:
    """A redis-server of the test's own, with no persistence."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="outbox-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (scripts/test.sh installs it)"
        self.process = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._ping, timeout=10)
        return self

    def _ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """Kill and start again on the same port: every key is gone."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message_id: str
    message: email.message.EmailMessage
    raw: bytes


@dataclass
class SMTPRecorder:
    """An SMTP server on loopback that records what it accepts.

    ``refuse`` maps a recipient address to an SMTP reply (e.g. "550 no such
    user" or "451 try later") given at RCPT time; ``delay`` waits before
    answering each message's DATA.
    """

    refuse: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> SMTPRecorder:
        from aiosmtpd.controller import Controller

        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        reply = self.refuse.get(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.delay:
            import asyncio

            await asyncio.sleep(self.delay)
        raw = envelope.original_content or envelope.content
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        with self.lock:
            self.received.append(
                Received(
                    envelope.mail_from,
                    list(envelope.rcpt_tos),
                    str(parsed["Message-ID"]),
                    parsed,
                    raw,
                )
            )
        return "250 Message accepted for delivery"

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def by_message_id(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self.lock:
            for item in self.received:
                counts[item.message_id] = counts.get(item.message_id, 0) + 1
        return counts


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a worker subprocess that uses the test database."""
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["OUTBOX_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
