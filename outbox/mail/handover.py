"""The SMTP hand-over: when a failure is in doubt, and how long a send may take.

:func:`watch_handover` instruments one ``smtplib.SMTP`` connection so that a
failure after the whole message was handed over (after SMTP's final ``.``,
before the server's reply) is raised as
:class:`~outbox.exceptions.AmbiguousDeliveryError`: the server may have the
message, and resending it could deliver it twice. The worker calls it after
every successful ``backend.open()``; it is re-exported as
``outbox.backends.watch_handover``, its documented home.

:func:`bound_send_time` makes ``OUTBOX["SEND_TIMEOUT"]`` bound the whole of
each call of Django's SMTP backend (``open()``, ``send_messages()``,
``close()``), not each wait on the server: a server that answers one byte at
a time cannot hold a sender thread, or SIGTERM, for longer than that.
:func:`watch_handover` applies it too.

:func:`handover_server` says where a connection hands its messages over:
the server's greeting host name and the peer address. A pool of relays
behind one host name (several A records, a load balancer) puts each new
connection on any of them, so only this tells which server's log can answer
for a message (:mod:`outbox.reconcilers`).
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import math
import smtplib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend

from ..conf import outbox_settings
from ..exceptions import AmbiguousDeliveryError, SendFencedError
from .sendmail import SendmailBackend

# What smtplib.SMTP.data() writes last: the body ends in CRLF, then "." CRLF.
_END_OF_DATA = b"\r\n.\r\n"
# Marks an smtplib connection that watch_handover() already instrumented.
_WATCHED = "_outbox_watch_handover"
# The text of the server's 220 greeting, kept by _connect().
_GREETING = "_outbox_greeting"

_Send = Callable[[bytes | str], None]
_Data = Callable[[bytes | str], tuple[int, bytes]]


@dataclass(frozen=True)
class Server:
    """Where a connection hands messages over; "" where not known.

    ``host``: the first word of the server's 220 greeting (RFC 5321: its
    domain), else of its EHLO or HELO reply. ``address``: the peer of the TCP
    connection, ``ip:port`` (``[ip]:port`` for IPv6). Behind a TCP load
    balancer the address is the balancer's, the same for every relay: the
    host name is what tells them apart.
    """

    host: str
    address: str = ""


class _Handover:
    """Per-connection state of :func:`watch_handover`: where ``data()`` is."""

    in_data: bool = False
    handed_over: bool = False
    # Asked right before the final dot; False: do not hand the message over.
    fence: Callable[[], bool] | None = None
    # The server this connection reached, noted when it was opened.
    server: Server | None = None


def handover_server(backend: BaseEmailBackend) -> Server | None:
    """The server the open ``backend`` hands its messages to, or None if not known.

    For an SMTP connection instrumented by :func:`watch_handover`: the
    server it greeted us as, and its peer address. For the outbox's
    ``SendmailBackend``: this host (its local MTA, whose log names this
    host). Other backends (an HTTP API) are not known.
    """
    if isinstance(backend, SendmailBackend):
        return Server(socket.gethostname()[:253])
    state = getattr(getattr(backend, "connection", None), _WATCHED, None)
    return state.server if isinstance(state, _Handover) else None


def server_of(connection: smtplib.SMTP) -> Server:
    """The server an open smtplib connection reached (public attributes only).

    The greeting is the one :func:`bound_send_time`'s connections keep from
    ``SMTP.connect()``; a connection opened otherwise is named by its EHLO
    or HELO reply (``ehlo_resp``, ``helo_resp``), whose first word is the
    server's host name too.
    """
    host = ""
    for reply in (getattr(connection, _GREETING, None), connection.ehlo_resp, connection.helo_resp):
        host = _first_word(reply)
        if host:
            break
    return Server(host, _peer(connection.sock))


def _first_word(reply: bytes | str | None) -> str:
    if not reply:
        return ""
    text = reply.decode("ascii", "replace") if isinstance(reply, bytes) else reply
    words = text.split(None, 1)
    return words[0][:253] if words else ""


def _peer(sock: socket.socket | None) -> str:
    try:
        peer = sock.getpeername() if sock is not None else None
    except OSError:  # not connected (any more): not known
        return ""
    if not isinstance(peer, tuple) or len(peer) < 2:
        return ""  # a Unix socket: no address to name
    ip, port = peer[0], peer[1]
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def watch_handover(backend: BaseEmailBackend, fence: Callable[[], bool] | None = None) -> None:
    """Make a failure after SMTP's final ``.`` raise :class:`AmbiguousDeliveryError`.

    With a ``fence``, the body is written first and the fence is asked right
    before the final ``.``: if it says no, the connection is closed without
    it (the server discards an unfinished DATA) and
    :class:`~outbox.exceptions.SendFencedError` is raised. The worker's fence
    is its heartbeat lease: a worker frozen mid-send (SIGSTOP, a stalled VM)
    and declared dead meanwhile must not hand over a row the sweeper flagged.

    The worker calls this right after every successful ``backend.open()``.
    When ``backend.connection`` is an :class:`smtplib.SMTP` (Django's stock
    SMTP backend, ``SMTP_SSL`` included), that one instance (not the class)
    is instrumented: its ``send`` notes when the end of the message
    (``CRLF . CRLF``) was written during ``data()``, and its ``data``
    re-raises any error after that point as ``AmbiguousDeliveryError``
    ``from`` the original: the connection cut (``SMTPServerDisconnected``),
    the reply timed out (smtplib turns that into ``SMTPServerDisconnected``
    too), or an unreadable reply (``SMTPResponseException``). A reply that is
    not a clear answer (anything but 250 or a 4xx/5xx code) is in doubt as
    well. A 4xx or 5xx reply to the final dot is a clear refusal and stays
    what it is, as does every failure before the body was complete: a
    connection refused, the greeting, authentication, MAIL, RCPT, the DATA
    command, or a write that did not finish.

    The state is reset for each message. The error passes through Django's
    backend even with ``fail_silently`` (which swallows only
    ``smtplib.SMTPException``): an ambiguous send must not look unsent.
    Calling it again on the same connection does nothing; a backend without
    an smtplib connection is left alone.
    """
    connection = getattr(backend, "connection", None)
    if not isinstance(connection, smtplib.SMTP) or getattr(connection, _WATCHED, None):
        return
    # A backend created without bound_send_time(): its later calls are bounded
    # from now on, and this connection's remaining waits.
    budget = bound_send_time(backend)
    if budget is not None:
        bound_connection(connection, budget)
    state = _Handover()
    state.fence = fence
    state.server = server_of(connection)
    if fence is not None:
        _send_small_writes_at_once(connection)
    # Instance attributes shadow the class's methods for this connection only;
    # smtplib calls them as self.send / self.data.
    setattr(connection, "send", _watching_send(connection, connection.send, state))  # noqa: B010
    setattr(connection, "data", _watching_data(connection.data, state))  # noqa: B010
    setattr(connection, _WATCHED, state)


def _watching_send(connection: smtplib.SMTP, original_send: _Send, state: _Handover) -> _Send:
    """``send`` that notes in ``state`` when the end of the message was written."""

    def send(s: bytes | str) -> None:
        ends = state.in_data and _tail(s) == _END_OF_DATA
        if ends and state.fence is not None:
            # smtplib writes the body and the final ".\r\n" in one call: split
            # them, so that the fence is asked as late as it can be.
            original_send(s[:-3])
            if not state.fence():
                connection.close()
                raise SendFencedError("the lease ran out before the final dot; not handed over")
            s = s[-3:]
        original_send(s)
        # Only once send() returned did the kernel take every byte: a write
        # that failed part-way cannot have delivered the final dot.
        if ends:
            state.handed_over = True

    return send


def _send_small_writes_at_once(connection: smtplib.SMTP) -> None:
    """Turn Nagle's algorithm off on the connection's TCP socket.

    With the fence, the final ".\r\n" is a write of its own right after the
    body's. Nagle would hold it until the body's bytes are acknowledged, and
    the server, which answers only after the dot, acknowledges them only when
    its delayed-ACK timer fires: about 40 ms on Linux, added to every send
    (measured: 73 ms instead of 25 ms per message to a server that takes 20).
    """
    sock = getattr(connection, "sock", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not a TCP socket after all: nothing to turn off
        pass


def _tail(s: bytes | str) -> bytes:
    return s[-5:].encode("ascii", "replace") if isinstance(s, str) else bytes(s[-5:])


def _watching_data(original_data: _Data, state: _Handover) -> _Data:
    """``data`` that raises AmbiguousDeliveryError for a failure after the hand-over."""

    def data(msg: bytes | str) -> tuple[int, bytes]:
        state.in_data, state.handed_over = True, False
        try:
            code, reply = original_data(msg)
        except Exception as exc:
            if state.handed_over:
                raise AmbiguousDeliveryError(
                    f"no reply after the message was handed over: {type(exc).__name__}: {exc}",
                    message_id=_message_id(msg),
                ) from exc
            raise
        finally:
            state.in_data = False
        if state.handed_over and code != 250 and not 400 <= code < 600:
            raise AmbiguousDeliveryError(
                f"unclear reply after the message was handed over: {code} {reply!r}",
                message_id=_message_id(msg),
            )
        return code, reply

    return data


def _message_id(msg: bytes | str) -> str | None:
    """The Message-ID header of a raw message, for the attempt log."""
    try:
        raw = msg.encode("utf-8", "replace") if isinstance(msg, str) else msg
        headers = email.parser.BytesParser(policy=email.policy.default).parsebytes(
            raw, headersonly=True
        )
        value = headers.get("Message-ID")
    except Exception:  # a header we cannot parse must not hide the real error
        return None
    return str(value).strip() if value else None


# -- the time limit of a whole send -------------------------------------------------
#
# Each call of the backend gets a deadline; every wait on the server inside it
# (connect, TLS handshake, each read of a reply, each write) gets the time that
# is left as its socket timeout. Past the deadline a read or write fails as a
# socket timeout does there, so it is classified the same way: before the final
# dot a retryable failure, after it a message in doubt (watch_handover).

# Marks an smtplib connection whose waits are bounded.
_BOUNDED = "_outbox_send_budget"


class _Budget:
    """One backend's deadline while one of its calls is under way."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        # What the last open() took: charged to the send that follows it.
        self.spent = 0.0

    def wait(self, per_wait: float | None, strict: bool = True) -> float | None:
        """The timeout of the next wait: the time left, at most ``per_wait``.

        Outside a call, ``per_wait`` (the connection's own timeout). Past the
        deadline: TimeoutError, or with ``strict=False`` a timeout that
        expires at once.
        """
        if self.deadline is None:
            return per_wait
        left = self.deadline - time.monotonic()
        if left <= 0:
            if strict:
                raise TimeoutError("the send took longer than OUTBOX['SEND_TIMEOUT']")
            return 1e-6
        return left if per_wait is None else min(per_wait, left)

    def start(self, spent: float = 0.0) -> bool:
        """Begin a call's deadline, less ``spent``; False inside another call (nothing to do)."""
        if self.deadline is not None:
            return False
        self.deadline = time.monotonic() + outbox_settings.SEND_TIMEOUT - spent
        return True


class _BoundedSMTPBackend:
    """Put before Django's SMTP backend class (or a subclass): each call gets a deadline."""

    _outbox_budget: _Budget

    @property
    def connection_class(self) -> Callable[..., smtplib.SMTP]:
        base = super().connection_class  # type: ignore[misc]
        budget = self._outbox_budget

        def connect(host: str, port: int, **params: Any) -> smtplib.SMTP:
            return _connect(base, budget, host, port, params)

        return connect

    def open(self) -> bool | None:
        budget = self._outbox_budget
        started = time.monotonic()
        if not budget.start():
            return super().open()  # type: ignore[misc]
        try:
            opened: bool | None = super().open()  # type: ignore[misc]
        finally:
            budget.deadline = None
        if opened:
            budget.spent = time.monotonic() - started
        return opened

    def send_messages(self, email_messages: Sequence[Any]) -> int:
        budget = self._outbox_budget
        if not budget.start(spent=budget.spent):
            return super().send_messages(email_messages)  # type: ignore[misc]
        budget.spent = 0.0
        try:
            return super().send_messages(email_messages)  # type: ignore[misc]
        finally:
            budget.deadline = None

    def close(self) -> None:
        budget = self._outbox_budget
        if not budget.start():
            return super().close()  # type: ignore[misc]
        budget.spent = 0.0
        try:
            super().close()  # type: ignore[misc]
        finally:
            budget.deadline = None


_bounded_classes: dict[type, type] = {}


def bound_send_time(backend: BaseEmailBackend) -> _Budget | None:
    """Make ``SEND_TIMEOUT`` bound each whole call of ``backend``, if it is Django's SMTP backend.

    ``open()``, ``send_messages()`` and ``close()`` each take at most about
    ``OUTBOX["SEND_TIMEOUT"]`` (read when the call starts), whatever the
    server does; the first ``send_messages()`` after an ``open()`` gets what
    the open left of it, so that connecting and sending one message take
    that long in all. The instance's class is replaced by a subclass of it
    (same name) that sets the deadline and creates each ``smtplib``
    connection with every wait bounded by it. Returns the backend's deadline
    keeper, or None for any other backend, which is left alone (a backend
    with its own notion of a time limit, such as ``SendmailBackend``, keeps
    it). Calling it again does nothing.
    """
    if isinstance(backend, _BoundedSMTPBackend):
        return backend._outbox_budget
    if not isinstance(backend, SMTPBackend):
        return None
    cls = type(backend)
    bounded = _bounded_classes.get(cls)
    if bounded is None:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        bounded = _bounded_classes[cls] = type(cls.__name__, (_BoundedSMTPBackend, cls), namespace)
    budget = _Budget()
    backend._outbox_budget = budget  # type: ignore[attr-defined]
    backend.__class__ = bounded
    return budget


def _connect(
    base: type[smtplib.SMTP], budget: _Budget, host: str, port: int, params: dict[str, Any]
) -> smtplib.SMTP:
    """``base(host, port, **params)``, with the connection's waits bounded from the first one."""
    connection = base(**params)  # no host: not connected yet
    bound_connection(connection, budget)
    code, message = connection.connect(host, port)
    if code != 220:  # as smtplib.SMTP.__init__ does
        connection.close()
        raise smtplib.SMTPConnectError(code, message)
    # Which server this is (handover_server): its greeting names it.
    setattr(connection, _GREETING, message)
    return connection


def bound_connection(connection: smtplib.SMTP, budget: _Budget) -> None:
    """Give every wait of ``connection`` on the server the time ``budget`` has left.

    Only this instance is changed (smtplib calls these as ``self.x``): its
    socket is opened with that timeout (for SMTP_SSL the handshake too), each
    command is written with it, and replies are read through
    :class:`_BoundedReader`, which sets it before each read.
    """
    if getattr(connection, _BOUNDED, None) is not None:
        return
    timeout = connection.timeout
    per_wait = float(timeout) if _is_seconds(timeout) else socket.getdefaulttimeout()
    cls = type(connection)
    original_send, original_getreply = connection.send, connection.getreply

    def _get_socket(host: str, port: int, timeout: float) -> socket.socket:
        return cls._get_socket(connection, host, port, budget.wait(per_wait))  # type: ignore[attr-defined]

    def send(s: bytes | str) -> None:
        if connection.sock is not None:
            try:
                connection.sock.settimeout(budget.wait(per_wait))
            except TimeoutError as exc:
                connection.close()  # as smtplib does when a write times out
                raise smtplib.SMTPServerDisconnected(str(exc)) from exc
        original_send(s)

    def getreply() -> tuple[int, bytes]:
        sock, reader = connection.sock, connection.file
        if sock is not None and not (
            isinstance(reader, io.BufferedReader)
            and isinstance(reader.raw, _BoundedReader)
            and reader.raw.sock is sock
        ):
            if reader is not None:
                reader.close()  # smtplib's own reader; nothing is left unread in it
            connection.file = io.BufferedReader(_BoundedReader(sock, budget, per_wait))
        return original_getreply()

    setattr(connection, "_get_socket", _get_socket)  # noqa: B010
    setattr(connection, "send", send)  # noqa: B010
    setattr(connection, "getreply", getreply)  # noqa: B010
    setattr(connection, _BOUNDED, budget)


class _BoundedReader(io.RawIOBase):
    """A socket's bytes, each read given the time the send has left."""

    def __init__(self, sock: socket.socket, budget: _Budget, per_wait: float | None) -> None:
        super().__init__()
        self.sock, self.budget, self.per_wait = sock, budget, per_wait

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        # Past the deadline, no more reads: TimeoutError, which smtplib's
        # getreply() turns into SMTPServerDisconnected, as for a socket timeout.
        self.sock.settimeout(self.budget.wait(self.per_wait))
        count = self.sock.recv_into(buffer)
        # STARTTLS's handshake, next, takes the socket's timeout as its own.
        self.sock.settimeout(self.budget.wait(self.per_wait, strict=False))
        return count


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
