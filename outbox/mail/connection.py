"""The SMTP connection the outbox sends through: bounded waits and a watched hand-over.

:class:`HandoverSMTP` is an ``smtplib.SMTP`` (put before whatever class the
backend would use) whose waits share its backend's deadline
(:class:`~outbox.mail.budget.SendBudget`) and which, once
:func:`~outbox.mail.handover.watch_handover` gave it a :class:`HandoverState`,
notes when the final dot was handed over and asks the fence right before it.
To a server that offers PIPELINING it writes a message's MAIL, RCPT and DATA
at once (``OUTBOX["SMTP_PIPELINING"]``).
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import io
import math
import re
import smtplib
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..conf import outbox_settings
from ..exceptions import AmbiguousDeliveryError, SendFencedError
from .budget import BoundedReader, SendBudget

# What smtplib.SMTP.data() writes last: the body ends in CRLF, then "." CRLF.
_END_OF_DATA = b"\r\n.\r\n"
# RFC 5321 4.5.2: a line of the body that starts with "." gets another.
_DOT_AT_LINE_START = re.compile(rb"(?m)^\.")


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
        return self._outbox_watched(msg, super().data)

    def _outbox_watched(
        self, msg: bytes | str, write: Callable[[Any], tuple[int, bytes]]
    ) -> tuple[int, bytes]:
        """``write(msg)`` (the DATA exchange or, pipelined, the body), the hand-over watched."""
        state = self.outbox_handover
        if state is None:
            return write(msg)
        state.in_data, state.handed_over = True, False
        try:
            code, reply = write(msg)
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

    def sendmail(  # type: ignore[override]
        self,
        from_addr: str,
        to_addrs: str | Sequence[str],
        msg: bytes | str,
        mail_options: Sequence[str] = (),
        rcpt_options: Sequence[str] = (),
    ) -> dict[str, tuple[int, bytes]]:
        """smtplib's ``sendmail``, pipelined (RFC 2920) where the server offers it.

        MAIL, every RCPT and DATA go in one write, then their replies are
        read in order: one round trip before the body instead of two plus one
        per recipient. What it raises and returns is what smtplib's does, and
        it closes or resets when smtplib's does; DATA's own refusal is reset
        (or closed, for a 421) too, where smtplib leaves the transaction open
        for the server to refuse the next MAIL. Each reply is read whatever
        the one before it said, so that the connection stays in step. The body goes as ``data()``'s
        does: watched, the fence asked before the final dot. A ``str``
        message and the SMTPUTF8 option go smtplib's way, unpipelined.
        """
        self.ehlo_or_helo_if_needed()
        if not (
            outbox_settings.SMTP_PIPELINING
            and self.has_extn("pipelining")
            and isinstance(msg, bytes)
            and not any(option.lower() == "smtputf8" for option in mail_options)
        ):
            return super().sendmail(from_addr, to_addrs, msg, mail_options, rcpt_options)
        recipients = [to_addrs] if isinstance(to_addrs, str) else list(to_addrs)
        options = [f"size={len(msg)}"] if self.has_extn("size") else []
        options += mail_options
        commands = [_command("MAIL FROM:", from_addr, options)]
        commands += [_command("RCPT TO:", address, rcpt_options) for address in recipients]
        commands.append("DATA\r\n")
        self.send("".join(commands))

        code, reply = self.getreply()
        if code != 250:
            self._outbox_end_transaction(code, pending=len(recipients) + 1)
            raise smtplib.SMTPSenderRefused(code, reply, from_addr)
        refused: dict[str, tuple[int, bytes]] = {}
        for address in recipients:
            code, reply = self.getreply()
            if code not in (250, 251):
                refused[address] = (code, reply)
            if code == 421:
                self.close()
                raise smtplib.SMTPRecipientsRefused(refused)
        code, reply = self.getreply()
        if len(refused) == len(recipients):
            # The DATA of a transaction without a recipient fails (RFC 2920 3.1);
            # a server that said 354 all the same gets an empty message, to nobody.
            self._outbox_end_transaction(code, pending=0)
            raise smtplib.SMTPRecipientsRefused(refused)
        if code != 354:
            self._outbox_end_transaction(code, pending=0)
            raise smtplib.SMTPDataError(code, reply)
        code, reply = self._outbox_watched(msg, self._outbox_write_body)
        if code != 250:
            self._outbox_end_transaction(code, pending=0)
            raise smtplib.SMTPDataError(code, reply)
        return refused

    def _outbox_write_body(self, msg: bytes) -> tuple[int, bytes]:
        """What ``data()`` writes once DATA was answered 354, and the reply to it."""
        body = _DOT_AT_LINE_START.sub(b"..", msg)
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        self.send(body + b".\r\n")
        return self.getreply()

    def _outbox_end_transaction(self, code: int, pending: int) -> None:
        """A pipelined transaction failed on a reply ``code``: close (421) or reset.

        The ``pending`` replies still on their way are read first (a 354 among
        them is answered with the final dot alone), so that the reset is
        answered by its own reply. A connection that breaks meanwhile is
        closed: the refusal that came first is the one to report.
        """
        if code == 421:
            self.close()
            return
        try:
            while True:
                if code == 354:
                    self.send(b".\r\n")
                    pending += 1
                if not pending:
                    break
                code, _reply = self.getreply()
                pending -= 1
                if code == 421:
                    self.close()
                    return
            self.rset()
        except (smtplib.SMTPServerDisconnected, OSError):
            self.close()


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


def _command(verb: str, address: str, options: Sequence[str]) -> str:
    """One MAIL or RCPT line as smtplib writes it: the address in angle brackets."""
    name, bare = email.utils.parseaddr(address)
    if (name, bare) == ("", ""):
        # Unparsable: sent as given, as smtplib does.
        bracketed = address if address.strip().startswith("<") else f"<{address}>"
    else:
        bracketed = f"<{bare}>"
    line = verb + bracketed + "".join(f" {option}" for option in options)
    if "\r" in line or "\n" in line:
        # smtplib's putcmd() refuses these too: they would start a command of their own.
        raise ValueError(f"command and arguments contain prohibited newline characters: {line!r}")
    return line + "\r\n"


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
