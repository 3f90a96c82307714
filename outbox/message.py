"""Build one recipient's copy of an :class:`~outbox.models.Email`."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.mail import EmailMultiAlternatives

from .models import Attachment, Delivery, Email


def build_message(
    delivery: Delivery, email: Email, attachments: Sequence[Attachment] = ()
) -> EmailMultiAlternatives:
    """The copy for ``delivery.recipient`` alone, carrying the row's Message-ID.

    The envelope recipient is only ``delivery.recipient``; ``To``/``Cc`` headers
    stored with the email (as the sender wrote them) are shown as they are, and
    no Bcc recipient ever appears in a header.
    """
    headers = dict(email.headers)
    headers["Message-ID"] = delivery.message_id
    message = EmailMultiAlternatives(
        subject=email.subject,
        body=email.body,
        from_email=email.from_email,
        to=[delivery.recipient],
        reply_to=list(email.reply_to) or None,
        headers=headers,
    )
    if email.html_message:
        message.attach_alternative(email.html_message, "text/html")
    for attachment in attachments:
        message.attach(attachment.name or None, bytes(attachment.content), attachment.mimetype)
    return message
