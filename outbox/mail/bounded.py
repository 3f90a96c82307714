"""Delivery backends whose every call takes at most ``OUTBOX["SEND_TIMEOUT"]``.

:func:`bounded_backend_class` makes ``OUTBOX["SEND_TIMEOUT"]`` bound the whole
of each call of Django's SMTP backend (``open()``, ``send_messages()``,
``close()``), not each wait on the server: a server that answers one byte at
a time cannot hold a sender thread, or SIGTERM, for longer than that. The
outbox creates every delivery backend from it (:mod:`outbox.mail.targets`,
:mod:`outbox.mail.mailers`). It uses only public extension points: a subclass
of the configured backend class, and a subclass of its ``smtplib`` class
(:class:`~outbox.mail.connection.HandoverSMTP`) given to it through Django's
``connection_class``; no instance is changed.
"""

from __future__ import annotations

import functools
import smtplib
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend

from .budget import SendBudget
from .connection import handover_connection_class, put_before

_B = TypeVar("_B", bound=BaseEmailBackend)


class BoundedSMTPBackend(SMTPBackend):
    """Put before Django's SMTP backend class (or a subclass): each call gets a deadline.

    Never used as it is: :func:`bounded_backend_class` puts it before the
    class a project configured, so that the project's own overrides stay.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.outbox_budget = SendBudget()
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
    :func:`~outbox.mail.handover.watch_handover` can watch. Any other class is returned as it is
    (a backend with its own notion of a time limit, such as
    ``SendmailBackend``, keeps it).
    """
    if not isinstance(cls, type) or not issubclass(cls, SMTPBackend):
        return cls
    if issubclass(cls, BoundedSMTPBackend):
        return cls
    return cast(type[_B], put_before(BoundedSMTPBackend, cls, _backend_classes))


def bound_send_time(backend: BaseEmailBackend) -> SendBudget | None:
    """The deadline keeper of a backend made from :func:`bounded_backend_class`, else None.

    Backends are bounded from their creation (the outbox creates every
    delivery backend from :func:`bounded_backend_class`); an instance made
    otherwise is left as it is.
    """
    return backend.outbox_budget if isinstance(backend, BoundedSMTPBackend) else None
