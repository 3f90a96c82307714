"""One sender thread's delivery connections: the default one, and one per mailer it used.

An email that names a mailer (``Email.mailer``, see :mod:`outbox.mail.mailers`) is
sent through that mailer's connection; every other email through the
thread's default connection, as before mailers existed: for those the lookup
is one test of an empty string.

A mailer's connection (and the default one, when the thread could not create
it at its start: ``ImproperlyConfigured``, see ``process.Worker``) is created the
first time the thread sends one of its emails (``SEND_TIMEOUT`` applied by
:func:`outbox.mail.mailers.get_connection`), and then lives as long as the
thread. Every connection, the default one
included, follows the same rules:

- it is opened just before a send when it is not open, and the SMTP
  hand-over watcher is installed on each new connection
  (:func:`outbox.backends.watch_handover`);
- it is closed after any outcome but a success or a release (the server may
  be in a bad state), and all of them are closed while the thread idles
  (rather than let a server time an idle connection out mid-send) and when
  the thread stops.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.mail.backends.base import BaseEmailBackend

from ..mail.handover import watch_handover
from ..mail.mailers import get_connection
from .backoff import close_quietly


class Connection:
    """One delivery backend of a sender thread, and whether it is open."""

    __slots__ = ("backend", "fence", "is_open")

    def __init__(self, backend: BaseEmailBackend, fence: Callable[[], bool] | None = None) -> None:
        self.backend = backend
        self.fence = fence  # asked before SMTP's final dot (outbox.mail.handover)
        self.is_open = False

    def ensure_open(self) -> None:
        """Open it if it is not; raises what ``backend.open()`` raises (nothing was sent)."""
        if not self.is_open:
            self.backend.open()
            watch_handover(self.backend, self.fence)
            self.is_open = True

    def close(self) -> None:
        """Close it quietly if it is open (a dead connection may fail to say goodbye)."""
        if self.is_open:
            close_quietly(self.backend)
            self.is_open = False


class Connections:
    """The default connection (given, or created on first use) and the mailers' (on first use)."""

    def __init__(
        self, default: BaseEmailBackend | None, fence: Callable[[], bool] | None = None
    ) -> None:
        self.fence = fence
        self.default = None if default is None else Connection(default, fence)
        self.owns_default = False  # created here: closed here for good, not by the thread's owner
        self.mailers: dict[str, Connection] = {}

    def get(self, mailer: str) -> Connection:
        """The connection of ``mailer`` (``""``: the default); raises if it cannot be created."""
        if not mailer:
            if self.default is None:
                self.default = Connection(get_connection(""), self.fence)
                self.owns_default = True
            return self.default
        found = self.mailers.get(mailer)
        if found is None:
            found = self.mailers[mailer] = Connection(get_connection(mailer), self.fence)
        return found

    def close_open(self) -> None:
        """Close every open connection (the thread is about to idle)."""
        if self.default is not None:
            self.default.close()
        for connection in self.mailers.values():
            connection.close()

    def close_mailers(self) -> None:
        """Close the mailers' connections for good (the thread stops; its owner closes the
        default, unless it was created here)."""
        connections = list(self.mailers.values())
        if self.owns_default and self.default is not None:
            connections.append(self.default)
        for connection in connections:
            close_quietly(connection.backend)
            connection.is_open = False
