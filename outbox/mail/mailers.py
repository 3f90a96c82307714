"""A mailer per email: ``enqueue_email(..., mailer="bulk")``.

An email may name the delivery backend its deliveries go through, in the
manner of django-post_office's backend alias. The name is stored on the
``Email`` row (``Email.mailer``), so every delivery of the call, and every
retry of each, goes through it. A blank name is the worker's default target
(``OUTBOX["EMAIL_BACKEND"]`` or ``OUTBOX["MAILER"]``, see
:mod:`outbox.backends`), exactly as before mailers existed. What a name means:

- on Django >= 6.1 with ``settings.MAILERS``: an alias of ``MAILERS``;
- otherwise (Django 5.2, or 6.1 not yet migrated to ``MAILERS``): a key of
  ``OUTBOX["BACKENDS"]``, whose value is a backend's dotted path, or
  ``{"BACKEND": "<dotted path>", "OPTIONS": {...}}`` with the keyword
  arguments of the backend's constructor (as a 6.1 mailer's ``OPTIONS``).
  With ``MAILERS`` in use, ``BACKENDS`` is not read (check ``outbox.E014``):
  one namespace of names at a time.

**Refused at enqueue.** A name that is neither, or whose backend is
:class:`~outbox.backends.OutboxBackend` (the worker would deliver into the
outbox itself: on 6.1 the ``"default"`` mailer usually is), is a
``ValidationError`` on ``mailer`` before anything is written
(:func:`is_delivery_mailer`, called from :func:`outbox.enqueue.prepare.check_mailer`).

**Resolved again when sending.** The worker reads its own settings when it
opens a mailer's connection (:func:`get_connection`). A name the worker's
host does not know fails that attempt as an unreachable server does: retried
with backoff, then ``failed``, with the reason in the attempt log
(:class:`~outbox.exceptions.UnknownMailerError`). Deploy the
same mail settings to the hosts that enqueue and the hosts that send. A
backend that is configured but cannot be created (a missing setting:
``ImproperlyConfigured``) burns no attempt: its mailer is paused
(:meth:`outbox.worker.gate.Gate.pause_mailer`).

**Connections.** Each sender thread holds one connection per mailer it has
used (:class:`outbox.worker.connections.Connections`): opened on first use, each with
``SEND_TIMEOUT`` applied (to each whole send, on Django's SMTP backend) and
the SMTP hand-over watched after every open,
and closed on the same occasions as the default one.

**Rate limits** may be keyed by mailer, ``"mailer:bulk": "10/s"``
(:mod:`outbox.queue.ratelimit`).
"""

from __future__ import annotations

import inspect
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string

from ..conf import outbox_settings
from ..exceptions import UnknownMailerError
from .bounded import bounded_backend_class
from .targets import (
    SMTP_BACKEND,
    accepts_timeout,
    delivery_backend_path,
    get_delivery_connection,
    has_timeout,
    limit_timeout,
    made_bounded,
    never_silent,
    queues_mail,
    uses_mailers,
)

# The keys of an OUTBOX["BACKENDS"] entry written as a dict.
ENTRY_KEYS = frozenset({"BACKEND", "OPTIONS"})


def parse_entry(alias: Any, entry: Any) -> tuple[str, dict[str, Any]]:
    """One ``OUTBOX["BACKENDS"]`` entry as ``(dotted path, options)``; ValueError if malformed."""
    if not isinstance(alias, str) or not alias.strip() or alias != alias.strip():
        raise ValueError(f"the key {alias!r} is not a name (a non-empty string, no outer spaces)")
    path: Any
    options: Any
    if isinstance(entry, str):
        path, options = entry, {}
    elif isinstance(entry, dict):
        unknown = sorted(str(k) for k in set(entry) - ENTRY_KEYS)
        if unknown:
            raise ValueError(f"{alias!r} has unknown keys {', '.join(unknown)}")
        path, options = entry.get("BACKEND"), entry.get("OPTIONS", {})
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise ValueError(f"the OPTIONS of {alias!r} are not a dict of keyword arguments")
    else:
        raise ValueError(f"{alias!r} is {entry!r}, not a dotted path or a dict with BACKEND")
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{alias!r} names no BACKEND (a dotted path)")
    return path, dict(options)


def names() -> list[str]:
    """Every configured mailer name, whether or not it may be used (MAILERS or BACKENDS)."""
    if uses_mailers():
        return [str(alias) for alias in getattr(settings, "MAILERS", {})]
    return [str(alias) for alias in outbox_settings.BACKENDS]


def backend_path(alias: str) -> str:
    """The dotted path of mailer ``alias``'s backend; KeyError or ValueError if it has none."""
    if uses_mailers():
        config = getattr(settings, "MAILERS", {})[alias]
        return str(config.get("BACKEND", SMTP_BACKEND))
    return parse_entry(alias, outbox_settings.BACKENDS[alias])[0]


def is_delivery_mailer(alias: str) -> bool:
    """Whether an email may name ``alias``: a configured backend that is not the outbox itself.

    Runs only for emails that name a mailer; the import is cached by Python.
    """
    try:
        backend_class = import_string(backend_path(alias))
    except Exception:  # not configured, malformed or not importable: a system check says which
        return False
    return not queues_mail(backend_class)


def delivers_through_anymail(alias: str) -> bool:
    """Whether mailer ``alias`` (``""``: the default target) has a django-anymail backend.

    Known by the class's modules (anymail is optional, and not imported here),
    so a project's subclass of anymail's backend counts too.
    """
    try:
        backend_class = import_string(backend_path(alias) if alias else delivery_backend_path())
    except Exception:  # not configured or not importable: a system check says which
        return False
    return any(cls.__module__.startswith("anymail.") for cls in inspect.getmro(backend_class))


def delivery_mailers() -> list[str]:
    """The names an email may carry, sorted (for messages and checks)."""
    return sorted(alias for alias in names() if is_delivery_mailer(alias))


def get_connection(alias: str) -> BaseEmailBackend:
    """A new delivery connection of mailer ``alias`` (``""``: the default target).

    It never fails silently (:func:`outbox.mail.targets.never_silent`). Its
    waits are bounded by ``SEND_TIMEOUT`` by the rules of
    :func:`outbox.mail.targets.get_delivery_connection`; a ``BACKENDS`` entry
    whose options set no ``timeout`` and whose instances show none is created
    again with ``timeout=SEND_TIMEOUT`` when its constructor takes it.
    Django's SMTP backend is bounded as a whole as well: each open, send and
    close within ``SEND_TIMEOUT`` (:func:`outbox.mail.bounded.bounded_backend_class`). Raises
    ``ImproperlyConfigured`` when this host's settings do not make ``alias``
    a delivery mailer.
    """
    if not alias:
        return get_delivery_connection()
    limit = outbox_settings.SEND_TIMEOUT
    backend: BaseEmailBackend
    if uses_mailers():
        if alias not in getattr(settings, "MAILERS", {}):
            raise UnknownMailerError(f"the mailer {alias!r} is not in MAILERS on this host")
        backend = made_bounded(mail.mailers[alias], alias)
    else:
        if alias not in outbox_settings.BACKENDS:
            raise UnknownMailerError(
                f"the mailer {alias!r} is not in OUTBOX['BACKENDS'] on this host"
            )
        try:
            path, options = parse_entry(alias, outbox_settings.BACKENDS[alias])
        except ValueError as exc:
            raise ImproperlyConfigured(f"OUTBOX['BACKENDS']: {exc}") from exc
        backend_class = bounded_backend_class(import_string(path))
        backend = backend_class(**options)
        needs_timeout = "timeout" not in options and not has_timeout(backend)
        if needs_timeout and accepts_timeout(backend_class):
            backend = backend_class(timeout=limit, **options)
    if queues_mail(type(backend)):
        raise ImproperlyConfigured(f"the mailer {alias!r} is the outbox itself, not a delivery")
    limit_timeout(backend, limit)
    never_silent(backend)
    return backend
