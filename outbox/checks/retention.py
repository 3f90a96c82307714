"""Checks of how long mail content is kept: ``CONTENT_RETENTION`` and ``SENSITIVE_LINKS``."""

from __future__ import annotations

import math
from typing import Any

from django.core.checks import CheckMessage, Error

from ..conf import DEFAULTS
from .settings import outbox_check


@outbox_check()
def check_content_retention(raw: dict[str, Any]) -> list[CheckMessage]:
    """E028: ``CONTENT_RETENTION`` is None or a positive number of seconds."""
    value = raw.get("CONTENT_RETENTION", DEFAULTS["CONTENT_RETENTION"])
    if value is None:
        return []
    # The type on the raw value: "259200" or True is a mistake, not a wish.
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and value > 0:
        return []
    return [
        Error(
            f"OUTBOX['CONTENT_RETENTION'] is {value!r}; it must be a positive number of "
            "seconds, or None.",
            hint="Seconds the content of settled mail is kept, e.g. 3 * 86400 (the default); "
            "None keeps it as long as the rows.",
            id="outbox.E028",
        )
    ]


@outbox_check()
def check_sensitive_links(raw: dict[str, Any]) -> list[CheckMessage]:
    """E029: ``SENSITIVE_LINKS`` is a list of URL names."""
    value = raw.get("SENSITIVE_LINKS", DEFAULTS["SENSITIVE_LINKS"])
    if isinstance(value, list | tuple) and all(
        isinstance(name, str) and name and not name.isspace() for name in value
    ):
        return []
    return [
        Error(
            f"OUTBOX['SENSITIVE_LINKS'] is {value!r}; it must be a list of URL names.",
            hint="For Django's password reset: ['password_reset_confirm'] (a namespaced "
            "name as reverse() takes it, 'accounts:reset').",
            id="outbox.E029",
        )
    ]
