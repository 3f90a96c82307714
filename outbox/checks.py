"""System checks: a misconfigured outbox fails at ``manage.py check``, not at the first email."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from .conf import ABANDONED_POLICIES, DEFAULTS, outbox_settings

OUTBOX_BACKEND = "outbox.backends.OutboxBackend"


@register()
def check_outbox_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    raw = getattr(settings, "OUTBOX", {})
    if not isinstance(raw, dict):
        return [
            Error(
                "settings.OUTBOX must be a dict.",
                hint="For example OUTBOX = {'REDIS_CACHE': 'default'}.",
                id="outbox.E001",
            )
        ]
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        errors.append(
            Warning(
                f"Unknown OUTBOX setting(s): {', '.join(unknown)}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="outbox.W001",
            )
        )

    alias = outbox_settings.REDIS_CACHE
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        errors.append(
            Error(
                f"OUTBOX['REDIS_CACHE'] names the cache alias {alias!r}, which is not in CACHES.",
                hint="Add a django-redis cache to CACHES, or point REDIS_CACHE at one.",
                id="outbox.E002",
            )
        )
    else:
        backend = str(caches[alias].get("BACKEND", ""))
        if not backend.startswith("django_redis."):
            errors.append(
                Error(
                    f"The cache {alias!r} uses {backend!r}; the outbox needs django-redis.",
                    hint="Set its BACKEND to 'django_redis.cache.RedisCache'.",
                    id="outbox.E003",
                )
            )

    if outbox_settings.ABANDONED_POLICY not in ABANDONED_POLICIES:
        errors.append(
            Error(
                f"OUTBOX['ABANDONED_POLICY'] is {outbox_settings.ABANDONED_POLICY!r}.",
                hint="Use 'review' (mark abandoned for a person) or 'requeue' (send again).",
                id="outbox.E004",
            )
        )

    errors += _check_numbers()

    prefix = outbox_settings.KEY_PREFIX
    if not prefix or any(c in prefix for c in "{} "):
        errors.append(
            Error(
                f"OUTBOX['KEY_PREFIX'] is {prefix!r}.",
                hint="Use a non-empty prefix without braces or spaces; it becomes the hash tag.",
                id="outbox.E006",
            )
        )

    from .backends import delivery_backend_path

    try:
        target = delivery_backend_path()
    except Exception as exc:  # a broken MAILERS entry is reported, not raised
        errors.append(
            Error(f"Cannot resolve the worker's delivery backend: {exc}", id="outbox.E007")
        )
    else:
        if target == OUTBOX_BACKEND:
            errors.append(
                Error(
                    "The outbox worker would deliver into the outbox itself.",
                    hint=(
                        "When EMAIL_BACKEND (or the default mailer) is the outbox backend, set "
                        "OUTBOX['EMAIL_BACKEND'] (Django < 6.1) or OUTBOX['MAILER'] "
                        "(Django >= 6.1) to the real delivery backend, e.g. SMTP."
                    ),
                    id="outbox.E008",
                )
            )
    return errors


def _check_numbers() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    try:
        max_attempts = outbox_settings.MAX_ATTEMPTS
        base, cap = outbox_settings.RETRY_BACKOFF
        interval = outbox_settings.HEARTBEAT_INTERVAL
        timeout = outbox_settings.HEARTBEAT_TIMEOUT
        batch = outbox_settings.CLAIM_BATCH
        block = outbox_settings.BLOCK_TIMEOUT
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
    for problem in problems:
        errors.append(Error(f"OUTBOX: {problem}.", id="outbox.E005"))
    return errors
