"""Checks of the worker's default delivery target: it resolves, and it is not the outbox."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from ..conf import outbox_settings
from ..mail.targets import delivery_backend_path, queues_mail, uses_mailers
from .settings import outbox_check


@outbox_check()
def check_delivery_target(raw: dict[str, Any]) -> list[CheckMessage]:
    """E007, E008, W002, W003: where the worker delivers mail without a mailer."""
    return _check_delivery_target()


def _check_delivery_target() -> list[CheckMessage]:

    errors: list[CheckMessage] = []
    mailers_in_use = uses_mailers()
    if outbox_settings.MAILER and not mailers_in_use:
        errors.append(
            Warning(
                f"OUTBOX['MAILER'] is {outbox_settings.MAILER!r}, but settings.MAILERS is not in "
                "use (it needs Django 6.1 or later), so the worker ignores it.",
                hint="Set OUTBOX['EMAIL_BACKEND'] to the delivery backend's dotted path instead.",
                id="outbox.W002",
            )
        )
    if outbox_settings.EMAIL_BACKEND and mailers_in_use:
        errors.append(
            Warning(
                "OUTBOX['EMAIL_BACKEND'] is a dotted path, which the worker instantiates with "
                "no options; with MAILERS, Django's SMTP and file backends cannot be created "
                "that way.",
                hint="Add the delivery backend to MAILERS and set OUTBOX['MAILER'] to its alias.",
                id="outbox.W003",
            )
        )
    try:
        target = delivery_backend_path()
        target_class = import_string(target)
    except Exception as exc:  # a broken MAILERS entry is reported, not raised
        errors.append(
            Error(f"Cannot resolve the worker's delivery backend: {exc}", id="outbox.E007")
        )
        return errors
    if queues_mail(target_class):
        if outbox_settings.EMAIL_BACKEND:
            where = "OUTBOX['EMAIL_BACKEND']"
        elif mailers_in_use:
            where = f"the mailer {outbox_settings.MAILER or 'default'!r}"
        else:
            where = "EMAIL_BACKEND"
        errors.append(
            Error(
                f"The outbox worker would deliver into the outbox itself: {where} is {target}.",
                hint=(
                    "When EMAIL_BACKEND (or the default mailer) is the outbox backend, set "
                    "OUTBOX['EMAIL_BACKEND'] (Django < 6.1) or OUTBOX['MAILER'] "
                    "(Django >= 6.1) to the real delivery backend, e.g. SMTP."
                ),
                id="outbox.E008",
            )
        )
    return errors
