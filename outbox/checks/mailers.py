"""Checks of a mailer per email: the mailers an email may name, and their options."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from ..conf import DEFAULTS
from ..mail.mailers import delivery_mailers, is_delivery_mailer, parse_entry
from ..mail.targets import queues_mail, uses_mailers
from ..models import MAILER_MAX_LENGTH
from ..queue.ratelimit import MAILER_PREFIX, parse_limit
from .settings import outbox_check


@outbox_check()
def check_mailers(raw: dict[str, Any]) -> list[CheckMessage]:
    """E012-E014: the mailers an email may name, and the limits keyed by them."""
    errors: list[CheckMessage] = []
    backends = raw.get("BACKENDS", DEFAULTS["BACKENDS"])
    if not isinstance(backends, dict):
        errors.append(
            Error(
                f"OUTBOX['BACKENDS'] is {backends!r}; it must be a dict.",
                hint="For example {'bulk': {'BACKEND': "
                "'django.core.mail.backends.smtp.EmailBackend', 'OPTIONS': {...}}}.",
                id="outbox.E012",
            )
        )
    elif backends and uses_mailers():
        errors.append(
            Error(
                f"OUTBOX['BACKENDS'] names {', '.join(map(repr, backends))}, but settings.MAILERS "
                "is in use, so an email's mailer is a MAILERS alias and BACKENDS is not read.",
                hint="Move each entry into MAILERS (same alias, BACKEND and OPTIONS).",
                id="outbox.E014",
            )
        )
    else:
        for alias, entry in backends.items():
            error = _backend_entry_error(alias, entry)
            if error is not None:
                errors.append(error)
    errors += _mailer_limit_errors(raw)
    return errors


def _backend_entry_error(alias: Any, entry: Any) -> CheckMessage | None:
    """What is wrong with one OUTBOX["BACKENDS"] entry, or None."""
    try:
        path, _options = parse_entry(alias, entry)
        if len(alias) > MAILER_MAX_LENGTH:
            raise ValueError(f"{alias!r} is longer than {MAILER_MAX_LENGTH} characters")
        backend_class = import_string(path)
    except Exception as exc:  # malformed, or the import itself fails
        return Error(
            f"OUTBOX['BACKENDS']: {exc}.",
            hint="Each entry is a backend's dotted path, or {'BACKEND': '<dotted path>', "
            "'OPTIONS': {<keyword arguments of the backend>}}.",
            id="outbox.E012",
        )
    if queues_mail(backend_class):
        return Error(
            f"OUTBOX['BACKENDS'][{alias!r}] is the outbox backend: the worker would deliver "
            "those emails into the outbox itself.",
            hint="Give it a real delivery backend, e.g. SMTP.",
            id="outbox.E012",
        )
    return None


def _mailer_limit_errors(raw: dict[str, Any]) -> list[CheckMessage]:
    """A "mailer:<alias>" limit that no email can use: a typo, since enqueue refuses the alias."""
    limits = raw.get("RATE_LIMITS", DEFAULTS["RATE_LIMITS"])
    if not isinstance(limits, dict):
        return []  # outbox.E010
    errors: list[CheckMessage] = []
    for key, value in limits.items():
        try:
            name = parse_limit(key, value).key
        except ValueError:
            continue  # outbox.E010
        alias = name[len(MAILER_PREFIX) :] if name.startswith(MAILER_PREFIX) else None
        if alias is not None and not is_delivery_mailer(alias):
            errors.append(
                Error(
                    f"OUTBOX['RATE_LIMITS'] limits the mailer {alias!r}, which no email can "
                    "name (enqueue_email refuses it): it is not a delivery mailer here.",
                    hint=f"Mailers: {', '.join(delivery_mailers()) or '(none configured)'}.",
                    id="outbox.E013",
                )
            )
    return errors


@outbox_check()
def check_silent_delivery(raw: dict[str, Any]) -> list[CheckMessage]:
    """W011: a delivery backend configured with ``fail_silently``, which the worker ignores."""
    raw = getattr(settings, "OUTBOX", {})
    if not isinstance(raw, dict):
        return []  # outbox.E001
    entries: dict[str, Any] = {}
    if uses_mailers():
        configured = getattr(settings, "MAILERS", {})
        if isinstance(configured, dict):
            entries = {f"MAILERS[{a!r}]": c for a, c in configured.items() if isinstance(c, dict)}
    else:
        backends = raw.get("BACKENDS", DEFAULTS["BACKENDS"])
        if isinstance(backends, dict):
            entries = {
                f"OUTBOX['BACKENDS'][{a!r}]": c for a, c in backends.items() if isinstance(c, dict)
            }
    silent = [
        where
        for where, config in entries.items()
        if isinstance(config.get("OPTIONS"), dict)
        and config["OPTIONS"].get("fail_silently")
        and _delivers(where, config)
    ]
    return [
        Warning(
            f"{where} sets fail_silently; the outbox worker ignores it and delivers with "
            "fail_silently=False, so that a refusal is seen (failed, suppressed) and not lost.",
            hint="Remove fail_silently from its OPTIONS.",
            id="outbox.W011",
        )
        for where in silent
    ]


def _delivers(where: str, config: dict[str, Any]) -> bool:
    """Whether the worker may deliver through this entry (not the outbox backend itself)."""
    if where.startswith("MAILERS") and config.get("BACKEND") is None:
        return True  # Django's default: SMTP
    try:
        backend_class = import_string(str(config.get("BACKEND")))
    except Exception:
        return False  # outbox.E007 / E012
    return not (queues_mail(backend_class))
