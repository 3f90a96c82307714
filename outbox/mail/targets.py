"""Where the worker delivers: the default target and the connection to it.

The target of every email without a mailer is, in order:

1. ``OUTBOX["EMAIL_BACKEND"]``: a backend's dotted path (any Django version;
   the class is created with no arguments, so on Django 6.1 prefer 2.);
2. on Django >= 6.1 with ``settings.MAILERS``: the mailer ``OUTBOX["MAILER"]``
   (default ``"default"``);
3. otherwise ``settings.EMAIL_BACKEND``.

An email may name another target, a *mailer*: see :mod:`outbox.mail.mailers`.
A target must not be the outbox itself (check ``outbox.E008``): backends that
queue mail say so with the class marker :data:`QUEUES_MAIL`.

Every delivery connection is bounded by ``OUTBOX["SEND_TIMEOUT"]`` as a whole
send (:func:`get_delivery_connection`) and never fails silently
(:func:`never_silent`): a swallowed refusal could be neither failed nor
suppressed. How an ambiguous outcome (the connection lost after the whole
message was handed over) is recognised is in :mod:`outbox.mail.handover`.
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string

from ..conf import outbox_settings
from .bounded import bounded_backend_class

HAS_MAILERS = hasattr(mail, "mailers")  # Django >= 6.1
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"

logger = logging.getLogger("outbox.mail")

# The class attribute that marks a backend as one that queues mail (the
# outbox's own): never a delivery target.
QUEUES_MAIL = "outbox_queues_mail"


def queues_mail(backend_class: object) -> bool:
    """Whether ``backend_class`` puts mail in the outbox instead of delivering it."""
    return bool(getattr(backend_class, QUEUES_MAIL, False))


def uses_mailers() -> bool:
    """Whether the project configures its mail with Django 6.1's ``MAILERS``."""
    return HAS_MAILERS and hasattr(settings, "MAILERS")


def delivery_backend_path() -> str:
    """Dotted path of the backend class the worker delivers through."""
    if outbox_settings.EMAIL_BACKEND:
        return outbox_settings.EMAIL_BACKEND
    if uses_mailers():
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
      timeout, which bounds each wait; :func:`~outbox.mail.bounded.bounded_backend_class`
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
        backend_class = bounded_backend_class(import_string(outbox_settings.EMAIL_BACKEND))
        backend = backend_class()
        if not has_timeout(backend) and accepts_timeout(backend_class):
            backend = backend_class(timeout=limit)
    elif uses_mailers():
        alias = outbox_settings.MAILER or "default"
        backend = made_bounded(mail.mailers[alias], alias)
    elif HAS_MAILERS:
        backend = made_bounded(mail.mailers.default)
    else:
        backend = made_bounded(mail.get_connection())
    limit_timeout(backend, limit)
    never_silent(backend)
    return backend


def made_bounded(backend: BaseEmailBackend, alias: str | None = None) -> BaseEmailBackend:
    """``backend``, which Django made, made again from :func:`bounded_backend_class` of its class.

    With the arguments Django gave it: a mailer's ``alias`` and ``OPTIONS``
    (``django.core.mail.mailers``), or none (``get_connection()``). Django
    made it first so that a misconfigured mailer fails with Django's error.
    """
    cls = type(backend)
    bounded = bounded_backend_class(cls)
    if bounded is cls:
        return backend
    if alias is None:
        return bounded()
    options = getattr(settings, "MAILERS", {})[alias].get("OPTIONS", {})
    return bounded(alias=alias, **options)


_MISSING = object()


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def has_timeout(backend: BaseEmailBackend) -> bool:
    # None counts: for Django's SMTP backend it means "no limit", which we replace.
    value = getattr(backend, "timeout", _MISSING)
    return value is None or _is_seconds(value)


def accepts_timeout(backend_class: Any) -> bool:
    try:
        parameters = inspect.signature(backend_class).parameters
    except (TypeError, ValueError):  # no signature to inspect (a C type, say)
        return False
    parameter = parameters.get("timeout")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def limit_timeout(backend: BaseEmailBackend, limit: float) -> None:
    if not has_timeout(backend):
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
