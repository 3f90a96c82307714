"""The staging valve: ``OUTBOX["ALLOWED_RECIPIENTS"]`` and ``OUTBOX["REDIRECT_TO"]``.

A staging copy of production holds real customers' addresses. With
``ALLOWED_RECIPIENTS`` set (a list of shell-style patterns such as
``"*@example.com"``, matched without regard to case against the bare address
in the suppression list's form, :func:`outbox.validation.bare_address`), a
copy to an address that matches no pattern goes to ``REDIRECT_TO`` instead,
with the original recipient in an ``X-Outbox-Original-Recipient`` header; or,
without ``REDIRECT_TO``, it is not sent at all: its row ends ``cancelled``,
``last_error`` starting with "not an allowed recipient". ``None`` (the
default) lets everyone through; ``[]`` lets nobody through.

**The guarantee, and the one place that gives it: :func:`admit`.** The worker
calls it on every built copy, right before it hands the copy to a delivery
backend (``outbox.worker.attempt.Sender.send``, the only place
mail leaves the outbox). While the valve is on, no copy reaches a backend with
an envelope address that matches no pattern, other than ``REDIRECT_TO``:
whichever path wrote the row (``enqueue_email``, the drop-in backend,
templates, ``enqueue_many``, async enqueue, an operator's or the sweeper's
requeue, a reconciler's) and whenever it was written (rows queued before the
valve was switched on, such as a production database copied to staging). The
settings are read live, for every copy.

Enqueue applies the same rule earlier, for visibility only (:func:`refusals`):
without ``REDIRECT_TO`` the row is written ``cancelled`` at once, as a
suppressed recipient's is, and never reaches Redis. With ``REDIRECT_TO`` the
row keeps its original recipient, so the admin finds it by that address and
idempotency keys and the suppression list still match it; the redirect happens
in the copy, and the worker writes it in the row's attempt log.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.mail import EmailMessage

from ..conf import outbox_settings
from ..validation import bare_address, suppression_key
from .message import OutboxCopy

__all__ = [
    "NOT_ALLOWED",
    "ORIGINAL_RECIPIENT_HEADER",
    "NotAllowedRecipient",
    "admit",
    "allows",
    "redirect_to",
    "refusals",
    "state",
]

M = TypeVar("M", bound=EmailMessage)

ORIGINAL_RECIPIENT_HEADER = "X-Outbox-Original-Recipient"
NOT_ALLOWED = "not an allowed recipient"
# Headers of the sender's that a redirected copy drops: it is addressed to the
# redirect address alone (a Cc of real customers would invite a "reply all").
_DROPPED = frozenset({"to", "cc", ORIGINAL_RECIPIENT_HEADER.lower()})


class NotAllowedRecipient(Exception):
    """A copy the valve stops (no ``REDIRECT_TO``); the text is the row's ``last_error``."""


def state() -> dict[str, Any]:
    """What ``outbox_status``, the dashboard and the metrics show: ``on``, the patterns, the redirect."""
    patterns = outbox_settings.ALLOWED_RECIPIENTS
    on = patterns is not None
    return {
        "on": on,
        "allowed_recipients": list(patterns) if patterns is not None else None,
        "redirect_to": outbox_settings.REDIRECT_TO if on else None,
    }


def allows(recipient: str) -> bool:
    """Whether ``recipient`` (``"a@b"`` or ``"Name <a@b>"``) may get its own copy now."""
    patterns = outbox_settings.ALLOWED_RECIPIENTS
    return patterns is None or _matcher(patterns)(bare_address(recipient)) is not None


def redirect_to(recipient: str) -> str | None:
    """The address that gets ``recipient``'s copies instead, now; None when nobody does."""
    return None if allows(recipient) else outbox_settings.REDIRECT_TO


def reason(address: str) -> str:
    """A stopped copy's ``last_error``."""
    return (
        f"{NOT_ALLOWED}: {address} matches no pattern of OUTBOX['ALLOWED_RECIPIENTS'] "
        "(the staging valve)"
    )[:2000]


def refusals(recipients: Iterable[str]) -> dict[str, str]:
    """Enqueue's look: ``{bare address: why}`` for the recipients to write ``cancelled``.

    Empty when the valve is off, and when it redirects (``REDIRECT_TO`` set):
    those rows are queued and redirected by :func:`admit`.
    """
    patterns = outbox_settings.ALLOWED_RECIPIENTS
    if patterns is None or outbox_settings.REDIRECT_TO:
        return {}
    match = _matcher(patterns)
    stopped = {}
    for recipient in recipients:
        address = bare_address(recipient)
        if match(address) is None:
            stopped[address] = reason(address)
    return stopped


def admit(message: M, recipient: str) -> tuple[M, str]:
    """The copy to hand to the backend, and a note for the attempt log ("" if unchanged).

    ``recipient`` is the row's, shown in the redirected copy's header. Every
    envelope address of ``message`` is looked at, not only the row's
    recipient: whatever built the copy, what matches no pattern does not leave.
    Raises :class:`NotAllowedRecipient` when the copy must not be sent.
    """
    patterns = outbox_settings.ALLOWED_RECIPIENTS
    if patterns is None:
        return message, ""
    match = _matcher(patterns)
    stopped = [a for a in message.recipients() if match(bare_address(a)) is None]
    if not stopped:
        return message, ""
    target = outbox_settings.REDIRECT_TO
    if target is None:
        raise NotAllowedRecipient(reason(bare_address(stopped[0])))
    note = f"staging valve: sent to {target} instead of {recipient}"
    return _redirected(message, target, recipient), note[:2000]


def _redirected(message: M, target: str, original: str) -> M:
    """``message`` addressed to ``target`` alone (envelope and To), naming ``original``."""
    redirected = copy.copy(message)
    headers = {k: v for k, v in message.extra_headers.items() if k.lower() not in _DROPPED}
    headers[ORIGINAL_RECIPIENT_HEADER] = original
    redirected.extra_headers = headers
    redirected.to, redirected.cc, redirected.bcc = [target], [], []
    if isinstance(redirected, OutboxCopy):
        # Built by Django on its own: the email's shared build has the old To.
        redirected._own_build = True
    return redirected


@functools.lru_cache(maxsize=16)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One regular expression for all the patterns, each in the addresses' stored form."""
    if not patterns:
        return lambda _address: None
    alternatives = "|".join(f"(?:{fnmatch.translate(suppression_key(p))})" for p in patterns)
    return re.compile(alternatives).match
