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
- :class:`ScriptedSMTP`: an SMTP server whose replies the test chooses, that
  offers PIPELINING and tells whether a client's commands came pipelined.

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
from typing import Any, Self

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
    # Offer PIPELINING in the EHLO reply (aiosmtpd reads pipelined commands in order).
    pipelining: bool = False
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

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname  # what aiosmtpd does without this hook
        if self.pipelining:
            responses.insert(-1, "250-PIPELINING")
        return responses

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


class LoopbackServer:
    """A TCP server on loopback that accepts connections and holds them until :meth:`stop`.

    Each connection is handed to :meth:`_connected` (here: nothing, it is only
    held). :meth:`stop` closes the listening socket and every connection, and
    joins the threads :meth:`_connected` started (``serving``).
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.serving: list[threading.Thread] = []
        self.lock = threading.Lock()
        name = type(self).__name__
        self.thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def start(self) -> Self:
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
            self._connected(conn)

    def _connected(self, conn: socket.socket) -> None:
        """A new connection, already in ``accepted``."""

    def connections(self) -> int:
        with self.lock:
            return len(self.accepted)

    def stop(self) -> None:
        # shutdown() wakes the accept() blocked in the thread; close() alone may not.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=5)
        with self.lock:
            for conn in self.accepted:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)  # wakes a thread reading it
                conn.close()
            self.accepted.clear()
        for thread in self.serving:
            thread.join(timeout=5)


class SilentServer(LoopbackServer):
    """A TCP server on loopback that accepts connections and never sends anything.

    For a mail server that never answers the greeting. Connections are held
    open until :meth:`stop`, which closes them and the listening socket.
    """


@dataclass
class Transaction:
    """One mail transaction a :class:`ScriptedSMTP` saw, from MAIL on."""

    mail_from: str
    # Whether RCPT and DATA had arrived before MAIL was answered: pipelined.
    pipelined: bool
    recipients: list[str] = field(default_factory=list)  # those answered 250
    body: bytes | None = None  # the message, dots unstuffed, once the final dot came


class ScriptedSMTP(LoopbackServer):
    """An SMTP server on loopback with the replies a test chooses; it offers PIPELINING.

    ``mail_reply`` answers MAIL, ``refuse`` maps a recipient to its RCPT
    reply (others get 250), ``data_reply`` answers DATA (None: 354, or 554
    when no recipient was accepted), ``final_reply`` answers the final dot.
    A reply that starts with 421 is followed by the close of the connection.
    Before it answers a MAIL it waits up to ``hold`` seconds for the DATA
    line: a pipelining client has sent it already, one that waits for each
    reply has not (:attr:`Transaction.pipelined`). ``commands``: every
    command line, in order, of every connection.
    """

    def __init__(
        self,
        *,
        pipelining: bool = True,
        mail_reply: str = "250 OK",
        refuse: dict[str, str] | None = None,
        data_reply: str | None = None,
        final_reply: str = "250 2.0.0 queued",
        hold: float = 0.3,
    ) -> None:
        self.pipelining = pipelining
        self.mail_reply = mail_reply
        self.refuse = refuse or {}
        self.data_reply = data_reply
        self.final_reply = final_reply
        self.hold = hold
        self.transactions: list[Transaction] = []
        self.commands: list[str] = []
        super().__init__()

    def _connected(self, conn: socket.socket) -> None:
        thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
        with self.lock:
            self.serving.append(thread)
        thread.start()

    def _serve(self, conn: socket.socket) -> None:
        reader = _Lines(conn)
        try:
            self._converse(conn, reader)
        except (OSError, EOFError):
            pass
        finally:
            # Say goodbye before closing: a close with unread pipelined commands
            # would reset the connection, and the client could lose our last reply.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(1.0)
                while conn.recv(65536):
                    pass
            conn.close()

    def _converse(self, conn: socket.socket, reader: _Lines) -> None:
        conn.sendall(b"220 scripted.test ESMTP\r\n")
        transaction: Transaction | None = None
        while True:
            line = reader.line()
            verb = line.split(" ", 1)[0].split(":", 1)[0].upper()
            with self.lock:
                self.commands.append(line)
            if verb == "EHLO":
                offers = ["250-scripted.test", "250-SIZE 10000000", "250 8BITMIME"]
                if self.pipelining:
                    offers.insert(1, "250-PIPELINING")
                reply = "\r\n".join(offers)
            elif verb == "MAIL":
                pipelined = reader.wait_for(b"DATA\r\n", self.hold)
                transaction = Transaction(_bracketed(line), pipelined)
                reply = self.mail_reply
                if reply.startswith("250"):
                    with self.lock:
                        self.transactions.append(transaction)
                else:
                    transaction = None
            elif verb == "RCPT":
                address = _bracketed(line)
                if transaction is None:
                    reply = "503 5.5.1 Error: need MAIL command"
                else:
                    reply = self.refuse.get(address, "250 OK")
                    if reply.startswith("250"):
                        transaction.recipients.append(address)
            elif verb == "DATA":
                accepted = transaction is not None and bool(transaction.recipients)
                reply = self.data_reply or (
                    "354 End data with <CR><LF>.<CR><LF>"
                    if accepted
                    else "554 5.5.1 Error: no valid recipients"
                )
                if reply.startswith("354"):
                    conn.sendall(reply.encode() + b"\r\n")
                    body = reader.body()
                    if transaction is not None:
                        transaction.body = body
                    reply = self.final_reply if accepted else "554 5.5.1 no valid recipients"
                    transaction = None
            elif verb == "RSET":
                transaction, reply = None, "250 OK"
            elif verb == "QUIT":
                conn.sendall(b"221 Bye\r\n")
                return
            else:
                reply = "250 OK"
            conn.sendall(reply.encode() + b"\r\n")
            if reply.startswith("421"):
                return


class _Lines:
    """The lines a client wrote on ``conn``, read as they come."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def _more(self) -> None:
        data = self.conn.recv(65536)
        if not data:
            raise EOFError
        self.buffer += data

    def line(self) -> str:
        while b"\r\n" not in self.buffer:
            self._more()
        raw, self.buffer = self.buffer.split(b"\r\n", 1)
        return raw.decode("utf-8", "replace")

    def wait_for(self, marker: bytes, timeout: float) -> bool:
        """Whether ``marker`` arrives within ``timeout`` seconds, without waiting for a reply."""
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.conn.settimeout(left)
            try:
                self._more()
            except TimeoutError:
                return False
            finally:
                self.conn.settimeout(None)
        return True

    def body(self) -> bytes:
        lines = []
        while (line := self.line()) != ".":
            lines.append(line[1:] if line.startswith(".") else line)
        return "".join(f"{line}\r\n" for line in lines).encode()


def _bracketed(command: str) -> str:
    return command.split("<", 1)[1].split(">", 1)[0] if "<" in command else ""


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
