"""The SMTP connection the outbox sends through: bounded waits and a watched hand-over.

:class:`HandoverSMTP` is an ``smtplib.SMTP`` (put before whatever class the
backend would use) whose waits share its backend's deadline
(:class:`~outbox.mail.budget.SendBudget`) and which, once
:func:`~outbox.mail.handover.watch_handover` gave it a :class:`HandoverState`,
notes when the final dot was handed over and asks the fence right before it.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import math
import smtplib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..exceptions import AmbiguousDeliveryError, SendFencedError
from .budget import BoundedReader, SendBudget

# What smtplib.SMTP.data() writes last: the body ends in CRLF, then "." CRLF.
_END_OF_DATA = b"\r\n.\r\n"


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


class HandoverState:
    """Per-connection state of :func:`~outbox.mail.handover.watch_handover`: where ``data()`` is."""

    in_data: bool = False
    handed_over: bool = False
    # Asked right before the final dot; False: do not hand the message over.
    fence: Callable[[], bool] | None = None
    # The server this connection reached, noted when it was opened.
    server: Server | None = None


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


class HandoverSMTP(smtplib.SMTP):
    """An ``smtplib.SMTP`` whose waits share its backend's deadline and that watches the hand-over.

    Django's SMTP backend creates its connections from ``connection_class``;
    the outbox's backend classes (:func:`~outbox.mail.bounded.bounded_backend_class`) give it
    this class put before whatever class the backend would use
    (:func:`handover_connection_class`: ``SMTP``, ``SMTP_SSL`` or a
    project's own subclass). Every wait on the server gets the time the
    backend's current call has left, at most the connection's own
    ``timeout``: the connect (for SMTP_SSL the handshake too; smtplib opens
    the socket with ``self.timeout``), each write (:meth:`send`) and each
    read of a reply (:meth:`getreply` reads through :class:`~outbox.mail.budget.BoundedReader`).
    After :func:`~outbox.mail.handover.watch_handover`, :meth:`send` and :meth:`data` also note
    the hand-over and ask the fence.
    """

    # Set by handover.watch_handover(): where data() is, and the fence.
    outbox_handover: HandoverState | None = None
    # The text of the server's 220 greeting, kept by connect() (handover_server).
    outbox_greeting: bytes | None = None

    def __init__(self, *args: Any, outbox_budget: SendBudget | None = None, **kwargs: Any) -> None:
        # Before smtplib's __init__, which connects when given a host.
        self.outbox_budget = outbox_budget if outbox_budget is not None else SendBudget()
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
            bounded = BoundedReader(self.sock, self.outbox_budget, self._outbox_per_wait())
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


def put_before(mixin: type, base: type, made: dict[type, type]) -> type:
    """``mixin`` put before ``base`` in a subclass of the same name, made once per ``base``.

    A public way to add behaviour to a class the project chose (its SMTP
    connection class, its email backend) without touching the class itself;
    ``made`` is the caller's cache, so every instance shares one class.
    """
    found = made.get(base)
    if found is None:
        namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__}
        found = made.setdefault(base, type(base.__name__, (mixin, base), namespace))
    return found


def handover_connection_class(base: type[smtplib.SMTP]) -> type[HandoverSMTP]:
    """:class:`HandoverSMTP` put before ``base`` (same name), made once per class."""
    if issubclass(base, HandoverSMTP):
        return base
    return cast(type[HandoverSMTP], put_before(HandoverSMTP, base, _connection_classes))


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
