"""Checks of the ``OUTBOX`` dict's own values: its type, its keys, policies and numbers.

Every other checks module starts from :func:`outbox_dict`: when ``OUTBOX`` is
not a dict, only ``outbox.E001`` is reported.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..conf import ABANDONED_POLICIES, DEFAULTS, RETIRED, SettingTypeError, outbox_settings


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
    """E001, E026, W001: ``OUTBOX`` is a dict of known keys, none misspelt or retired."""
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
    # A key close to a known one is that setting misspelt: the setting is then
    # silently at its default, which for ALLOWED_RECIPIENTS means real
    # customers get staging's mail. That is an error (the worker refuses to
    # start); a key like no known one is only reported.
    messages: list[CheckMessage] = []
    far = []
    for key in sorted(str(k) for k in set(raw) - set(DEFAULTS)):
        if key in RETIRED:
            messages.append(
                Warning(
                    f"OUTBOX: {key} is no longer used: {RETIRED[key]} (remove it).",
                    hint=f"Remove {key} from OUTBOX: it has no effect.",
                    id="outbox.W001",
                )
            )
            continue
        close = difflib.get_close_matches(key.upper(), DEFAULTS, n=1, cutoff=0.8)
        if close:
            messages.append(
                Error(
                    f"OUTBOX: {key} is not a setting; did you mean {close[0]}?",
                    hint=f"Rename it to {close[0]}: until then {close[0]} has its default "
                    f"({DEFAULTS[close[0]]!r}) and {key} is ignored.",
                    id="outbox.E026",
                )
            )
        else:
            far.append(key)
    if far:
        messages.append(
            Warning(
                f"Unknown OUTBOX setting(s): {', '.join(far)}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="outbox.W001",
            )
        )
    return messages


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


# What E005 reads, each through the property the code reads it by.
_NUMBERS = (
    "MAX_ATTEMPTS",
    "RETRY_BACKOFF",
    "MAILER_PAUSE",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TIMEOUT",
    "CLAIM_BATCH",
    "BLOCK_TIMEOUT",
    "MIRROR_FULL_SCAN_INTERVAL",
    "FAILURE_ALARM_WINDOW",
    "FAILURE_ALARM_MIN",
    "FAILURE_ALARM_SHARE",
)


def _check_numbers() -> list[CheckMessage]:
    # The readers of outbox.conf (outbox.conf.integer, outbox.conf.number) refuse
    # what they would otherwise coerce (2.5, "5", True): the check reports their
    # own refusal, so the two cannot disagree.
    wrong: list[CheckMessage] = []
    for name in _NUMBERS:
        try:
            getattr(outbox_settings, name)
        except SettingTypeError as exc:
            wrong.append(Error(f"{exc}.", hint=_NUMBER_HINT, id="outbox.E005"))
    if wrong:
        return wrong
    max_attempts = outbox_settings.MAX_ATTEMPTS
    base, cap = outbox_settings.RETRY_BACKOFF
    interval = outbox_settings.HEARTBEAT_INTERVAL
    timeout = outbox_settings.HEARTBEAT_TIMEOUT
    batch = outbox_settings.CLAIM_BATCH
    block = outbox_settings.BLOCK_TIMEOUT
    full_scan = outbox_settings.MIRROR_FULL_SCAN_INTERVAL
    problems = []
    if max_attempts < 1:
        problems.append("MAX_ATTEMPTS must be at least 1")
    if not 0 < base <= cap:
        problems.append("RETRY_BACKOFF must be (base, cap) with 0 < base <= cap")
    pause_base, pause_cap = outbox_settings.MAILER_PAUSE
    if not 0 < pause_base <= pause_cap:
        problems.append("MAILER_PAUSE must be (base, cap) with 0 < base <= cap")
    if not 0 < interval < timeout:
        problems.append("HEARTBEAT_INTERVAL must be positive and below HEARTBEAT_TIMEOUT")
    if batch < 1:
        problems.append("CLAIM_BATCH must be at least 1")
    if not 0 < block < timeout:
        problems.append("BLOCK_TIMEOUT must be positive and below HEARTBEAT_TIMEOUT")
    if full_scan <= 0:
        problems.append("MIRROR_FULL_SCAN_INTERVAL must be positive")
    problems += _failure_alarm_problems()
    return [Error(f"OUTBOX: {problem}.", id="outbox.E005") for problem in problems]


def _failure_alarm_problems() -> list[str]:
    """The failure alarm's rule (:class:`outbox.queue.alarm.Rule`): a window, a minimum, a share."""
    problems = []
    if not 1 <= outbox_settings.FAILURE_ALARM_WINDOW <= 86400:
        problems.append("FAILURE_ALARM_WINDOW must be from 1 to 86400 seconds")
    if outbox_settings.FAILURE_ALARM_MIN < 1:
        problems.append("FAILURE_ALARM_MIN must be at least 1")
    if not 0 < outbox_settings.FAILURE_ALARM_SHARE <= 1:
        problems.append("FAILURE_ALARM_SHARE must be above 0 and at most 1")
    return problems


_NUMBER_HINT = (
    "Write the number itself, not a string: MAX_ATTEMPTS, CLAIM_BATCH and FAILURE_ALARM_MIN "
    "are integers (5, not 5.0 or '5'), the times are seconds (30 or 0.5), RETRY_BACKOFF and "
    "MAILER_PAUSE are (base, cap), FAILURE_ALARM_SHARE a share (0.5)."
)


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
