"""The backend that puts mail in the outbox: :class:`OutboxBackend`.

As ``EMAIL_BACKEND`` (Django 5.2) or as a mailer in ``MAILERS`` (Django 6.1),
``send_mail()``, ``EmailMessage.send()``, ``mail_admins()`` and the password
reset form all go through the outbox with no change to the calling code. The
worker must then deliver somewhere else (see :mod:`outbox.mail.targets`)::

    # Django 5.2
    EMAIL_BACKEND = "outbox.backends.OutboxBackend"
    OUTBOX = {"EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"}

    # Django 6.1
    MAILERS = {
        "default": {"BACKEND": "outbox.backends.OutboxBackend"},
        "smtp": {"OPTIONS": {"host": "smtp.example.com", "port": 587, "use_tls": True}},
    }
    OUTBOX = {"MAILER": "smtp"}
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from email.utils import parseaddr
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage
from django.db import DatabaseError

from ..conf import PRIORITIES
from ..enqueue.api import Prepared, write_prepared
from ..enqueue.messages import prepare_message
from ..mail.mailers import delivery_mailers, is_delivery_mailer

logger = logging.getLogger("outbox.backends")


class OutboxBackend(BaseEmailBackend):
    """Put each message in the outbox instead of sending it.

    Every envelope recipient (To, Cc and Bcc) gets one delivery and its own
    copy: the message Django would have sent, with the copy's own Message-ID
    (see :mod:`outbox.mail.message`), never showing a Bcc recipient. The rules are those of
    :func:`~outbox.enqueue_email`: called inside ``transaction.atomic()``
    the rows belong to the caller's transaction (a rollback sends nothing) and
    ids reach Redis after the commit. All messages of one
    :meth:`send_messages` call are written in one transaction.

    Returns the number of messages accepted: 1 from ``send()`` means queued,
    not sent. Each accepted message is then marked, when the write returns
    (inside ``transaction.atomic()``: the rows the commit will make):

    - ``message.outbox_deliveries``: the ids of its
      :class:`~outbox.models.Delivery` rows, one per envelope recipient
      (``to + cc + bcc``, the same address once), in that order;
    - ``message.anymail_status``, when django-anymail is installed (as anymail's
      backends set it on every message they send): an ``AnymailStatus`` that
      says "queued by the outbox", ``status == {"queued"}``, each recipient an
      ``AnymailRecipientStatus(message_id=None, status="queued")``, and
      ``esp_response`` the same list of delivery ids. The ESP's own answer
      comes later, on each delivery's attempts.

    A message with ``message.outbox_sensitive = True`` set before ``send()``
    (a password reset, a login code) is sensitive: its content is cleared as
    soon as its deliveries are settled (``OUTBOX["SENSITIVE_LINKS"]`` marks
    Django's password-reset mail without touching its code; see
    :mod:`outbox.enqueue.sensitive`).

    A message Django would not send (no recipients) is skipped and not
    marked. An invalid one raises
    :class:`~outbox.exceptions.InvalidEmailError` (a ``ValidationError`` and a
    ``ValueError``, as Django's backends raise) or ``TypeError`` before
    anything is written; with ``fail_silently`` it is skipped and not counted,
    and a database error is logged instead of raised.

    Options (``OPTIONS`` of a Django 6.1 mailer, or keyword arguments):
    ``priority`` (``"high"``, ``"normal"``, ``"low"``; default ``"normal"``),
    ``max_attempts`` (default ``OUTBOX["MAX_ATTEMPTS"]``), ``fail_silently``,
    and ``mailer``: the mailer the worker delivers these messages through (see
    :mod:`outbox.mail.mailers`; default: its default target). On Django 6.1, a
    second outbox mailer with ``"OPTIONS": {"mailer": "bulk"}`` lets
    ``send_mail(..., using=<its alias>)`` queue bulk mail.
    """

    # The class marker of a backend that queues mail (outbox.mail.targets).
    outbox_queues_mail = True

    def __init__(
        self,
        fail_silently: bool = False,
        *,
        priority: str = "normal",
        max_attempts: int | None = None,
        mailer: str | None = None,
        **kwargs: Any,
    ) -> None:
        # fail_silently is ours: Django 6.1's base class deprecates it, and
        # rejects any option it does not know (alias is passed on).
        super().__init__(**kwargs)
        self.fail_silently = fail_silently
        alias = getattr(self, "alias", None)
        where = f"MAILERS[{alias!r}]" if alias else "OutboxBackend"
        if priority not in PRIORITIES:
            raise ImproperlyConfigured(
                f"{where}: priority is {priority!r}; use one of {', '.join(PRIORITIES)}."
            )
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
        ):
            raise ImproperlyConfigured(f"{where}: max_attempts must be a positive integer.")
        if mailer and (not isinstance(mailer, str) or not is_delivery_mailer(mailer)):
            raise ImproperlyConfigured(
                f"{where}: mailer is {mailer!r}; use one of "
                f"{', '.join(delivery_mailers()) or '(none configured)'}."
            )
        self.priority = priority
        self.max_attempts = max_attempts
        self.mailer = mailer or ""

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        prepared: list[tuple[EmailMessage, Prepared]] = []
        for message in email_messages:
            if not message.recipients():
                continue
            try:
                one = prepare_message(
                    message,
                    priority=self.priority,
                    max_attempts=self.max_attempts,
                    mailer=self.mailer,
                )
                prepared.append((message, one))
            except (ValidationError, TypeError, ValueError) as exc:  # anymail's own checks too
                if not self.fail_silently:
                    raise
                logger.warning("not queueing an invalid email %r: %s", message.subject, exc)
        if not prepared:
            return 0
        try:
            written = write_prepared([p for _message, p in prepared])
        except DatabaseError:
            if not self.fail_silently:
                raise
            logger.error("could not queue %d email(s)", len(prepared), exc_info=True)
            return 0
        for (message, p), deliveries in zip(prepared, written, strict=True):
            _mark_queued(message, p.recipients, [d.pk for d in deliveries])
        return len(prepared)


def _mark_queued(message: EmailMessage, recipients: Sequence[str], ids: list[int]) -> None:
    """Tell the caller what became of ``message``: :class:`OutboxBackend`'s docstring."""
    message.outbox_deliveries = ids  # type: ignore[attr-defined]
    classes = _anymail_status_classes()
    if classes is None:
        return
    status_class, recipient_class = classes
    status = status_class()
    status.set_recipient_status(
        {
            parseaddr(r)[1] or r: recipient_class(message_id=None, status="queued")
            for r in recipients
        }
    )
    status.esp_response = list(ids)
    message.anymail_status = status  # type: ignore[attr-defined]


@functools.cache
def _anymail_status_classes() -> tuple[Any, Any] | None:
    """anymail's documented ``AnymailStatus`` and ``AnymailRecipientStatus``; None without anymail.

    Looked up once: a failed import searches the whole path every time.
    """
    try:
        from anymail.message import AnymailRecipientStatus, AnymailStatus
    except ImportError:
        return None
    return AnymailStatus, AnymailRecipientStatus
