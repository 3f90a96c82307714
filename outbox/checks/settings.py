"""Checks of the ``OUTBOX`` dict's own values: its type, its keys, policies and numbers.

Every other checks module starts from :func:`outbox_dict`: when ``OUTBOX`` is
not a dict, only ``outbox.E001`` is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..conf import ABANDONED_POLICIES, DEFAULTS, outbox_settings


def outbox_dict() -> dict[str, Any] | None:
    """``settings.OUTBOX`` when it is a dict (the other checks need one), else None."""
    raw = getattr(settings, "OUTBOX", {})
    return raw if isinstance(raw, dict) else None


def outbox_check(
    *tags: str, deploy: bool = False
) -> Callable[[Callable[[dict[str, Any]], list[CheckMessage]]], Callable[..., list[CheckMessage]]]:
    """Register ``check(raw)`` as a system check of its own, run only when ``OUTBOX`` is a dict.

    ``raw`` is ``settings.OUTBOX`` as written (defaults not applied). When it
    is not a dict, only ``outbox.E001`` speaks.
    """

    def decorate(
        check: Callable[[dict[str, Any]], list[CheckMessage]],
    ) -> Callable[..., list[CheckMessage]]:
        def registered(
            app_configs: Sequence[Any] | None = None, **kwargs: Any
        ) -> list[CheckMessage]:
            raw = outbox_dict()
            return [] if raw is None else check(raw)

        # Named as the check, but not functools.wraps(): Django inspects the
        # signature, and would follow __wrapped__ to one without **kwargs.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(registered, name, getattr(check, name))
        return register(*tags, deploy=deploy)(registered)

    return decorate


@register()
def check_outbox_is_a_dict(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E001, W001: ``OUTBOX`` is a dict of known keys."""
    raw = outbox_dict()
    if raw is None:
        return [
            Error(
                "settings.OUTBOX must be a dict.",
                hint="For example OUTBOX = {'REDIS_CACHE': 'default'}.",
                id="outbox.E001",
            )
        ]
    return _check_unknown_keys(raw)


def _check_unknown_keys(raw: dict[str, Any]) -> list[CheckMessage]:
    unknown = sorted(set(raw) - set(DEFAULTS))
    if not unknown:
        return []
    return [
        Warning(
            f"Unknown OUTBOX setting(s): {', '.join(unknown)}.",
            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="outbox.W001",
        )
    ]


@outbox_check()
def check_policy_and_numbers(raw: dict[str, Any]) -> list[CheckMessage]:
    """E004, E005, E006, E009: the policy, the numbers, the key prefix."""
    return (
        _check_abandoned_policy()
        + _check_numbers()
        + _check_send_timeout(raw)
        + _check_key_prefix()
    )


def _check_abandoned_policy() -> list[CheckMessage]:
    if outbox_settings.ABANDONED_POLICY in ABANDONED_POLICIES:
        return []
    return [
        Error(
            f"OUTBOX['ABANDONED_POLICY'] is {outbox_settings.ABANDONED_POLICY!r}.",
            hint="Use 'review' (mark abandoned for a person) or 'requeue' (send again).",
            id="outbox.E004",
        )
    ]


def _check_key_prefix() -> list[CheckMessage]:
    prefix = outbox_settings.KEY_PREFIX
    if prefix and not any(c in prefix for c in "{} "):
        return []
    return [
        Error(
            f"OUTBOX['KEY_PREFIX'] is {prefix!r}.",
            hint="Use a non-empty prefix without braces or spaces; it becomes the hash tag.",
            id="outbox.E006",
        )
    ]


def _check_numbers() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    try:
        max_attempts = outbox_settings.MAX_ATTEMPTS
        base, cap = outbox_settings.RETRY_BACKOFF
        interval = outbox_settings.HEARTBEAT_INTERVAL
        timeout = outbox_settings.HEARTBEAT_TIMEOUT
        batch = outbox_settings.CLAIM_BATCH
        block = outbox_settings.BLOCK_TIMEOUT
        full_scan = outbox_settings.MIRROR_FULL_SCAN_INTERVAL
    except (TypeError, ValueError) as exc:
        return [Error(f"An OUTBOX setting has the wrong type: {exc}", id="outbox.E005")]
    problems = []
    if max_attempts < 1:
        problems.append("MAX_ATTEMPTS must be at least 1")
    if not 0 < base <= cap:
        problems.append("RETRY_BACKOFF must be (base, cap) with 0 < base <= cap")
    if not 0 < interval < timeout:
        problems.append("HEARTBEAT_INTERVAL must be positive and below HEARTBEAT_TIMEOUT")
    if batch < 1:
        problems.append("CLAIM_BATCH must be at least 1")
    if not 0 < block < timeout:
        problems.append("BLOCK_TIMEOUT must be positive and below HEARTBEAT_TIMEOUT")
    if full_scan <= 0:
        problems.append("MIRROR_FULL_SCAN_INTERVAL must be positive")
    for problem in problems:
        errors.append(Error(f"OUTBOX: {problem}.", id="outbox.E005"))
    return errors


def _check_send_timeout(raw: dict[str, Any]) -> list[CheckMessage]:
    value = raw.get("SEND_TIMEOUT", DEFAULTS["SEND_TIMEOUT"])
    # The type is checked on the raw value: float() would accept "60" or True,
    # and a string here is more likely a mistake than a wish.
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and math.isfinite(value) and value > 0:
        return []
    return [
        Error(
            f"OUTBOX['SEND_TIMEOUT'] is {value!r}; it must be a positive number of seconds.",
            hint="It bounds how long one send may wait on the mail server; the default is 60.",
            id="outbox.E009",
        )
    ]
