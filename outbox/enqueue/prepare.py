"""Validation for the outbox's write path: input in, a :class:`Prepared` email out.

Everything :func:`outbox.enqueue_email` is given is checked and normalised
here, before anything is written: a bad field raises
:class:`~outbox.exceptions.InvalidEmailError` naming it (or ``TypeError`` for a
value of the wrong type). :mod:`outbox.enqueue.api` writes the result; the
drop-in backend's messages are checked in :mod:`outbox.enqueue.messages`.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import tracing
from ..conf import PRIORITIES, outbox_settings
from ..mail.mailers import delivery_mailers, is_delivery_mailer
from ..mail.structure import File
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
from .sensitive import links_sensitive

# Far beyond any sane retry budget, and well inside the column.
MAX_ATTEMPTS_LIMIT = 1000


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
    attachments: list[File] = field(default_factory=list)
    send_at: datetime | None = None
    priority: str = "normal"
    idempotency_key: str | None = None
    max_attempts: int = 5
    expires_at: datetime | None = None
    mailer: str = ""  # "": the worker's default delivery target
    # From the drop-in backend: see outbox.mail.structure.describe.
    structure: dict[str, Any] | None = None
    message_id: str | None = None  # the sender's own Message-ID header
    # Content cleared as soon as every delivery is settled (outbox.enqueue.sensitive).
    sensitive: bool = False
    # The caller's trace context, taken where the input is validated, in the
    # caller's own context (outbox.tracing.carrier); None when not traced.
    trace_context: dict[str, str] | None = field(default_factory=tracing.carrier)


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
    sensitive: Any = False,
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
    check_priority(priority)
    _check_idempotency_key(idempotency_key)
    if max_attempts is None:
        max_attempts = outbox_settings.MAX_ATTEMPTS
    check_max_attempts(max_attempts)
    _check_expires_at(expires_at, send_at)
    mailer = check_mailer(mailer)
    require_type("sensitive", sensitive, bool, "True or False")
    return Prepared(
        subject=subject,
        body=message,
        from_email=sender,
        recipients=recipients,
        html_message=html_message or "",
        reply_to=reply,
        headers=extra_headers,
        attachments=files,
        send_at=stored_moment(send_at),
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        expires_at=stored_moment(expires_at),
        mailer=mailer,
        sensitive=sensitive or links_sensitive(message, html_message or ""),
    )


def stored_moment(moment: datetime | None) -> datetime | None:
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
    if expires_at <= datetime.now(UTC):
        raise field_error("expires_at", _("expires_at is in the past."), "past")
    if send_at is not None and expires_at <= send_at:
        raise field_error(
            "expires_at", _("expires_at must be later than send_at."), "before_send_at"
        )


def check_mailer(mailer: Any) -> str:
    """A mailer an email may name (see :mod:`outbox.mail.mailers`), or "" for the default.

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


def check_priority(priority: Any) -> None:
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


def check_max_attempts(max_attempts: Any) -> None:
    require_type("max_attempts", max_attempts, int, "an integer")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise field_error(
            "max_attempts",
            _("max_attempts must be between 1 and %(limit)d.") % {"limit": MAX_ATTEMPTS_LIMIT},
            "range",
        )


def _prepare_attachments(attachments: Any) -> list[File]:
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
        result.append(File(name, bytes(content), mimetype))
    return result
