"""Check of the failure alarm's settings (``outbox/queue/alarm.py``)."""

from __future__ import annotations

import math
from typing import Any

from django.core.checks import CheckMessage, Error

from ..conf import SettingTypeError, outbox_settings
from .settings import outbox_check

_HINT = (
    "FAILURE_ALARM_WINDOW is seconds (60), FAILURE_ALARM_MIN a whole number of failed "
    "attempts (10), FAILURE_ALARM_SHARE a share of the attempts, above 0 and at most 1 (0.5)."
)


@outbox_check()
def check_failure_alarm(raw: dict[str, Any]) -> list[CheckMessage]:
    """E028: ``FAILURE_ALARM_WINDOW``, ``FAILURE_ALARM_MIN``, ``FAILURE_ALARM_SHARE``."""
    errors: list[CheckMessage] = []
    values: dict[str, float] = {}
    for name in ("FAILURE_ALARM_WINDOW", "FAILURE_ALARM_MIN", "FAILURE_ALARM_SHARE"):
        try:
            values[name] = getattr(outbox_settings, name)
        except SettingTypeError as exc:
            errors.append(Error(f"{exc}.", hint=_HINT, id="outbox.E028"))
    if errors:
        return errors
    window = values["FAILURE_ALARM_WINDOW"]
    if not (math.isfinite(window) and 1 <= window <= 86400):
        errors.append(
            Error(
                f"OUTBOX['FAILURE_ALARM_WINDOW'] is {window!r}; it must be from 1 to 86400 "
                "seconds.",
                hint=_HINT,
                id="outbox.E028",
            )
        )
    if values["FAILURE_ALARM_MIN"] < 1:
        errors.append(
            Error(
                f"OUTBOX['FAILURE_ALARM_MIN'] is {values['FAILURE_ALARM_MIN']!r}; it must be at "
                "least 1.",
                hint=_HINT,
                id="outbox.E028",
            )
        )
    share = values["FAILURE_ALARM_SHARE"]
    if not (math.isfinite(share) and 0 < share <= 1):
        errors.append(
            Error(
                f"OUTBOX['FAILURE_ALARM_SHARE'] is {share!r}; it must be above 0 and at most 1.",
                hint=_HINT,
                id="outbox.E028",
            )
        )
    return errors
