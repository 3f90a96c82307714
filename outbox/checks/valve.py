"""Checks of the staging valve (``outbox.mail.valve``): ``ALLOWED_RECIPIENTS``, ``REDIRECT_TO``."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ValidationError

from ..validation import LINE_BREAKS, normalize_address
from .settings import outbox_check

_EXAMPLE = "For example ['*@example.com', 'qa@shop.test'], or None to let everyone through."


@outbox_check()
def check_allowed_recipients(raw: dict[str, Any]) -> list[CheckMessage]:
    """E023: ``ALLOWED_RECIPIENTS`` is None or a list of address patterns."""
    value = raw.get("ALLOWED_RECIPIENTS")
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        return [
            Error(
                f"OUTBOX['ALLOWED_RECIPIENTS'] is {value!r}; it must be a list of address "
                "patterns, or None.",
                hint=_EXAMPLE,
                id="outbox.E023",
            )
        ]
    return [
        Error(
            f"OUTBOX['ALLOWED_RECIPIENTS'] has {pattern!r}: {problem}.",
            hint=_EXAMPLE + " Patterns are shell-style (* ? [...]) and ignore case.",
            id="outbox.E023",
        )
        for pattern in value
        for problem in [_pattern_problem(pattern)]
        if problem
    ]


def _pattern_problem(pattern: Any) -> str:
    if not isinstance(pattern, str):
        return "a pattern must be a string"
    if not pattern.strip():
        return "a pattern must not be empty"
    if any(c.isspace() or c in LINE_BREAKS for c in pattern.strip()):
        return "a pattern is one bare address, with no spaces (not 'Name <address>')"
    if "<" in pattern or ">" in pattern:
        return "a pattern is a bare address, not 'Name <address>'"
    if "@" not in pattern and "*" not in pattern:
        return (
            "it has no @ and no *, so it matches no address "
            f"(a domain is written '*@{pattern.strip()}')"
        )
    return ""


@outbox_check()
def check_redirect_to(raw: dict[str, Any]) -> list[CheckMessage]:
    """E024: ``REDIRECT_TO`` is None or one address, and only set with ``ALLOWED_RECIPIENTS``."""
    value = raw.get("REDIRECT_TO")
    if value is None:
        return []
    try:
        normalize_address("REDIRECT_TO", value)
    except (ValidationError, TypeError) as exc:
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        return [
            Error(
                f"OUTBOX['REDIRECT_TO'] is {value!r}, which is not one address: {text}",
                hint="One address, such as 'qa@shop.test', or None.",
                id="outbox.E024",
            )
        ]
    if raw.get("ALLOWED_RECIPIENTS") is None:
        return [
            Error(
                "OUTBOX['REDIRECT_TO'] is set, but OUTBOX['ALLOWED_RECIPIENTS'] is None: "
                "the staging valve is off, so nothing is redirected and every recipient "
                "gets their mail.",
                hint="Set ALLOWED_RECIPIENTS (to [] to redirect all mail), or remove REDIRECT_TO.",
                id="outbox.E024",
            )
        ]
    return []


@outbox_check(deploy=True)
def check_valve_in_deploy(raw: dict[str, Any]) -> list[CheckMessage]:
    """W012 (``check --deploy``): the staging valve is on, perhaps in production by mistake."""
    value = raw.get("ALLOWED_RECIPIENTS")
    if value is None:
        return []
    redirect = raw.get("REDIRECT_TO")
    then = f"redirected to {redirect!r}" if redirect else "cancelled"
    return [
        Warning(
            f"The staging valve is on: only OUTBOX['ALLOWED_RECIPIENTS'] ({value!r}) get "
            f"mail; every other recipient's mail is {then}.",
            hint="Right for a staging or test site. In production, remove ALLOWED_RECIPIENTS "
            "(and REDIRECT_TO), or silence outbox.W012 with SILENCED_SYSTEM_CHECKS.",
            id="outbox.W012",
        )
    ]
