"""The delivery's identity at an email service provider (django-anymail backends).

Every copy sent through an anymail backend carries, in anymail's
``metadata`` (which the ESP stores with the message and echoes in its
tracking webhooks, where it supports that: README, "Sending through an
ESP"), the delivery's id and the claim token of the attempt, never an
address::

    {"outbox_delivery": "1234", "outbox_token": "<uuid hex>"}

A webhook event that carries them names one attempt of one row
(``outbox/contrib/anymail.py``), even when the request's answer was lost and
the ESP's own message id was never learned. When the answer came, that id
(``message.anymail_status.message_id``) is recorded on the attempt.

**One request per message.** A message from the drop-in backend reaches the
ESP as anymail would have sent it (:func:`request_message`): its To, Cc and
Bcc lists as written, with no header the caller did not write (the identity
rides in metadata). All its rows the worker could mark go in that one request
(the claimed row and its *companions*, ``transitions.MARK_COMPANIONS``), and
each row is settled from its recipient's status in anymail's answer
(:func:`answer_of`). With the staging valve on, or for an
``enqueue_email`` row, each row is still its own request, to its recipient
alone (:func:`one_request`).

anymail's public message attributes (``metadata``, ``anymail_status``) are
read and written only here; any other backend's message is left as it is.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.core.mail import EmailMessage, EmailMultiAlternatives

from ..conf import outbox_settings
from ..models import Attachment, Delivery, Email
from ..validation import bare_address
from .structure import address_set, placement, rebuild

__all__ = [
    "ACCEPTED",
    "DELIVERY_KEY",
    "REFUSED",
    "TOKEN_KEY",
    "Answer",
    "RecipientStatus",
    "answer_of",
    "esp_message_id",
    "identify",
    "identity_of",
    "is_anymail",
    "one_request",
    "request_message",
]

DELIVERY_KEY = "outbox_delivery"
TOKEN_KEY = "outbox_token"

# anymail's per-recipient statuses of an accepted request (``AnymailRecipientStatus``):
# the ESP has the message for these recipients ...
ACCEPTED = frozenset({"sent", "queued", "scheduled"})
# ... and refused these for good (an inactive or invalid address). Any other
# status ("failed") is retried. A recipient the answer does not name ("unknown",
# or absent) shares the request's fate: sent when the ESP answered with success,
# retried when it refused the request for another recipient's sake (Postmark's
# 422 for one invalid address: "Email not sent", the others left unknown).
REFUSED = frozenset({"rejected", "invalid"})


class RecipientStatus(NamedTuple):
    """One recipient's status in anymail's answer, and the ESP's message id for it."""

    status: str
    message_id: str


class Answer(NamedTuple):
    """anymail's answer to one request: each recipient's status, and whether the ESP took it."""

    statuses: dict[str, RecipientStatus]
    taken: bool  # the HTTP answer was a success (or carried no status code)

    def of(self, recipient: str) -> RecipientStatus | None:
        """The status of ``recipient`` (as a row writes it), or None if not named."""
        found = self.statuses.get(bare_address(recipient))
        return None if found is None or found.status == "unknown" else found


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


def one_request(email: Email) -> bool:
    """Whether ``email``'s rows go to an ESP together, as one request.

    A message from the drop-in backend does (its structure says how it was
    written), unless the staging valve is on: the valve decides per copy,
    so each row is then its own request, to its recipient alone.
    """
    return email.structure is not None and outbox_settings.ALLOWED_RECIPIENTS is None


def request_message(
    email: Email, attachments: Sequence[Attachment], deliveries: Sequence[Delivery]
) -> EmailMultiAlternatives:
    """The message the caller wrote, for the recipients of ``deliveries`` only.

    Each recipient is in the list the caller put them in, in the caller's
    order (with the display name as written); a recipient in neither To nor
    Cc is Bcc. Only the caller's headers go: no To, Cc or Message-ID is added,
    since an ESP builds those from its fields (and most refuse a spoofed To).
    """
    s = email.structure or {}
    written_to, written_cc = list(s.get("to", ())), list(s.get("cc", ()))
    ours = {bare_address(d.recipient) for d in deliveries}
    to = [a for a in written_to if bare_address(a) in ours]
    cc = [a for a in written_cc if bare_address(a) in ours and a not in to]
    to_set, cc_set = address_set(written_to), address_set(written_cc)
    bcc = [d.recipient for d in deliveries if placement(d.recipient, to_set, cc_set) == "bcc"]
    return rebuild(email, attachments, to=to, cc=cc, bcc=bcc)


def answer_of(message: EmailMessage) -> Answer:
    """anymail's answer to a sent ``message``: its ``anymail_status``, by bare address.

    Addresses are compared in :func:`outbox.validation.bare_address` form,
    the rows' own. ``esp_response`` is anymail's documented raw response (a
    ``requests`` response for the HTTP backends).
    """
    status = getattr(message, "anymail_status", None)
    recipients = getattr(status, "recipients", None) or {}
    found = {}
    for address, recipient in recipients.items():
        value = getattr(recipient, "message_id", None)
        found[bare_address(str(address))] = RecipientStatus(
            str(getattr(recipient, "status", None) or "unknown"),
            str(value)[:255] if value else "",
        )
    code = getattr(getattr(status, "esp_response", None), "status_code", None)
    return Answer(found, not isinstance(code, int) or code < 400)
