"""The project's mail settings as a test sets them, and one delivery run.

:func:`use_outbox` makes the outbox the project's mail backend and names the
backend the worker delivers through, the way a project configures it on the
running Django version: on 5.2 the outbox is EMAIL_BACKEND and the target is
OUTBOX["EMAIL_BACKEND"] (its options as EMAIL_* settings); from 6.1 on the
outbox is the "default" mailer and the target the mailer OUTBOX["MAILER"].
:func:`use_smtp` and :func:`use_smtp_delivery` do so for Django's SMTP backend
to a server on loopback; :func:`deliver` runs one in-process worker until the
queue is empty.
"""

from __future__ import annotations

from typing import Any

from outbox.mail.targets import HAS_MAILERS
from outbox.worker import Worker
from tests.servers import SMTPRecorder

OUTBOX_BACKEND = "outbox.backends.OutboxBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
SMTP = "django.core.mail.backends.smtp.EmailBackend"


def use_outbox(
    settings, delivery: str = LOCMEM, options: dict[str, Any] | None = None, **outbox
) -> None:
    """Make the outbox the project's mail backend, delivering through ``delivery``.

    ``outbox``: more OUTBOX settings, merged into the test's.
    """
    merged = {k: v for k, v in settings.OUTBOX.items() if k not in ("EMAIL_BACKEND", "MAILER")}
    merged.update(outbox)
    if HAS_MAILERS:
        settings.MAILERS = {
            "default": {"BACKEND": OUTBOX_BACKEND},
            "delivery": {"BACKEND": delivery, "OPTIONS": options or {}},
        }
        settings.OUTBOX = {**merged, "MAILER": "delivery"}
    else:
        settings.EMAIL_BACKEND = OUTBOX_BACKEND
        settings.OUTBOX = {**merged, "EMAIL_BACKEND": delivery}
        for name, value in (options or {}).items():
            setattr(settings, f"EMAIL_{name.upper()}", value)


def use_smtp(settings, port: int, timeout: float | None = None, **outbox) -> None:
    """Deliver through Django's SMTP backend to ``127.0.0.1:port``.

    Without ``timeout`` the backend has none of its own (Django's default), so
    that OUTBOX["SEND_TIMEOUT"] is what bounds a send.
    """
    options: dict[str, Any] = {"host": "127.0.0.1", "port": port}
    if timeout is not None:
        options["timeout"] = timeout
    elif not HAS_MAILERS:
        settings.EMAIL_TIMEOUT = None  # Django's default: no limit
    use_outbox(settings, SMTP, options, **outbox)


def use_smtp_delivery(settings, server: SMTPRecorder) -> None:
    """Deliver through Django's SMTP backend to ``server``, leaving EMAIL_TIMEOUT as it is."""
    use_outbox(settings, SMTP, {"host": "127.0.0.1", "port": server.port})


def deliver() -> Worker:
    """One in-process worker in burst mode: it sends what is queued, then returns."""
    worker = Worker(burst=True)
    assert worker.run(install_signal_handlers=False) == 0
    return worker
