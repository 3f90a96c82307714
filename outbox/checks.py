"""System checks: a misconfigured outbox fails at ``manage.py check``, not at the first email.

Messages are in English, as Django's own checks are: they are for developers
and carry an id to search for.

========== ==============================================================
outbox.E001 ``OUTBOX`` is not a dict
outbox.W001 unknown ``OUTBOX`` keys
outbox.E002 ``OUTBOX["REDIS_CACHE"]`` is not in ``CACHES``
outbox.E003 that cache is not a django-redis cache
outbox.E004 unknown ``ABANDONED_POLICY``
outbox.E005 a number out of range, or of the wrong type
outbox.E006 unusable ``KEY_PREFIX``
outbox.E007 the worker's delivery backend cannot be resolved or imported
outbox.E008 the worker would deliver into the outbox itself
outbox.W002 ``OUTBOX["MAILER"]`` is set but ``MAILERS`` is not in use
outbox.W003 Django 6.1 with ``MAILERS``, and a dotted path in ``OUTBOX["EMAIL_BACKEND"]``
outbox.E009 ``OUTBOX["SEND_TIMEOUT"]`` is not a positive number of seconds
outbox.W004 the metrics URL is routed but ``OUTBOX["METRICS_TOKEN"]`` is not set
outbox.E010 ``OUTBOX["RATE_LIMITS"]`` is not a dict, or an entry is malformed
outbox.E011 ``THROTTLE_PENALTY`` or ``PAUSED_DOMAIN_RECHECK`` is not a positive number
outbox.E015 ``OUTBOX["RECONCILERS"]``: not a list of dotted paths of reconciler classes
outbox.E016 ``RECONCILE_BATCH``, ``RECONCILE_RETRY_AFTER`` or ``RECONCILE_MAX_AGE`` out of range
outbox.E017 ``PostfixLogReconciler`` is listed but ``OUTBOX["POSTFIX_LOG"]`` is not set
outbox.W007 ``OUTBOX["POSTFIX_LOG"]`` cannot be read on this host
outbox.E018 the outbox's cache uses ``ClusterClient`` with a LOCATION a cluster cannot have
outbox.E019 the outbox's cache uses django-redis' ``SentinelClient`` without sentinels
outbox.E021 the outbox's Redis has an ``allkeys-*`` ``maxmemory-policy`` (``check --deploy``)
outbox.E020 ``OUTBOX["SUPPRESS_ON_REFUSAL"]`` is not a bool
outbox.W009 no ``DjangoTemplates`` engine: ``enqueue_template`` cannot find templates
outbox.E012 ``OUTBOX["BACKENDS"]``: not a dict, or an entry malformed, unimportable or the outbox
outbox.E013 ``OUTBOX["RATE_LIMITS"]`` has a ``mailer:<alias>`` key no email can name
outbox.E014 ``OUTBOX["BACKENDS"]`` is set, but ``MAILERS`` is in use (Django 6.1)
outbox.W011 a delivery backend's ``OPTIONS`` set ``fail_silently``, which the worker ignores
========== ==============================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string

from . import checks_reconcilers  # noqa: F401  (registers outbox.W010)
from .conf import ABANDONED_POLICIES, DEFAULTS, outbox_settings


@register()
def check_outbox_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    raw = getattr(settings, "OUTBOX", {})
    if not isinstance(raw, dict):
        return [
            Error(
                "settings.OUTBOX must be a dict.",
                hint="For example OUTBOX = {'REDIS_CACHE': 'default'}.",
                id="outbox.E001",
            )
        ]
    # One step per concern, each returning its findings; the order is the order
    # the messages are reported in.
    errors = _check_unknown_keys(raw)
    errors += _check_redis_cache()
    errors += _check_abandoned_policy()
    errors += _check_numbers()
    errors += _check_send_timeout(raw)
    errors += _check_key_prefix()
    errors += _check_delivery_target()
    errors += _check_sending_control(raw)
    errors += _check_topology_and_reconcilers(raw)
    errors += _check_content(raw)
    errors += _check_mailers(raw)
    return errors


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


def _check_redis_cache() -> list[CheckMessage]:
    alias = outbox_settings.REDIS_CACHE
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [
            Error(
                f"OUTBOX['REDIS_CACHE'] names the cache alias {alias!r}, which is not in CACHES.",
                hint="Add a django-redis cache to CACHES, or point REDIS_CACHE at one.",
                id="outbox.E002",
            )
        ]
    config = caches[alias]
    backend = str(config.get("BACKEND", "")) if isinstance(config, dict) else ""
    if backend.startswith("django_redis."):
        return []
    return [
        Error(
            f"The cache {alias!r} uses {backend!r}; the outbox needs django-redis.",
            hint="Set its BACKEND to 'django_redis.cache.RedisCache'.",
            id="outbox.E003",
        )
    ]


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


def _check_delivery_target() -> list[CheckMessage]:
    from .backends import OutboxBackend, _uses_mailers, delivery_backend_path

    errors: list[CheckMessage] = []
    uses_mailers = _uses_mailers()
    if outbox_settings.MAILER and not uses_mailers:
        errors.append(
            Warning(
                f"OUTBOX['MAILER'] is {outbox_settings.MAILER!r}, but settings.MAILERS is not in "
                "use (it needs Django 6.1 or later), so the worker ignores it.",
                hint="Set OUTBOX['EMAIL_BACKEND'] to the delivery backend's dotted path instead.",
                id="outbox.W002",
            )
        )
    if outbox_settings.EMAIL_BACKEND and uses_mailers:
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
    if isinstance(target_class, type) and issubclass(target_class, OutboxBackend):
        if outbox_settings.EMAIL_BACKEND:
            where = "OUTBOX['EMAIL_BACKEND']"
        elif uses_mailers:
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


# -- sending control (outbox/ratelimit.py, outbox/control.py) -----------------------


def _check_sending_control(raw: dict[str, Any]) -> list[CheckMessage]:
    from .ratelimit import parse_limit

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


# -- Redis Sentinel / Cluster, and reconcilers (outbox.E015-E019, W007) ---------------


def _check_topology_and_reconcilers(raw: dict[str, Any]) -> list[CheckMessage]:
    from .checks_topology import check_reconcilers, check_redis_topology

    return check_redis_topology() + check_reconcilers(raw)


@register(Tags.caches, deploy=True)
def check_redis_eviction(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E021: an evicting Redis breaks the protocol. Deploy only: it asks the server."""
    from .checks_topology import check_redis_eviction

    return check_redis_eviction()


@register(Tags.urls)
def check_metrics_token(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``outbox.urls`` is included, so its metrics are routed, but they have no token."""
    if outbox_settings.METRICS_TOKEN is not None:
        return []
    try:
        url = reverse("outbox:metrics")
    except NoReverseMatch:
        return []  # not routed: nothing to warn about
    except Exception:  # a broken URLconf is Django's own check's to report
        return []
    return [
        Warning(
            f"The outbox metrics are routed at {url}, but OUTBOX['METRICS_TOKEN'] is not set, "
            "so they answer 404 to every scrape.",
            hint="Set OUTBOX['METRICS_TOKEN'] to a long random string and give it to "
            "Prometheus as a bearer token, or do not include outbox.urls.",
            id="outbox.W004",
        )
    ]


# -- templates, bulk mail, expiry and suppression (issue 14) ---------------------------


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


# -- a mailer per email (outbox/mailers.py): outbox.E012-E014 ---------------------------


def _check_mailers(raw: dict[str, Any]) -> list[CheckMessage]:
    from .checks_mailers import check_mailers

    return check_mailers(raw)


@register()
def check_silent_delivery(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W011: ``fail_silently`` on a delivery backend is ignored (a refusal must be seen)."""
    from .checks_mailers import check_silent_delivery

    return check_silent_delivery()
