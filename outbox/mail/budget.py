"""The time limit of a whole send: one deadline shared by every wait on the server.

Each call of the backend gets a deadline; every wait on the server inside it
(connect, TLS handshake, each read of a reply, each write) gets the time that
is left as its socket timeout. Past the deadline a read or write fails as a
socket timeout does there, so it is classified the same way: before the final
dot a retryable failure, after it a message in doubt
(:func:`~outbox.mail.handover.watch_handover`). The connection that asks it is
:class:`~outbox.mail.connection.HandoverSMTP`; the backend that sets it,
:func:`~outbox.mail.bounded.bounded_backend_class`.
"""

from __future__ import annotations

import io
import socket
import time
from typing import Any

from ..conf import outbox_settings


class SendBudget:
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


class BoundedReader(io.RawIOBase):
    """A socket's bytes, each read given the time the send has left."""

    def __init__(self, sock: socket.socket, budget: SendBudget, per_wait: float | None) -> None:
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
