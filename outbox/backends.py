"""Email backends: where the worker delivers, and the backends the outbox ships.

:class:`OutboxBackend` puts mail in the outbox: as ``EMAIL_BACKEND`` (Django
5.2) or as a mailer in ``MAILERS`` (Django 6.1), ``send_mail()``,
``EmailMessage.send()``, ``mail_admins()`` and the password reset form all go
through the outbox with no change to the calling code.

The worker's delivery target is, in order:

1. ``OUTBOX["EMAIL_BACKEND"]``: a backend's dotted path (any Django version;
   the class is created with no arguments, so on Django 6.1 prefer 2.);
2. on Django >= 6.1 with ``settings.MAILERS``: the mailer ``OUTBOX["MAILER"]``
   (default ``"default"``);
3. otherwise ``settings.EMAIL_BACKEND`` (Django <= 6.0, or 6.1 not yet migrated).

When the project's own mail goes through :class:`OutboxBackend`, the worker
must deliver somewhere else: system check ``outbox.E008`` refuses a target that
is the outbox itself. Typical settings::

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

import logging
import subprocess
import warnings
from collections.abc import Sequence
from email.utils import parseaddr
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage
from django.db import DatabaseError
from django.utils.module_loading import import_string

from .conf import PRIORITIES, outbox_settings
from .exceptions import DeliveryError

HAS_MAILERS = hasattr(mail, "mailers")  # Django >= 6.1
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EX_TEMPFAIL = 75  # sysexits.h: "try again later"

logger = logging.getLogger("outbox.backends")


def _uses_mailers() -> bool:
    return HAS_MAILERS and hasattr(settings, "MAILERS")


def delivery_backend_path() -> str:
    """Dotted path of the backend class the worker delivers through."""
    if outbox_settings.EMAIL_BACKEND:
        return outbox_settings.EMAIL_BACKEND
    if _uses_mailers():
        alias = outbox_settings.MAILER or "default"
        mailers: dict[str, Any] = getattr(settings, "MAILERS", {})
        if alias not in mailers:
            raise ImproperlyConfigured(f"OUTBOX['MAILER'] is {alias!r}, which is not in MAILERS.")
        return str(mailers[alias].get("BACKEND", SMTP_BACKEND))
    with warnings.catch_warnings():
        # Django 6.1 warns on any read of the deprecated setting; the project
        # already got that warning for defining it.
        warnings.simplefilter("ignore")
        return str(getattr(settings, "EMAIL_BACKEND", SMTP_BACKEND))


def get_delivery_connection() -> BaseEmailBackend:
    """A new instance of the worker's delivery backend (see the module docstring)."""
    if outbox_settings.EMAIL_BACKEND:
        backend_class = import_string(outbox_settings.EMAIL_BACKEND)
        backend: BaseEmailBackend = backend_class()
        return backend
    if _uses_mailers():
        return mail.mailers[outbox_settings.MAILER or "default"]
    if HAS_MAILERS:
        return mail.mailers.default
    return mail.get_connection()


def envelope_address(value: str) -> str:
    """The bare ``local@domain`` of an address, domain IDNA-encoded."""
    address = parseaddr(value)[1] or value
    local, _, domain = address.rpartition("@")
    try:
        domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        pass  # leave it; the mail server will refuse it and say why
    return f"{local}@{domain}" if local else address


class SendmailBackend(BaseEmailBackend):
    """Pipe each message to a sendmail binary, never through a shell.

    Called as ``sendmail -oi -f <envelope sender> -- <recipients...>`` with the
    message on standard input. Exit status 75 (``EX_TEMPFAIL``) is a transient
    failure (the worker retries); any other non-zero status is permanent. Both
    carry sendmail's standard error in the message.

    Options (``OPTIONS`` of a Django 6.1 mailer, or keyword arguments):
    ``sendmail_path`` (default ``OUTBOX["SENDMAIL_PATH"]``), ``timeout`` seconds.
    """

    def __init__(
        self,
        sendmail_path: str | None = None,
        timeout: float = 60.0,
        fail_silently: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Our own attribute: Django 6.1 deprecates the base class's.
        self.fail_silently = fail_silently
        self.sendmail_path = sendmail_path or outbox_settings.SENDMAIL_PATH
        self.timeout = timeout

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        sent = 0
        for message in email_messages:
            try:
                if self._send(message):
                    sent += 1
            except DeliveryError:
                if not self.fail_silently:
                    raise
        return sent

    def _send(self, message: EmailMessage) -> bool:
        recipients = message.recipients()
        if not recipients:
            return False
        # The envelope carries bare addresses: a display name in `-f` or a
        # recipient argument would reach MAIL FROM / RCPT TO verbatim in some
        # sendmail implementations.
        sender = envelope_address(message.from_email)
        envelope = [envelope_address(addr) for addr in recipients]
        data = message.message().as_bytes()
        command = [self.sendmail_path, "-oi", "-f", sender, "--", *envelope]
        try:
            result = subprocess.run(
                command, input=data, capture_output=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"sendmail timed out after {self.timeout:g}s") from None
        except OSError as exc:
            raise DeliveryError(f"cannot run {self.sendmail_path}: {exc}") from exc
        if result.returncode == 0:
            return True
        stderr = result.stderr.decode("utf-8", "replace").strip()
        raise DeliveryError(
            f"sendmail exited with status {result.returncode}: {stderr}",
            permanent=result.returncode != EX_TEMPFAIL,
        )


class OutboxBackend(BaseEmailBackend):
    """Put each message in the outbox instead of sending it.

    Every envelope recipient (To, Cc and Bcc) gets one delivery and its own
    copy; the copies show the To and Cc headers as written, never a Bcc
    recipient (see :mod:`outbox.message`). The rules are those of
    :func:`~outbox.api.enqueue_email`: called inside ``transaction.atomic()``
    the rows belong to the caller's transaction (a rollback sends nothing) and
    ids reach Redis after the commit. All messages of one
    :meth:`send_messages` call are written in one transaction.

    Returns the number of messages accepted. A message Django would not send
    (no recipients) is skipped. An invalid one raises its
    :class:`~django.core.exceptions.ValidationError` (or ``TypeError``) before
    anything is written; with ``fail_silently`` it is skipped and not counted,
    and a database error is logged instead of raised.

    Options (``OPTIONS`` of a Django 6.1 mailer, or keyword arguments):
    ``priority`` (``"high"``, ``"normal"``, ``"low"``; default ``"normal"``),
    ``max_attempts`` (default ``OUTBOX["MAX_ATTEMPTS"]``), ``fail_silently``.
    """

    def __init__(
        self,
        fail_silently: bool = False,
        *,
        priority: str = "normal",
        max_attempts: int | None = None,
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
        self.priority = priority
        self.max_attempts = max_attempts

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        from .api import prepare_message, write_prepared

        prepared = []
        for message in email_messages:
            if not message.recipients():
                continue
            try:
                prepared.append(
                    prepare_message(message, priority=self.priority, max_attempts=self.max_attempts)
                )
            except (ValidationError, TypeError) as exc:
                if not self.fail_silently:
                    raise
                logger.warning("not queueing an invalid email %r: %s", message.subject, exc)
        if not prepared:
            return 0
        try:
            write_prepared(prepared)
        except DatabaseError:
            if not self.fail_silently:
                raise
            logger.error("could not queue %d email(s)", len(prepared), exc_info=True)
            return 0
        return len(prepared)
