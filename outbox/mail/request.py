"""One request per message: a drop-in message to an ESP, for all its rows the worker marked.

A message from the drop-in backend reaches the
ESP as anymail would have sent it (:func:`request_message`): its To, Cc and
Bcc lists as written, with no header the caller did not write (the identity
rides in metadata). All its rows the worker could mark go in that one request
(the claimed row and its *companions*, ``transitions.MARK_COMPANIONS``), and
each row is settled from its recipient's status in anymail's answer
(:func:`answer_of`). With the staging valve on, or for an
``enqueue_email`` row, each row is still its own request, to its recipient
alone (:func:`one_request`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.core.mail import EmailMessage, EmailMultiAlternatives

from ..conf import outbox_settings
from ..models import Attachment, Delivery, Email
from ..validation import bare_address
from .structure import address_set, placement, rebuild, refuse_cleared

__all__ = [
    "ACCEPTED",
    "REFUSED",
    "Answer",
    "RecipientStatus",
    "answer_of",
    "one_request",
    "request_message",
]

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
    refuse_cleared(email)  # never an empty message
    s = email.structure or {}
    written_to, written_cc = list(s.get("to", ())), list(s.get("cc", ()))
    ours = {bare_address(d.recipient) for d in deliveries}
    to = [a for a in written_to if bare_address(a) in ours]
    cc = [a for a in written_cc if bare_address(a) in ours and a not in to]
    to_set, cc_set = address_set(written_to), address_set(written_cc)
    # The rows were written in the caller's order (to, cc, bcc): Bcc in that order too.
    bcc = [
        d.recipient
        for d in sorted(deliveries, key=lambda d: d.pk)
        if placement(d.recipient, to_set, cc_set) == "bcc"
    ]
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
