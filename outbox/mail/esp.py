"""The delivery's identity at an email service provider (django-anymail backends).

Every copy sent through an anymail backend carries, in anymail's
``metadata`` (which the ESP stores with the message and echoes in its
tracking webhooks, where it supports that: README, "Sending through an
ESP"), the delivery's id and the claim token of the attempt, never an
address::

    {"outbox_delivery": "1234", "outbox_token": "<uuid hex>"}

A webhook event that carries them names one attempt of one row
(:func:`outbox.contrib.anymail.record_event`), even when the request's answer was lost and
the ESP's own message id was never learned. When the answer came, that id
(``message.anymail_status.message_id``) is recorded on the attempt.

A message from the drop-in backend goes as one request for all its rows:
:mod:`outbox.mail.request`.

anymail's public message attributes (``metadata``, ``anymail_status``) are
read and written only here; any other backend's message is left as it is.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.mail import EmailMessage

__all__ = ["DELIVERY_KEY", "TOKEN_KEY", "esp_message_id", "identify", "identity_of", "is_anymail"]

DELIVERY_KEY = "outbox_delivery"
TOKEN_KEY = "outbox_token"


def is_anymail(backend: object) -> bool:
    """Whether ``backend`` is one of django-anymail's (by its module: anymail is optional)."""
    return type(backend).__module__.startswith("anymail.")


def identify(message: EmailMessage, delivery_id: int, token: uuid.UUID) -> None:
    """Add the delivery's identity to ``message``'s anymail metadata (kept: the caller's)."""
    metadata = dict(getattr(message, "metadata", None) or {})
    metadata.update({DELIVERY_KEY: str(delivery_id), TOKEN_KEY: token.hex})
    message.metadata = metadata  # type: ignore[attr-defined]


def identity_of(metadata: Any) -> tuple[int, uuid.UUID] | None:
    """The (delivery id, claim token) an event's metadata names, or None."""
    if not isinstance(metadata, dict):
        return None
    try:
        return int(metadata[DELIVERY_KEY]), uuid.UUID(str(metadata[TOKEN_KEY]))
    except (KeyError, TypeError, ValueError):
        return None


def esp_message_id(message: EmailMessage) -> str:
    """The ESP's own id for the sent ``message`` ("" when it gave none)."""
    status = getattr(message, "anymail_status", None)
    value = getattr(status, "message_id", None)
    if isinstance(value, set | frozenset):
        # A set when recipients got different ids; the outbox sends to one.
        value = next(iter(value)) if len(value) == 1 else ", ".join(sorted(map(str, value)))
    return str(value)[:255] if value else ""
