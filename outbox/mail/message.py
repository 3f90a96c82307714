"""Build one recipient's copy of an :class:`~outbox.models.Email`.

Every copy goes to one envelope recipient, ``delivery.recipient``, and carries
the row's Message-ID. What its headers show depends on how the email was
written:

- ``enqueue_email`` stores no ``To`` header: each copy is addressed to its
  recipient alone (``To: <recipient>``).
- The drop-in backend stores the message's structure (see
  :mod:`outbox.mail.structure`): every copy is the message Django would have
  built, To and Cc as the sender wrote them, a Bcc recipient in no header (a
  message without To and Cc has neither header, as in Django). Rows the
  backend wrote before the structure existed keep their stored To/Cc headers.

One build serves every copy of an email: the copy's ``message()`` is the
email's message, built once by Django per policy, with only the headers that
differ per copy set (Message-ID, Date unless the sender gave one, and the To
of an ``enqueue_email`` copy). The copies share the built parts, so they must
be read, not changed, and every multipart boundary is set before the build is
shared (``_set_boundaries``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from email.message import Message
from email.utils import formatdate, getaddresses
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.utils.timezone import get_current_timezone

from ..compat.email import copy_with_own_headers
from ..models import Attachment, Delivery, Email
from ..validation import MODERN_EMAIL_API
from .structure import address_set, placement, rebuild, refuse_cleared

# The keys of an email's build cache (besides one built message per policy).
_TEMPLATE = "template"
_SHOWN = "shown"


class OutboxCopy(EmailMultiAlternatives):
    """One recipient's copy: a Django message whose ``message()`` reuses the email's build."""

    _built: dict[Any, Any]
    _per_copy: dict[str, str]
    _fresh_date = True
    _own_build = False

    def message(self, **kwargs: Any) -> Any:
        if self._own_build:
            return super().message(**kwargs)
        key = kwargs.get("policy")
        built = self._built.get(key)
        if built is None:
            built = self._built[_TEMPLATE].message(**kwargs)
            _set_boundaries(built)
            built = self._built.setdefault(key, built)
        return self._patched(built)

    def _patched(self, built: Message) -> Message:
        # A header list of its own; the parts stay shared (read only).
        msg = copy_with_own_headers(built)
        for name, value in self._per_copy.items():
            msg.replace_header(name, value)
        if self._fresh_date:
            msg.replace_header("Date", _date())
        return msg


def _set_boundaries(message: Message) -> None:
    """Give every multipart its boundary now, before copies share the parts.

    Python's generator would pick one on the first serialisation (and write it
    into the part), which two threads must not race on. A random 19-digit
    boundary, as the generator makes them, cannot be guessed to be planted in
    a body; setting it costs a walk, where a serialisation would cost as much
    as sending.
    """
    for part in message.walk():
        # Not is_multipart(): it is also true of message/rfc822, which has no boundary.
        if part.get_content_maintype() == "multipart" and part.get_boundary() is None:
            part.set_boundary(f"{'=' * 15}{secrets.randbelow(10**19):019d}==")


def _date() -> Any:
    """The Date header's value as Django's ``message()`` makes it."""
    if MODERN_EMAIL_API:
        return datetime.now(get_current_timezone() if settings.EMAIL_USE_LOCALTIME else UTC)
    return formatdate(localtime=settings.EMAIL_USE_LOCALTIME)


def _addresses(header: str | None) -> set[str]:
    if not header:
        return set()
    return {address.lower() for _name, address in getaddresses([header]) if address}


def envelope_fields(recipient: str, headers: dict[str, Any]) -> tuple[list[str], ...]:
    """``(to, cc, bcc)`` of a copy that puts ``recipient`` in the envelope only.

    Without a stored ``To`` the copy is addressed to the recipient (``to``).
    With one, the recipient goes where the sender put them (``to``, ``cc``, or
    else ``bcc``): the headers come from the stored values either way, so the
    choice only shows in ``EmailMessage.to``/``cc``/``bcc`` of the copy (e.g.
    in ``django.core.mail.outbox`` under test, or to a backend that reads them).
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
    delivery: Delivery,
    email: Email,
    attachments: Sequence[Attachment] = (),
    built: dict[Any, Any] | None = None,
) -> EmailMultiAlternatives:
    """The copy for ``delivery.recipient`` alone, carrying the row's Message-ID.

    ``built`` is where the email's one build is kept between its copies (the
    worker keeps one per cached email); without it the copy builds alone.
    """
    refuse_cleared(email)  # never an empty message
    built = {} if built is None else built
    if email.structure is not None:
        return _structured_copy(delivery, email, attachments, built)
    return _column_copy(delivery, email, attachments, built)


def _structured_copy(
    delivery: Delivery, email: Email, attachments: Sequence[Attachment], built: dict[Any, Any]
) -> OutboxCopy:
    """A copy of a message from the drop-in backend: Django's message, one envelope recipient."""
    template = built.get(_TEMPLATE)
    if template is None:
        template = built.setdefault(_TEMPLATE, rebuild(email, attachments))
    shown = built.get(_SHOWN)
    if shown is None:
        shown = built.setdefault(_SHOWN, _shown(email, template))
    headers, to, cc = shown
    headers = dict(headers)
    _set_message_id(headers, delivery.message_id)
    where = placement(delivery.recipient, to, cc)
    message = _copy_of(template, headers, built)
    message.to = [delivery.recipient] if where == "to" else []
    message.cc = [delivery.recipient] if where == "cc" else []
    message.bcc = [delivery.recipient] if where == "bcc" else []
    message._per_copy = {"Message-ID": delivery.message_id}
    message._fresh_date = not any(name.lower() == "date" for name in template.extra_headers)
    return message


def _shown(
    email: Email, template: EmailMultiAlternatives
) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    """The copies' extra headers, and the To and Cc addresses (worked out once per email).

    To and Cc are shown as written, whichever list a copy's recipient is in:
    Django's ``message()`` takes extra To/Cc headers over the lists.
    """
    s = email.structure or {}
    to, cc = list(s.get("to", ())), list(s.get("cc", ()))
    headers = dict(template.extra_headers)
    if to and "To" not in headers:
        headers["To"] = ", ".join(to)
    if cc and "Cc" not in headers:
        headers["Cc"] = ", ".join(cc)
    return headers, address_set(to), address_set(cc)


def _set_message_id(headers: dict[str, Any], message_id: str) -> None:
    """Put the copy's Message-ID where the sender's was (same key), or add it."""
    for name in headers:
        if name.lower() == "message-id":
            headers[name] = message_id
            return
    headers["Message-ID"] = message_id


def _copy_of(
    template: EmailMultiAlternatives, headers: dict[str, Any], built: dict[Any, Any]
) -> OutboxCopy:
    message = OutboxCopy.__new__(OutboxCopy)
    message.__dict__.update(template.__dict__)  # the contents are shared, read only
    message.extra_headers = headers
    message._built = built
    return message


def _column_copy(
    delivery: Delivery, email: Email, attachments: Sequence[Attachment], built: dict[Any, Any]
) -> OutboxCopy:
    """A copy of an ``enqueue_email`` row (or a backend row from before the structure).

    An email with HTML and an empty text body is sent as a single HTML part.
    """
    headers = dict(email.headers)
    recipient = delivery.recipient
    per_copy = {"Message-ID": delivery.message_id}
    # A To of the copy's own is patched into the shared build, unless Django
    # must format it (non-ASCII: an encoded name, an IDNA domain).
    own_to = "To" not in headers
    alone = own_to and not recipient.isascii()
    template = built.get(_TEMPLATE)
    if template is None and not alone:
        template = built.setdefault(_TEMPLATE, _column_message(email, attachments, recipient))
    if own_to:
        per_copy["To"] = recipient
    headers["Message-ID"] = delivery.message_id
    to, cc, bcc = envelope_fields(recipient, headers)
    if alone or template is None:
        message = _copy_of(_column_message(email, attachments, recipient), headers, {})
        message._own_build = True
    else:
        message = _copy_of(template, headers, built)
    message.to, message.cc, message.bcc = to, cc, bcc
    message._per_copy = per_copy
    message._fresh_date = not any(name.lower() == "date" for name in email.headers)
    return message


def _column_message(
    email: Email, attachments: Sequence[Attachment], recipient: str
) -> EmailMultiAlternatives:
    headers = dict(email.headers)
    html_only = bool(email.html_message) and not email.body
    to, cc, bcc = envelope_fields(recipient, headers)
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
