"""Checks of what mail is made of: templates and suppression."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from ..conf import DEFAULTS
from .settings import outbox_check


@outbox_check()
def check_content(raw: dict[str, Any]) -> list[CheckMessage]:
    """E020, W009: ``SUPPRESS_ON_REFUSAL``, a DjangoTemplates engine for templates."""
    return _check_content(raw)


def _check_content(raw: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    value = raw.get("SUPPRESS_ON_REFUSAL", DEFAULTS["SUPPRESS_ON_REFUSAL"])
    if not isinstance(value, bool):
        errors.append(
            Error(
                f"OUTBOX['SUPPRESS_ON_REFUSAL'] is {value!r}; it must be True or False.",
                hint="True (the default) adds a recipient the mail server refused for good "
                "(5xx at RCPT) to the suppression list.",
                id="outbox.E020",
            )
        )
    backends = [t.get("BACKEND") for t in getattr(settings, "TEMPLATES", [])]
    if "django.template.backends.django.DjangoTemplates" not in backends:
        errors.append(
            Warning(
                "No DjangoTemplates engine in settings.TEMPLATES: enqueue_template() and "
                "enqueue_many() with a template cannot render template files or rows.",
                hint="Add a DjangoTemplates engine (APP_DIRS=True finds <app>/templates/).",
                id="outbox.W009",
            )
        )
    return errors
