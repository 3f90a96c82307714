"""Build one recipient's copy of an :class:`~outbox.models.Email`.

Every copy goes to one envelope recipient, ``delivery.recipient``. What its
headers show depends on how the email was written:

- ``enqueue_email`` stores no ``To`` header: each copy is addressed to its
  recipient alone (``To: <recipient>``).
- The outbox email backend stores the ``To`` (and ``Cc``) headers the sender
  wrote in ``Email.headers``: every copy shows exactly those, and the
  recipient is only in the envelope. A Bcc recipient is in no header of any
  copy, their own included (a message without To shows
  ``To: undisclosed-recipients:;``).

Both Django 5.2 and 6.1 let an extra ``To``/``Cc`` header override the header
built from ``to``/``cc`` while the envelope stays ``to + cc + bcc``; the copy
uses that, and never puts a ``Bcc`` header in (6.1 refuses one).
"""

from __future__ import annotations

from collections.abc import Sequence
from email.utils import getaddresses

from django.core.mail import EmailMultiAlternatives

from ..models import Attachment, Delivery, Email


def _addresses(header: str | None) -> set[str]:
    if not header:
        return set()
    return {address.lower() for _name, address in getaddresses([header]) if address}


def envelope_fields(recipient: str, headers: dict[str, str]) -> tuple[list[str], ...]:
    """``(to, cc, bcc)`` of a copy that puts ``recipient`` in the envelope only.

    Without a stored ``To`` the copy is addressed to the recipient (``to``).
    With one, the recipient goes where the sender put them (``to``, ``cc``, or
    else ``bcc``): the headers come from the stored values either way, so the
    choice only shows in ``EmailMessage.to``/``cc``/``bcc`` of the copy (e.g.
    in ``django.core.mail.outbox`` under test).
    """
    if "To" not in headers:
        return [recipient], [], []
    address = (getaddresses([recipient])[0][1] or recipient).lower()
    if address in _addresses(headers.get("To")):
        return [recipient], [], []
    if address in _addresses(headers.get("Cc")):
        return [], [recipient], []
    return [], [], [recipient]


def build_message(
    delivery: Delivery, email: Email, attachments: Sequence[Attachment] = ()
) -> EmailMultiAlternatives:
    """The copy for ``delivery.recipient`` alone, carrying the row's Message-ID.

    The envelope recipient is only ``delivery.recipient``; ``To``/``Cc`` headers
    stored with the email (as the sender wrote them) are shown as they are, and
    no Bcc recipient ever appears in a header. An email with HTML and an empty
    text body is sent as a single HTML part.
    """
    headers = dict(email.headers)
    headers["Message-ID"] = delivery.message_id
    html_only = bool(email.html_message) and not email.body
    to, cc, bcc = envelope_fields(delivery.recipient, headers)
    message = EmailMultiAlternatives(
        subject=email.subject,
        body=email.html_message if html_only else email.body,
        from_email=email.from_email,
        to=to,
        cc=cc,
        bcc=bcc,
        reply_to=list(email.reply_to) or None,
        headers=headers,
    )
    if html_only:
        message.content_subtype = "html"
    elif email.html_message:
        message.attach_alternative(email.html_message, "text/html")
    for attachment in attachments:
        message.attach(attachment.name or None, bytes(attachment.content), attachment.mimetype)
    return message
