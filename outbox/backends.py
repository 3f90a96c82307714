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

An email may name another target, a *mailer* (``enqueue_email(...,
mailer="bulk")``): see :mod:`outbox.mailers`; this module's target is the one
every email without a mailer goes to.

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

**Time limit.** :func:`get_delivery_connection` bounds each whole send (the
connect, the dialogue, the body and its reply) by ``OUTBOX["SEND_TIMEOUT"]``
(see its docstring): a server that never answers, or trickles its replies,
holds a sending thread for about that long, not forever.

**Never silent.** A delivery connection is always used with
``fail_silently`` off (:func:`never_silent`), even when its options turn it
on: a swallowed refusal could be neither failed nor suppressed.

**Ambiguous outcomes.** When the connection breaks or times out after the
whole message was handed over (after SMTP's final ``.``, before the server's
reply), the server may have the message; resending it could deliver it twice.
Such an attempt is *in doubt*, and the worker treats it like a crash in the
send window (``ABANDONED_POLICY``). How each backend says so:

- Django's stock SMTP backend: the worker calls :func:`watch_handover` after
  every successful ``backend.open()``; it instruments that one
  ``smtplib.SMTP`` connection so that such a failure is raised as
  :class:`~outbox.exceptions.AmbiguousDeliveryError`.
- :class:`SendmailBackend`: a child killed (by the time limit or a signal)
  after it was given the whole message raises it itself.
- Any other backend: raise ``AmbiguousDeliveryError`` from
  :mod:`outbox.exceptions` (``from`` the original error), for example when an
  HTTP API call times out after the request was sent. Everything else keeps
  its meaning: :func:`outbox.failures.classify` decides.
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage
from django.db import DatabaseError
from django.utils.module_loading import import_string

from .conf import PRIORITIES, outbox_settings

# Re-exported: outbox.backends is where projects and the worker find these.
from .handover import bound_send_time
from .handover import watch_handover as watch_handover
from .sendmail import EX_TEMPFAIL as EX_TEMPFAIL
from .sendmail import SendmailBackend as SendmailBackend
from .sendmail import envelope_address as envelope_address

HAS_MAILERS = hasattr(mail, "mailers")  # Django >= 6.1
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"

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
    """A new instance of the worker's delivery backend, its waits bounded.

    The backend is created as the module docstring says, then its time limit
    is set to ``OUTBOX["SEND_TIMEOUT"]``, or kept when the project configured
    a shorter one itself. The smaller of the two wins: SEND_TIMEOUT is what
    the worker's own promises rest on (a stalled server frees the thread, and
    SIGTERM completes, within about SEND_TIMEOUT), while a project may well
    want a tighter limit for its server.

    - A backend instance with a ``timeout`` attribute (Django's SMTP backend,
      whose ``timeout`` comes from ``EMAIL_TIMEOUT`` or the mailer's
      ``OPTIONS``; :class:`SendmailBackend`; most third-party backends): the
      attribute becomes ``min(timeout, SEND_TIMEOUT)``, or SEND_TIMEOUT when
      it is ``None`` (no limit). Django's SMTP backend reads it as the socket
      timeout, which bounds each wait; :func:`~outbox.handover.bound_send_time`
      then bounds the sum: each ``open()`` and ``send_messages()`` as a whole.
    - A class from ``OUTBOX["EMAIL_BACKEND"]`` whose constructor takes a
      ``timeout`` keyword but whose instances show no ``timeout`` attribute:
      it is created again with ``timeout=SEND_TIMEOUT`` (the outbox creates
      that class with no other arguments, so nothing else is lost).
    - Anything else is left as it is: give it a limit in its own options.
    """
    limit = outbox_settings.SEND_TIMEOUT
    backend: BaseEmailBackend
    if outbox_settings.EMAIL_BACKEND:
        backend_class = import_string(outbox_settings.EMAIL_BACKEND)
        backend = backend_class()
        if not _has_timeout(backend) and _accepts_timeout(backend_class):
            backend = backend_class(timeout=limit)
    elif _uses_mailers():
        backend = mail.mailers[outbox_settings.MAILER or "default"]
    elif HAS_MAILERS:
        backend = mail.mailers.default
    else:
        backend = mail.get_connection()
    _limit_timeout(backend, limit)
    never_silent(backend)
    bound_send_time(backend)
    return backend


_MISSING = object()


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _has_timeout(backend: BaseEmailBackend) -> bool:
    # None counts: for Django's SMTP backend it means "no limit", which we replace.
    value = getattr(backend, "timeout", _MISSING)
    return value is None or _is_seconds(value)


def _accepts_timeout(backend_class: Any) -> bool:
    try:
        parameters = inspect.signature(backend_class).parameters
    except (TypeError, ValueError):  # no signature to inspect (a C type, say)
        return False
    parameter = parameters.get("timeout")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _limit_timeout(backend: BaseEmailBackend, limit: float) -> None:
    if not _has_timeout(backend):
        return
    current = getattr(backend, "timeout", None)
    if current is None or current <= 0 or current > limit:
        try:
            backend.timeout = limit  # type: ignore[attr-defined]
        except AttributeError:  # a read-only property: the backend manages it itself
            logger.debug("cannot set %s.timeout", type(backend).__name__)


def never_silent(backend: BaseEmailBackend) -> None:
    """Turn ``fail_silently`` off on a delivery connection, whatever its options said.

    A silent backend swallows a 550 at RCPT and reports the message as not
    sent: the worker could only retry it blindly, never fail it or suppress
    the recipient. Check ``outbox.W011`` tells the project the option is
    ignored here.
    """
    try:
        backend.fail_silently = False
    except AttributeError:  # a read-only property: the backend manages it itself
        logger.debug("cannot set %s.fail_silently", type(backend).__name__)


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
    ``max_attempts`` (default ``OUTBOX["MAX_ATTEMPTS"]``), ``fail_silently``,
    and ``mailer``: the mailer the worker delivers these messages through (see
    :mod:`outbox.mailers`; default: its default target). On Django 6.1, a
    second outbox mailer with ``"OPTIONS": {"mailer": "bulk"}`` lets
    ``send_mail(..., using=<its alias>)`` queue bulk mail.
    """

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
        if mailer:
            from .mailers import delivery_mailers, is_delivery_mailer

            if not isinstance(mailer, str) or not is_delivery_mailer(mailer):
                raise ImproperlyConfigured(
                    f"{where}: mailer is {mailer!r}; use one of "
                    f"{', '.join(delivery_mailers()) or '(none configured)'}."
                )
        self.priority = priority
        self.max_attempts = max_attempts
        self.mailer = mailer or ""

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        from .api import prepare_message, write_prepared

        prepared = []
        for message in email_messages:
            if not message.recipients():
                continue
            try:
                prepared.append(
                    prepare_message(
                        message,
                        priority=self.priority,
                        max_attempts=self.max_attempts,
                        mailer=self.mailer,
                    )
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
