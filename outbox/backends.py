"""Email backends: where the worker delivers, and the backends the outbox ships.

The worker's delivery target is, in order:

1. ``OUTBOX["EMAIL_BACKEND"]``: a backend's dotted path (any Django version);
2. on Django >= 6.1 with ``settings.MAILERS``: the mailer ``OUTBOX["MAILER"]``
   (default ``"default"``);
3. otherwise ``settings.EMAIL_BACKEND`` (Django <= 6.0, or 6.1 not yet migrated).
"""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage, sanitize_address
from django.utils.module_loading import import_string

from .conf import outbox_settings
from .exceptions import DeliveryError

HAS_MAILERS = hasattr(mail, "mailers")  # Django >= 6.1
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EX_TEMPFAIL = 75  # sysexits.h: "try again later"


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
        super().__init__(fail_silently=fail_silently, **kwargs)
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
        encoding = message.encoding or settings.DEFAULT_CHARSET
        sender = sanitize_address(message.from_email, encoding)
        envelope = [sanitize_address(addr, encoding) for addr in recipients]
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
