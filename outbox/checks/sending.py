"""Checks of sending control: rate limits and the pauses' timings."""

from __future__ import annotations

import math
from typing import Any

from django.core.checks import CheckMessage, Error

from ..conf import DEFAULTS
from ..queue.ratelimit import parse_limit
from .settings import outbox_check


@outbox_check()
def check_sending_control(raw: dict[str, Any]) -> list[CheckMessage]:
    """E010, E011: ``RATE_LIMITS``, ``THROTTLE_PENALTY``, ``PAUSED_DOMAIN_RECHECK``."""
    return _check_sending_control(raw)


def _check_sending_control(raw: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    limits = raw.get("RATE_LIMITS", DEFAULTS["RATE_LIMITS"])
    if not isinstance(limits, dict):
        errors.append(
            Error(
                f"OUTBOX['RATE_LIMITS'] is {limits!r}; it must be a dict.",
                hint="For example {'*': '14/s', 'gmail.com': '20/m'}.",
                id="outbox.E010",
            )
        )
    else:
        seen: set[str] = set()
        for key, value in limits.items():
            try:
                name = parse_limit(key, value).key
            except ValueError as exc:
                errors.append(
                    Error(
                        f"OUTBOX['RATE_LIMITS']: {exc}.",
                        hint="Keys are '*', a recipient domain or 'mailer:<alias>'; values a "
                        "positive count and a unit: '14/s', '20/m', '500/h', '5000/d'.",
                        id="outbox.E010",
                    )
                )
                continue
            if name in seen:
                errors.append(
                    Error(
                        f"OUTBOX['RATE_LIMITS'] lists {name!r} twice (domains ignore case).",
                        id="outbox.E010",
                    )
                )
            seen.add(name)
    for name in ("THROTTLE_PENALTY", "PAUSED_DOMAIN_RECHECK"):
        value = raw.get(name, DEFAULTS[name])
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and value > 0):
            errors.append(
                Error(
                    f"OUTBOX[{name!r}] is {value!r}; it must be a positive number of seconds.",
                    id="outbox.E011",
                )
            )
    return errors
