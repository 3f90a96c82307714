"""Real servers for tests, on loopback, started and stopped by pid.

- :class:`RedisServer`: a private redis-server a test may stop, restart or wipe.
- :class:`SMTPRecorder`: an aiosmtpd SMTP server that records every accepted
  message (envelope recipients and Message-ID) and can refuse chosen ones. With
  ``after_data="cut"`` it records the message and then closes the connection
  instead of replying to the final dot; with ``after_data="stall"`` it records
  it and never replies (until stopped). With ``greeting_host`` and ``log`` it
  greets as that host and writes a Postfix-style mail log under that host
  name, as one relay of a pool would.
- :class:`RefusingOnce`: an SMTPRecorder that gives each refused address its
  reply once, then accepts it (a temporary refusal that passes).
- :class:`SilentServer`: accepts TCP connections and never says a word (no
  SMTP greeting), until stopped.

And the small helpers the tests share: :func:`wait_until`,
:func:`subprocess_env`, :func:`sample_message`, :func:`empty_outbox`.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from django.core.mail import EmailMessage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def runserver(log: Path, **env: str) -> Iterator[int]:
    """``manage.py runserver`` of the test project on a free port of loopback, on the test
    database (``env``: more of its environment); yields the port, then kills it by pid.
    Its output goes to ``log`` (a failed request's traceback)."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=Path(__file__).resolve().parent.parent,
            env=subprocess_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: listens(port), timeout=30, interval=0.1)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def listens(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


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
        assert exe, "redis-server is not installed (tests/run.sh installs it)"
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
    answering each message's DATA. ``after_data`` says what follows the
    final dot once the message is recorded: ``"reply"`` (250), ``"cut"``
    (close the connection without a reply: the client cannot know the server
    has it) or ``"stall"`` (keep the connection open and never reply).
    ``data_reply`` replaces the 250 of ``"reply"`` (e.g. "554 rejected").

    ``greeting_host``: the host name of its 220 greeting and EHLO reply.
    ``log``: a file it writes Postfix's lines to, RFC 3339 stamps and
    ``greeting_host`` as the syslog host field: ``cleanup`` and ``qmgr``
    "(queue active)" for each message it takes, before it answers the final
    dot (as Postfix commits a message before its 250), and a line of
    ``anvil`` statistics on :meth:`log_tick` (the log goes on past a moment).
    """

    refuse: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    after_data: str = "reply"
    data_reply: str = "250 Message accepted for delivery"
    greeting_host: str = ""
    log: Path | None = None
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> SMTPRecorder:
        from aiosmtpd.controller import Controller

        assert self.after_data in ("reply", "cut", "stall"), self.after_data
        self.port = free_port()
        self.controller = Controller(
            self, hostname="127.0.0.1", port=self.port, server_hostname=self.greeting_host or None
        )
        self.controller.start()
        self.log_tick()
        return self

    def log_tick(self) -> None:
        """A Postfix line stamped now (nothing if there is no log)."""
        self._log_lines("postfix/anvil[7]: statistics: max connection rate 1/60s")

    def _log_lines(self, *lines: str) -> None:
        if self.log is None:
            return
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        host = self.greeting_host or "localhost"
        with self.lock, self.log.open("a") as out:
            out.writelines(f"{stamp} {host} {line}\n" for line in lines)

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
            qid = f"{len(self.received):04d}ABCDEF"
        self._log_lines(
            f"postfix/cleanup[812]: {qid}: message-id={parsed['Message-ID']}",
            f"postfix/qmgr[600]: {qid}: from=<{envelope.mail_from}>, size={len(raw)}, "
            f"nrcpt={len(envelope.rcpt_tos)} (queue active)",
        )
        if self.after_data == "cut":
            # A FIN with no reply; aiosmtpd then cancels this handler.
            server.transport.close()
        if self.after_data in ("cut", "stall"):
            import asyncio

            # Controller.stop() cancels this wait.
            await asyncio.Event().wait()
        return self.data_reply

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def by_message_id(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self.lock:
            for item in self.received:
                counts[item.message_id] = counts.get(item.message_id, 0) + 1
        return counts


@dataclass
class RefusingOnce(SMTPRecorder):
    """Gives each address of ``refuse`` its reply once, then accepts it."""

    refused: list[str] = field(default_factory=list)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        reply = self.refuse.pop(address, None)
        if reply:
            self.refused.append(address)
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"


@dataclass
class RefusingSenders(SMTPRecorder):
    """Answers every MAIL FROM with ``mail_reply`` while it is set (a relay refusing
    the sender, a wrong credential's mail server); set it to "" to accept again."""

    mail_reply: str = "451 4.7.1 Sender address rejected: try again later"

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, mail_options: Any
    ) -> str:
        reply = self.mail_reply
        if reply:
            return reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"


class SilentServer:
    """A TCP server on loopback that accepts connections and never sends anything.

    For a mail server that never answers the greeting. Connections are held
    open until :meth:`stop`, which closes them and the listening socket.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)

    def start(self) -> SilentServer:
        self.thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.listener.accept()
            except OSError:  # the listener was closed: stop
                return
            with self.lock:
                self.accepted.append(conn)

    def connections(self) -> int:
        with self.lock:
            return len(self.accepted)

    def stop(self) -> None:
        # shutdown() wakes the accept() blocked in the thread; close() alone may not.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(timeout=5)
        with self.lock:
            for conn in self.accepted:
                conn.close()
            self.accepted.clear()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a worker subprocess that uses the test database."""
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["OUTBOX_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def sample_message(**kwargs: Any) -> EmailMessage:
    """A small receipt-like message for backend tests; ``kwargs`` override its fields."""
    fields: dict[str, Any] = {
        "subject": "Your receipt",
        "body": "Thanks for your order.\n",
        "from_email": "shop@example.com",
        "to": ["a@example.com"],
    }
    fields.update(kwargs)
    return EmailMessage(**fields)


def empty_outbox() -> None:
    """No rows, nothing in the outbox's Redis, no captured mail: between examples of one test."""
    from django.core import mail

    from outbox.models import Attachment, Attempt, Delivery, Email
    from outbox.queue import RedisQueue

    Attempt.objects.all().delete()
    Delivery.objects.all().delete()
    Attachment.objects.all().delete()
    Email.objects.all().delete()
    RedisQueue().redis.flushdb()
    mail.outbox = []
