"""Delivery events from an ESP, through django-anymail's ``tracking`` signal (optional).

When django-anymail is installed, :meth:`outbox.apps.OutboxConfig.ready`
connects :func:`record_event`. For a ``bounced``, ``rejected`` or
``complained`` event about a Message-ID the outbox sent, it writes an
:class:`~outbox.models.Attempt` on that delivery (outcome ``bounced``,
``rejected`` or ``complained``, actor ``esp:<name>``): the evidence an
operator reads. A bounce or a complaint also puts the recipient on the
suppression list (source ``refusal``). The delivery's status is not changed:
the mail server did accept the message; what happened later is recorded next
to it.

Events about other messages (not sent by the outbox) and other event types
are ignored.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import Attempt, Delivery, outbox_alias
from ..suppression import add_refused, bare_address

logger = logging.getLogger("outbox.esp")

Outcome = Attempt.Outcome

# anymail's event types the outbox records, and the outcome each is written as.
RECORDED = {
    "bounced": Outcome.BOUNCED,
    "rejected": Outcome.REJECTED,
    "complained": Outcome.COMPLAINED,
}
# Events that mean "never send to this address again".
SUPPRESSING = frozenset({"bounced", "complained"})


def connect() -> bool:
    """Connect :func:`record_event` to anymail's ``tracking`` signal, if anymail is installed."""
    if importlib.util.find_spec("anymail") is None:
        return False
    from anymail.signals import tracking

    tracking.connect(record_event, dispatch_uid="outbox.contrib.anymail")
    return True


def record_event(sender: Any, event: Any, esp_name: str, **kwargs: Any) -> None:
    """The ``tracking`` receiver: see the module docstring."""
    outcome = RECORDED.get(getattr(event, "event_type", None) or "")
    message_id = (getattr(event, "message_id", None) or "").strip()
    if outcome is None or not message_id:
        return
    # ESPs report the Message-ID with or without its angle brackets.
    bare = message_id.strip("<>")
    delivery = Delivery.objects.filter(message_id__in=[f"<{bare}>", bare]).first()
    if delivery is None:
        return
    error = _describe(event, esp_name)
    now = timezone.now()
    with transaction.atomic(using=outbox_alias()):
        Attempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            started_at=getattr(event, "timestamp", None) or now,
            finished_at=now,
            outcome=outcome,
            error=error,
            actor=f"esp:{esp_name}"[:255],
        )
        if event.event_type in SUPPRESSING:
            add_refused([bare_address(delivery.recipient)], error)
    logger.info("delivery %s: %s reported %s", delivery.pk, esp_name, event.event_type)


def _describe(event: Any, esp_name: str) -> str:
    parts = [f"{esp_name} reported {event.event_type}"]
    for attribute in ("reject_reason", "description", "mta_response"):
        value = getattr(event, attribute, None)
        if value:
            parts.append(str(value))
    return ": ".join(parts)[:2000]


__all__ = ["RECORDED", "SUPPRESSING", "connect", "record_event"]
