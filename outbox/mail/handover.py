"""The SMTP hand-over: when a failure is in doubt, and which server has the message.

:func:`watch_handover` turns on the watch of one :class:`HandoverSMTP` connection so that a
failure after the whole message was handed over (after SMTP's final ``.``,
before the server's reply) is raised as
:class:`~outbox.exceptions.AmbiguousDeliveryError`: the server may have the
message, and resending it could deliver it twice. The worker calls it after
every successful ``backend.open()``; it is re-exported as
``outbox.backends.watch_handover``, its documented home. The connection it
watches is :class:`~outbox.mail.connection.HandoverSMTP`, which the outbox's
backend classes (:func:`~outbox.mail.bounded.bounded_backend_class`) give Django's SMTP backend.

:func:`handover_server` says where a connection hands its messages over:
the server's greeting host name and the peer address. A pool of relays
behind one host name (several A records, a load balancer) puts each new
connection on any of them, so only this tells which server's log can answer
for a message (:mod:`outbox.reconcilers`).
"""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Callable

from django.core.mail.backends.base import BaseEmailBackend

from .connection import HandoverSMTP, HandoverState, Server
from .sendmail import SendmailBackend


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
    the outbox creates: :func:`~outbox.mail.bounded.bounded_backend_class`): its ``send`` notes
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
    state = HandoverState()
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
