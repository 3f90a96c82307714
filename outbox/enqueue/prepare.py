"""Validation for the outbox's write path: input in, a :class:`Prepared` email out.

Everything :func:`outbox.enqueue_email` and the outbox email backend are
given is checked and normalised here, before anything is written: a bad field
raises ``ValidationError`` naming it (or ``TypeError`` for a value of the wrong
type). :mod:`outbox.enqueue.api` writes the result.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone
from email.message import Message as MIMEMessage
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _

from ..conf import PRIORITIES, outbox_settings
from ..mail.mailers import delivery_mailers, is_delivery_mailer
from ..models import MAILER_MAX_LENGTH
from ..validation import (
    check_mimetype,
    check_text,
    field_error,
    normalize_address,
    normalize_address_list,
    normalize_headers,
    require_type,
)

# Far beyond any sane retry budget, and well inside the column.
MAX_ATTEMPTS_LIMIT = 1000

# The To header of a copy whose sender wrote no To (a Cc/Bcc-only message): an
# empty RFC 5322 group, as MTAs write it. It never names a Bcc recipient.
UNDISCLOSED_RECIPIENTS = "undisclosed-recipients:;"


@dataclass
class Prepared:
    """Validated input of one enqueue call, ready to be written."""

    subject: str
    body: str
    from_email: str
    recipients: list[str]
    html_message: str = ""
    reply_to: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    attachments: list[tuple[str, bytes, str]] = field(default_factory=list)
    send_at: datetime | None = None
    priority: str = "normal"
    idempotency_key: str | None = None
    max_attempts: int = 5
    expires_at: datetime | None = None
    mailer: str = ""  # "": the worker's default delivery target


def prepare(
    subject: Any,
    message: Any,
    from_email: Any,
    recipient_list: Any,
    *,
    html_message: Any,
    reply_to: Any,
    headers: Any,
    attachments: Any,
    send_at: Any,
    priority: Any,
    idempotency_key: Any,
    max_attempts: Any,
    expires_at: Any = None,
    mailer: Any = None,
) -> Prepared:
    """Validate :func:`~outbox.enqueue_email`'s arguments, field by field.

    The fields are checked in the order of the signature, so that the first
    bad one is the one reported.
    """
    _check_texts(subject, message, html_message)
    if from_email is None:
        from_email = settings.DEFAULT_FROM_EMAIL
    if type(from_email) is str:
        sender = _valid_sender(from_email)
    else:  # perhaps not even hashable: checked, and rejected, uncached
        sender = normalize_address("from_email", from_email)[0]
    recipients = _check_recipients(recipient_list)
    reply = [] if reply_to is None else normalize_address_list("reply_to", reply_to)
    extra_headers = normalize_headers(headers)
    files = _prepare_attachments(attachments)
    _check_send_at(send_at)
    _check_priority(priority)
    _check_idempotency_key(idempotency_key)
    if max_attempts is None:
        max_attempts = outbox_settings.MAX_ATTEMPTS
    _check_max_attempts(max_attempts)
    _check_expires_at(expires_at, send_at)
    mailer = _check_mailer(mailer)
    return Prepared(
        subject=subject,
        body=message,
        from_email=sender,
        recipients=recipients,
        html_message=html_message or "",
        reply_to=reply,
        headers=extra_headers,
        attachments=files,
        send_at=_stored(send_at),
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        expires_at=_stored(expires_at),
        mailer=mailer,
    )


def _stored(moment: datetime | None) -> datetime | None:
    """A validated (aware) time the way Django stores it: naive in TIME_ZONE without USE_TZ.

    SQLite refuses an aware datetime when ``USE_TZ = False``; the caller's
    time is the same instant either way.
    """
    if moment is None or settings.USE_TZ:
        return moment
    return timezone.make_naive(moment, timezone.get_default_timezone())


@lru_cache(maxsize=64)
def _valid_sender(from_email: str) -> str:
    # Cached (valid senders only: an exception is not cached): a site sends
    # from a few addresses, and checking one is a good part of a call's work.
    return normalize_address("from_email", from_email)[0]


def _check_texts(subject: Any, message: Any, html_message: Any) -> None:
    require_type("subject", subject, str, "a string")
    check_text("subject", subject, single_line=True)
    require_type("message", message, str, "a string")
    check_text("message", message, single_line=False)
    if html_message is not None:
        require_type("html_message", html_message, str, "a string")
        check_text("html_message", html_message, single_line=False)


def _check_recipients(recipient_list: Any) -> list[str]:
    recipients = normalize_address_list("recipient_list", recipient_list)
    if not recipients:
        raise field_error(
            "recipient_list",
            _("%(field)s is empty: at least one recipient is required.")
            % {"field": "recipient_list"},
            "required",
        )
    return recipients


def _check_send_at(send_at: Any) -> None:
    if send_at is not None:
        require_type("send_at", send_at, datetime, "a datetime")
        if timezone.is_naive(send_at):
            raise field_error("send_at", _("send_at must be timezone-aware."), "naive")


def _check_expires_at(expires_at: Any, send_at: datetime | None) -> None:
    """Aware, in the future, and after ``send_at``: else the row could never be sent."""
    if expires_at is None:
        return
    require_type("expires_at", expires_at, datetime, "a datetime")
    if timezone.is_naive(expires_at):
        raise field_error("expires_at", _("expires_at must be timezone-aware."), "naive")
    # An aware now: timezone.now() is naive without USE_TZ.
    if expires_at <= datetime.now(dt_timezone.utc):
        raise field_error("expires_at", _("expires_at is in the past."), "past")
    if send_at is not None and expires_at <= send_at:
        raise field_error(
            "expires_at", _("expires_at must be later than send_at."), "before_send_at"
        )


def _check_mailer(mailer: Any) -> str:
    """A mailer an email may name (see ``outbox/mail/mailers.py``), or "" for the default.

    Checked against this host's settings, before anything is written: an
    unknown name, or one that is the outbox itself, would never be sent.
    """
    if mailer is None or mailer == "":
        return ""
    require_type("mailer", mailer, str, "a string")
    check_text("mailer", mailer, single_line=True)
    if len(mailer) > MAILER_MAX_LENGTH:
        raise field_error(
            "mailer",
            _("A mailer name has at most %(limit)d characters.") % {"limit": MAILER_MAX_LENGTH},
            "max_length",
        )
    if not is_delivery_mailer(mailer):
        known = delivery_mailers()
        raise field_error(
            "mailer",
            _("Unknown mailer %(value)r; use one of: %(choices)s.")
            % {"value": mailer, "choices": ", ".join(known) or _("(none configured)")},
            "unknown",
        )
    return mailer


def _check_priority(priority: Any) -> None:
    require_type("priority", priority, str, "a string")
    if priority not in PRIORITIES:
        raise field_error(
            "priority",
            _("Unknown priority %(value)r; use one of %(choices)s.")
            % {"value": priority, "choices": ", ".join(PRIORITIES)},
        )


def _check_idempotency_key(idempotency_key: Any) -> None:
    if idempotency_key is not None:
        require_type("idempotency_key", idempotency_key, str, "a string")
        check_text("idempotency_key", idempotency_key, single_line=True)
        if not 0 < len(idempotency_key) <= 255:
            raise field_error(
                "idempotency_key", _("The idempotency key must be 1 to 255 characters.")
            )


def _check_max_attempts(max_attempts: Any) -> None:
    require_type("max_attempts", max_attempts, int, "an integer")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise field_error(
            "max_attempts",
            _("max_attempts must be between 1 and %(limit)d.") % {"limit": MAX_ATTEMPTS_LIMIT},
            "range",
        )


def _prepare_attachments(attachments: Any) -> list[tuple[str, bytes, str]]:
    if attachments is None:
        return []
    if isinstance(attachments, (str, bytes)) or not isinstance(attachments, Iterable):
        raise TypeError("attachments must be a list of (filename, content, mimetype) tuples")
    result = []
    for item in attachments:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("each attachment must be a (filename, content, mimetype) tuple")
        name, content, mimetype = item
        name = name or ""
        require_type("attachments", name, str, "a file name string")
        check_text("attachments", name, single_line=True)
        if isinstance(content, str):
            check_text("attachments", content, single_line=False)
            content = content.encode("utf-8")
        require_type("attachments", content, (bytes, bytearray, memoryview), "bytes or str")
        if mimetype is None:
            mimetype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        require_type("attachments", mimetype, str, "a MIME type string")
        check_text("attachments", mimetype, single_line=True)
        check_mimetype("attachments", mimetype)
        result.append((name, bytes(content), mimetype))
    return result


def prepare_message(
    message: EmailMessage,
    *,
    priority: str = "normal",
    max_attempts: int | None = None,
    mailer: str | None = None,
) -> Prepared:
    """Validate a Django ``EmailMessage`` for :func:`~outbox.enqueue.api.write_prepared`.

    Every envelope recipient (``to + cc + bcc``, duplicates removed) becomes
    one delivery. The To and Cc headers as the sender wrote them go into the
    stored headers, so that each copy shows them; when the sender wrote no To,
    the copies say ``To: undisclosed-recipients:;``. Bcc recipients appear in
    no header. ``To``/``Cc`` given in ``message.extra_headers`` win, as they do
    in Django.

    The body may be plain text with at most one ``text/html`` alternative, or
    HTML (``content_subtype = "html"``) with at most one ``text/plain``
    alternative. Attachments are files: ``(filename, content, mimetype)``
    entries, or MIME parts that carry one file (not inline parts with a
    Content-ID, which the outbox cannot store).

    Raises ``ValidationError`` (or ``TypeError``) like :func:`~outbox.enqueue_email`.
    """
    to = _message_addresses("to", message.to)
    cc = _message_addresses("cc", message.cc)
    bcc = _message_addresses("bcc", message.bcc)
    headers = _message_headers(message.extra_headers)
    if "To" not in headers:
        headers["To"] = ", ".join(to) if to else UNDISCLOSED_RECIPIENTS
    if "Cc" not in headers and cc:
        headers["Cc"] = ", ".join(cc)
    body, html = _message_bodies(message)
    return prepare(
        _as_text(message.subject),
        body,
        _as_text(message.from_email),
        [*to, *cc, *bcc],
        html_message=html,
        reply_to=[_as_text(a) for a in message.reply_to or () if a],
        headers=headers,
        attachments=[_message_attachment(item) for item in message.attachments],
        send_at=None,
        priority=priority,
        idempotency_key=None,
        max_attempts=max_attempts,
        mailer=mailer,
    )


def _as_text(value: Any) -> Any:
    """Lazy translations become str; anything else is left for validation."""
    return str(value) if isinstance(value, Promise) else value


def _message_addresses(field_name: str, values: Any) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{field_name} must be a list or tuple of addresses, not a string")
    return normalize_address_list(field_name, [_as_text(v) for v in values or () if v])


def _message_headers(extra: Any) -> dict[str, str]:
    if not extra:
        return {}
    if not isinstance(extra, dict):
        raise TypeError(f"headers must be a dict, not {type(extra).__name__}")
    # Django writes any value with str(); so do we, then validate the text.
    headers = {
        name: value if isinstance(value, str) else str(value) for name, value in extra.items()
    }
    return normalize_headers(headers)


def _message_bodies(message: EmailMessage) -> tuple[str, str | None]:
    """``(text body, HTML or None)`` of a message, or a ValidationError."""
    body = _as_text(message.body) or ""
    subtype = getattr(message, "content_subtype", "plain")
    alternatives = [
        (_as_text(alt[0]), str(alt[1])) for alt in getattr(message, "alternatives", None) or ()
    ]
    wanted = {"plain": "text/html", "html": "text/plain"}.get(subtype)
    if wanted is None:
        raise field_error(
            "content_subtype",
            _("The outbox stores plain text or HTML bodies, not %(subtype)r.")
            % {"subtype": subtype},
        )
    if len(alternatives) > 1 or any(mimetype != wanted for _c, mimetype in alternatives):
        raise field_error(
            "alternatives",
            _("The outbox stores a text body and one HTML alternative; got %(types)s.")
            % {"types": ", ".join([f"text/{subtype}", *(m for _c, m in alternatives)])},
        )
    other = alternatives[0][0] if alternatives else None
    if subtype == "plain":
        return body, other
    return other or "", body


def _message_attachment(item: Any) -> Any:
    """One entry of ``EmailMessage.attachments`` as ``(filename, content, mimetype)``."""
    if isinstance(item, MIMEMessage):  # MIMEBase (Django 5.2) or MIMEPart (6.1)
        if item.is_multipart():
            raise field_error("attachments", _("Multipart attachments are not supported."))
        if item.get("Content-ID") or item.get_content_disposition() == "inline":
            raise field_error(
                "attachments",
                _("Inline parts (with a Content-ID) are not supported; attach files instead."),
            )
        payload = item.get_payload(decode=True)
        return (item.get_filename() or "", payload or b"", item.get_content_type())
    if not isinstance(item, tuple) or len(item) != 3:
        return item  # _prepare_attachments raises the TypeError
    name, content, mimetype = item
    if isinstance(content, EmailMessage):  # a message/rfc822 attachment
        content = content.message().as_bytes()
    elif isinstance(content, MIMEMessage):
        content = content.as_bytes()
    return (name, content, mimetype)
