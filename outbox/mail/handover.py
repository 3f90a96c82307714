"""The SMTP hand-over: when a failure is in doubt, and how long a send may take.

:func:`watch_handover` turns on the watch of one :class:`HandoverSMTP` connection so that a
failure after the whole message was handed over (after SMTP's final ``.``,
before the server's reply) is raised as
:class:`~outbox.exceptions.AmbiguousDeliveryError`: the server may have the
message, and resending it could deliver it twice. The worker calls it after
every successful ``backend.open()``; it is re-exported as
``outbox.backends.watch_handover``, its documented home.

:func:`bounded_backend_class` makes ``OUTBOX["SEND_TIMEOUT"]`` bound the whole
of each call of Django's SMTP backend (``open()``, ``send_messages()``,
``close()``), not each wait on the server: a server that answers one byte at
a time cannot hold a sender thread, or SIGTERM, for longer than that. The
outbox creates every delivery backend from it (:mod:`outbox.mail.targets`,
:mod:`outbox.mail.mailers`). Both use only public extension points: a subclass
of the configured backend class, and a subclass of its ``smtplib`` class given
to it through Django's ``connection_class``; no instance is changed.

:func:`handover_server` says where a connection hands its messages over:
the server's greeting host name and the peer address. A pool of relays
behind one host name (several A records, a load balancer) puts each new
connection on any of them, so only this tells which server's log can answer
for a message (:mod:`outbox.reconcilers`).
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
import io
import math
import smtplib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend

from ..conf import outbox_settings
from ..exceptions import AmbiguousDeliveryError, SendFencedError
from .sendmail import SendmailBackend

# What smtplib.SMTP.data() writes last: the body ends in CRLF, then "." CRLF.
_END_OF_DATA = b"\r\n.\r\n"
_B = TypeVar("_B", bound=BaseEmailBackend)


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

    For an SMTP connection watched by :func:`watch_handover`: the
    server it greeted us as, and its peer address. For the outbox's
    ``SendmailBackend``: this host (its local MTA, whose log names this
    host). Other backends (an HTTP API) are not known.
    """
    if isinstance(backend, SendmailBackend):
        return Server(socket.gethostname()[:253])
    connection = getattr(backend, "connection", None)
    state = connection.outbox_handover if isinstance(connection, HandoverSMTP) else None
    return state.server if state is not None else None


def server_of(connection: smtplib.SMTP) -> Server:
    """The server an open smtplib connection reached (public attributes only).

    The greeting is the one a :class:`HandoverSMTP` connection keeps from
    ``SMTP.connect()``; a connection opened otherwise is named by its EHLO
    or HELO reply (``ehlo_resp``, ``helo_resp``), whose first word is the
    server's host name too.
    """
    host = ""
    greeting = connection.outbox_greeting if isinstance(connection, HandoverSMTP) else None
    for reply in (greeting, connection.ehlo_resp, connection.helo_resp):
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
    It acts on a ``backend.connection`` made by :class:`HandoverSMTP` (every
    Django SMTP backend, ``SMTP_SSL`` and a project's subclass included, that
    the outbox creates: :func:`bounded_backend_class`): its ``send`` notes
    when the end of the message (``CRLF . CRLF``) was written during
    ``data()``, and its ``data`` re-raises any error after that point as
    ``AmbiguousDeliveryError`` ``from`` the original: the connection cut
    (``SMTPServerDisconnected``), the reply timed out (smtplib turns that
    into ``SMTPServerDisconnected`` too), or an unreadable reply
    (``SMTPResponseException``). A reply that is not a clear answer (anything
    but 250 or a 4xx/5xx code) is in doubt as well. A 4xx or 5xx reply to the
    final dot is a clear refusal and stays what it is, as does every failure
    before the body was complete: a connection refused, the greeting,
    authentication, MAIL, RCPT, the DATA command, or a write that did not
    finish.

    The state is reset for each message. The error passes through Django's
    backend even with ``fail_silently`` (which swallows only
    ``smtplib.SMTPException``): an ambiguous send must not look unsent.
    Calling it again on the same connection does nothing. Any other backend,
    or an smtplib connection the outbox did not make, is left alone, like an
    HTTP API: fenced only before the send starts.
    """
    connection = getattr(backend, "connection", None)
    if not isinstance(connection, HandoverSMTP) or connection.outbox_handover is not None:
        return
    state = _Handover()
    state.fence = fence
    state.server = server_of(connection)
    if fence is not None:
        _send_small_writes_at_once(connection)
    connection.outbox_handover = state


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


class HandoverSMTP(smtplib.SMTP):
    """An ``smtplib.SMTP`` whose waits share its backend's deadline and that watches the hand-over.

    Django's SMTP backend creates its connections from ``connection_class``;
    the outbox's backend classes (:func:`bounded_backend_class`) give it
    this class put before whatever class the backend would use
    (:func:`handover_connection_class`: ``SMTP``, ``SMTP_SSL`` or a
    project's own subclass). Every wait on the server gets the time the
    backend's current call has left, at most the connection's own
    ``timeout``: the connect (for SMTP_SSL the handshake too; smtplib opens
    the socket with ``self.timeout``), each write (:meth:`send`) and each
    read of a reply (:meth:`getreply` reads through :class:`_BoundedReader`).
    After :func:`watch_handover`, :meth:`send` and :meth:`data` also note
    the hand-over and ask the fence.
    """

    # Set by watch_handover(): where data() is, and the fence.
    outbox_handover: _Handover | None = None
    # The text of the server's 220 greeting, kept by connect() (handover_server).
    outbox_greeting: bytes | None = None

    def __init__(self, *args: Any, outbox_budget: _Budget | None = None, **kwargs: Any) -> None:
        # Before smtplib's __init__, which connects when given a host.
        self.outbox_budget = outbox_budget if outbox_budget is not None else _Budget()
        super().__init__(*args, **kwargs)

    def _outbox_per_wait(self) -> float | None:
        timeout = self.timeout
        return float(timeout) if _is_seconds(timeout) else socket.getdefaulttimeout()

    def connect(
        self, host: str = "localhost", port: int = 0, source_address: Any = None
    ) -> tuple[int, bytes]:
        # smtplib opens the socket (and SMTP_SSL shakes hands) with self.timeout;
        # None is "no limit" there, as for socket.create_connection.
        own = self.timeout
        self.timeout = self.outbox_budget.wait(self._outbox_per_wait())  # type: ignore[assignment]
        try:
            code, message = super().connect(host, port, source_address)
        finally:
            self.timeout = own
        # Which server this is (handover_server): its greeting names it.
        self.outbox_greeting = message
        return code, message

    def send(self, s: bytes | str) -> None:  # type: ignore[override]
        if self.sock is not None:
            try:
                self.sock.settimeout(self.outbox_budget.wait(self._outbox_per_wait()))
            except TimeoutError as exc:
                self.close()  # as smtplib does when a write times out
                raise smtplib.SMTPServerDisconnected(str(exc)) from exc
        state = self.outbox_handover
        if state is None or not state.in_data:
            return super().send(s)
        ends = _tail(s) == _END_OF_DATA
        if ends and state.fence is not None:
            # smtplib writes the body and the final ".\r\n" in one call: split
            # them, so that the fence is asked as late as it can be.
            super().send(s[:-3])
            if not state.fence():
                self.close()
                raise SendFencedError("the lease ran out before the final dot; not handed over")
            s = s[-3:]
        super().send(s)
        # Only once send() returned did the kernel take every byte: a write
        # that failed part-way cannot have delivered the final dot.
        if ends:
            state.handed_over = True

    def getreply(self) -> tuple[int, bytes]:
        # smtplib makes its reader only when it has none (after connect and
        # STARTTLS it has none): this one bounds each read.
        if self.file is None and self.sock is not None:
            bounded = _BoundedReader(self.sock, self.outbox_budget, self._outbox_per_wait())
            self.file = io.BufferedReader(bounded)
        return super().getreply()

    def data(self, msg: bytes | str) -> tuple[int, bytes]:  # type: ignore[override]
        state = self.outbox_handover
        if state is None:
            return super().data(msg)
        state.in_data, state.handed_over = True, False
        try:
            code, reply = super().data(msg)
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


_connection_classes: dict[type, type] = {}


def handover_connection_class(base: type[smtplib.SMTP]) -> type[HandoverSMTP]:
    """:class:`HandoverSMTP` put before ``base`` (same name), made once per class."""
    if issubclass(base, HandoverSMTP):
        return base
    made = _connection_classes.get(base)
    if made is None:
        namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__}
        made = type(base.__name__, (HandoverSMTP, base), namespace)
        made = _connection_classes.setdefault(base, made)
    return made


class BoundedSMTPBackend(SMTPBackend):
    """Put before Django's SMTP backend class (or a subclass): each call gets a deadline.

    Never used as it is: :func:`bounded_backend_class` puts it before the
    class a project configured, so that the project's own overrides stay.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.outbox_budget = _Budget()
        super().__init__(*args, **kwargs)

    @property
    def connection_class(self) -> Callable[..., smtplib.SMTP]:  # type: ignore[override]
        made = handover_connection_class(super().connection_class)
        return functools.partial(made, outbox_budget=self.outbox_budget)

    def open(self) -> bool | None:
        budget = self.outbox_budget
        started = time.monotonic()
        if not budget.start():
            return super().open()
        try:
            opened: bool | None = super().open()
        finally:
            budget.deadline = None
        if opened:
            budget.spent = time.monotonic() - started
        return opened

    def send_messages(self, email_messages: Sequence[Any]) -> int:
        budget = self.outbox_budget
        if not budget.start(spent=budget.spent):
            return super().send_messages(email_messages)
        budget.spent = 0.0
        try:
            return super().send_messages(email_messages)
        finally:
            budget.deadline = None

    def close(self) -> None:
        budget = self.outbox_budget
        if not budget.start():
            return super().close()
        budget.spent = 0.0
        try:
            super().close()
        finally:
            budget.deadline = None


_backend_classes: dict[type, type] = {}


def bounded_backend_class(cls: type[_B]) -> type[_B]:
    """The class the outbox creates for a configured backend class ``cls``.

    For Django's SMTP backend or a subclass: a subclass of it (same name)
    whose ``open()``, ``send_messages()`` and ``close()`` each take at most
    about ``OUTBOX["SEND_TIMEOUT"]`` (read when the call starts), whatever
    the server does; the first ``send_messages()`` after an ``open()`` gets
    what the open left of it, so that connecting and sending one message
    take that long in all. Its connections are :class:`HandoverSMTP`, which
    :func:`watch_handover` can watch. Any other class is returned as it is
    (a backend with its own notion of a time limit, such as
    ``SendmailBackend``, keeps it).
    """
    if not isinstance(cls, type) or not issubclass(cls, SMTPBackend):
        return cls
    if issubclass(cls, BoundedSMTPBackend):
        return cls
    made = _backend_classes.get(cls)
    if made is None:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        made = type(cls.__name__, (BoundedSMTPBackend, cls), namespace)
        made = _backend_classes.setdefault(cls, made)
    return made


def bound_send_time(backend: BaseEmailBackend) -> _Budget | None:
    """The deadline keeper of a backend made from :func:`bounded_backend_class`, else None.

    Backends are bounded from their creation (the outbox creates every
    delivery backend from :func:`bounded_backend_class`); an instance made
    otherwise is left as it is.
    """
    return backend.outbox_budget if isinstance(backend, BoundedSMTPBackend) else None


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
