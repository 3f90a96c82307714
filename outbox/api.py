"""Put email in the outbox: one validated write path, two ways in.

``enqueue_email`` takes ``send_mail``-style arguments and gives each recipient
a copy addressed to them alone. The outbox email backend
(:class:`outbox.backends.OutboxBackend`) hands over Django ``EmailMessage``
objects through :func:`prepare_message` and :func:`write_prepared`: every
envelope recipient (To, Cc and Bcc) gets one delivery, and the To and Cc
headers the sender wrote are stored in ``Email.headers`` so that every copy
shows them (see :mod:`outbox.message`).

Both paths validate everything before writing, write the rows in the caller's
transaction, and push ids to Redis only after the commit.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.message import Message as MIMEMessage
from functools import partial
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import connections, router, transaction
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _

from . import signals
from .conf import PRIORITIES, outbox_settings
from .db import binding_cursor
from .models import Attachment, Delivery, Email
from .queue import QueueEntry, RedisQueue
from .validation import (
    check_mimetype,
    check_text,
    field_error,
    normalize_address,
    normalize_address_list,
    normalize_headers,
    require_type,
)

logger = logging.getLogger("outbox.enqueue")

# Far beyond any sane retry budget, and well inside the column.
MAX_ATTEMPTS_LIMIT = 1000
# Message-ID is "<" + 32 hex + "@" + domain + ">" in a 255-character column;
# also short enough that no mail library folds it onto a second line.
MAX_MESSAGE_ID_DOMAIN = 60

# Chunk size of `recipient__in` look-ups (SQLite limits query parameters).
_IN_CHUNK = 500

# The To header of a copy whose sender wrote no To (a Cc/Bcc-only message): an
# empty RFC 5322 group, as MTAs write it. It never names a Bcc recipient.
UNDISCLOSED_RECIPIENTS = "undisclosed-recipients:;"


@dataclass
class _Prepared:
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


def enqueue_email(
    subject: str,
    message: str,
    from_email: str | None,
    recipient_list: Sequence[str],
    *,
    html_message: str | None = None,
    reply_to: Sequence[str] | None = None,
    headers: dict[str, str] | None = None,
    attachments: Sequence[tuple[str, bytes | str, str | None]] | None = None,
    send_at: datetime | None = None,
    priority: str = "normal",
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
) -> list[Delivery]:
    """Queue an email: one :class:`~outbox.models.Delivery` per distinct recipient.

    The first four arguments mean what they mean in
    :func:`django.core.mail.send_mail`; ``from_email=None`` uses
    ``DEFAULT_FROM_EMAIL``. Each recipient gets a copy addressed to them alone.

    Transactional: called inside ``transaction.atomic()``, the rows belong to the
    caller's transaction and a rollback means no email, ever. Row ids are pushed
    to Redis only after the commit; if Redis is unreachable then, a warning is
    logged and ``outbox_sweep`` mirrors the rows later.

    With ``idempotency_key``, a recipient that already has a delivery under that
    key gets no new one: the existing delivery is returned instead, also when
    two calls race.

    Raises :class:`~django.core.exceptions.ValidationError` naming the field for
    bad input (and :class:`TypeError` for a value of the wrong type) before
    anything is written.
    """
    prepared = _prepare(
        subject,
        message,
        from_email,
        recipient_list,
        html_message=html_message,
        reply_to=reply_to,
        headers=headers,
        attachments=attachments,
        send_at=send_at,
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
    )
    return _write(prepared)


def _prepare(
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
) -> _Prepared:
    require_type("subject", subject, str, "a string")
    check_text("subject", subject, single_line=True)
    require_type("message", message, str, "a string")
    check_text("message", message, single_line=False)
    if html_message is not None:
        require_type("html_message", html_message, str, "a string")
        check_text("html_message", html_message, single_line=False)

    if from_email is None:
        from_email = settings.DEFAULT_FROM_EMAIL
    sender, _bare = normalize_address("from_email", from_email)

    recipients = normalize_address_list("recipient_list", recipient_list)
    if not recipients:
        raise field_error("recipient_list", _("At least one recipient is required."), "required")

    reply = [] if reply_to is None else normalize_address_list("reply_to", reply_to)
    extra_headers = normalize_headers(headers)
    files = _prepare_attachments(attachments)

    if send_at is not None:
        require_type("send_at", send_at, datetime, "a datetime")
        if timezone.is_naive(send_at):
            raise field_error("send_at", _("send_at must be timezone-aware."), "naive")

    require_type("priority", priority, str, "a string")
    if priority not in PRIORITIES:
        raise field_error(
            "priority",
            _("Unknown priority %(value)r; use one of %(choices)s.")
            % {"value": priority, "choices": ", ".join(PRIORITIES)},
        )

    if idempotency_key is not None:
        require_type("idempotency_key", idempotency_key, str, "a string")
        check_text("idempotency_key", idempotency_key, single_line=True)
        if not 0 < len(idempotency_key) <= 255:
            raise field_error(
                "idempotency_key", _("The idempotency key must be 1 to 255 characters.")
            )

    if max_attempts is None:
        max_attempts = outbox_settings.MAX_ATTEMPTS
    require_type("max_attempts", max_attempts, int, "an integer")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise field_error(
            "max_attempts",
            _("max_attempts must be between 1 and %(limit)d.") % {"limit": MAX_ATTEMPTS_LIMIT},
            "range",
        )

    return _Prepared(
        subject=subject,
        body=message,
        from_email=sender,
        recipients=recipients,
        html_message=html_message or "",
        reply_to=reply,
        headers=extra_headers,
        attachments=files,
        send_at=send_at,
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
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
    message: EmailMessage, *, priority: str = "normal", max_attempts: int | None = None
) -> _Prepared:
    """Validate a Django ``EmailMessage`` for :func:`write_prepared`.

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

    Raises ``ValidationError`` (or ``TypeError``) like :func:`enqueue_email`.
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
    return _prepare(
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
    )


def write_prepared(prepared: Sequence[_Prepared]) -> list[list[Delivery]]:
    """Write validated emails in one transaction (a savepoint in the caller's)."""
    using = router.db_for_write(Delivery)
    with transaction.atomic(using=using):
        return [_write(p) for p in prepared]


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


def make_message_id(domain: str) -> str:
    """A globally unique Message-ID for one recipient's copy (fits its column)."""
    if len(domain) > MAX_MESSAGE_ID_DOMAIN:
        domain = "localhost"  # a valid but absurdly long sender domain
    return f"<{uuid.uuid4().hex}@{domain}>"


def _message_id_domain(from_email: str) -> str:
    domain = outbox_settings.MESSAGE_ID_DOMAIN or from_email.rpartition("@")[2].rstrip(">")
    try:
        return domain.encode("idna").decode("ascii") or "localhost"
    except UnicodeError:
        return "localhost"


def _write(p: _Prepared) -> list[Delivery]:
    using = router.db_for_write(Delivery)
    now = timezone.now()
    not_before = p.send_at or now
    domain = _message_id_domain(p.from_email)
    if (
        p.idempotency_key is None
        and not p.attachments
        and connections[using].vendor == "postgresql"
    ):
        return _write_postgresql(p, using, now, not_before, domain)
    with transaction.atomic(using=using):
        existing: dict[str, Delivery] = {}
        if p.idempotency_key is not None:
            existing = _existing(using, p.idempotency_key, p.recipients)
        missing = [r for r in p.recipients if r not in existing]
        if not missing:
            return [existing[r] for r in p.recipients]

        email = _email(p, now)
        email.save(force_insert=True, using=using)
        if p.attachments:
            Attachment.objects.using(using).bulk_create(
                Attachment(email=email, name=name, content=content, mimetype=mimetype)
                for name, content, mimetype in p.attachments
            )
        rows = [
            Delivery(
                email=email,
                recipient=recipient,
                priority=p.priority,
                max_attempts=p.max_attempts,
                not_before=not_before,
                message_id=make_message_id(domain),
                idempotency_key=p.idempotency_key,
                created_at=now,
                updated_at=now,
            )
            for recipient in missing
        ]
        if p.idempotency_key is None:
            created = Delivery.objects.using(using).bulk_create(rows)
        else:
            # A concurrent call with the same key may insert the same
            # (key, recipient) first: ON CONFLICT DO NOTHING waits for it and
            # skips, and the re-read below returns whichever row won.
            Delivery.objects.using(using).bulk_create(rows, ignore_conflicts=True)
            existing = _existing(using, p.idempotency_key, p.recipients)
            created = [d for d in existing.values() if d.email_id == email.pk]
            if not created:
                email.delete()

        if created:
            entries = [QueueEntry(d.pk, d.priority, not_before.timestamp()) for d in created]
            transaction.on_commit(partial(_after_commit, email, created, entries), using=using)
    if p.idempotency_key is None:
        return created
    return [existing[r] for r in p.recipients]


# The email and all its deliveries in one statement (PostgreSQL): the
# recipients travel as two arrays instead of a VALUES row each, which is what
# makes a 10,000-recipient call cheap. The deliveries' RETURNING is matched
# back by Message-ID, which is unique, so no row order is assumed.
_INSERT_SQL_POSTGRESQL = """
WITH email AS (
    INSERT INTO {email} (subject, body, html_message, from_email, reply_to, headers,
        created_at)
    VALUES (%(subject)s, %(body)s, %(html)s, %(from)s, %(reply_to)s::jsonb,
        %(headers)s::jsonb, %(now)s)
    RETURNING id
)
INSERT INTO {delivery} (email_id, recipient, status, priority, attempts, max_attempts,
    not_before, worker_id, message_id, last_error, created_at, updated_at)
SELECT email.id, r.recipient, %(queued)s, %(priority)s, 0, %(max_attempts)s,
    %(not_before)s, '', r.message_id, '', %(now)s, %(now)s
FROM email, unnest(%(recipients)s::text[], %(message_ids)s::text[]) AS r(recipient, message_id)
RETURNING id, email_id, message_id
"""


def _write_postgresql(
    p: _Prepared, using: str, now: datetime, not_before: datetime, domain: str
) -> list[Delivery]:
    """The common case (no idempotency key, no attachments) as one INSERT statement.

    Outside a transaction the statement is atomic on its own, so no
    BEGIN/COMMIT round trips are spent on it; inside one, it joins it. Either
    way the Redis push and the signal run after the commit.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
    message_ids = [make_message_id(domain) for _ in p.recipients]
    with binding_cursor(connection) as cursor:
        cursor.execute(
            _INSERT_SQL_POSTGRESQL.format(
                email=quote(Email._meta.db_table), delivery=quote(Delivery._meta.db_table)
            ),
            {
                "subject": p.subject,
                "body": p.body,
                "html": p.html_message,
                "from": p.from_email,
                "reply_to": json.dumps(p.reply_to),
                "headers": json.dumps(p.headers),
                "now": now,
                "queued": Delivery.Status.QUEUED,
                "priority": p.priority,
                "max_attempts": p.max_attempts,
                "not_before": not_before,
                "recipients": p.recipients,
                "message_ids": message_ids,
            },
        )
        returned = cursor.fetchall()
    email_id = returned[0][1]
    email = _email(p, now)
    email.pk = email_id
    email._state.adding = False
    email._state.db = using
    ids = {message_id: pk for pk, _email, message_id in returned}
    # Model.from_db() with every field is Django's fast way to build instances
    # (no per-keyword work): it matters at 10,000 recipients.
    fields = Delivery._meta.concrete_fields
    names = [f.attname for f in fields]
    row: dict[str, Any] = {f.attname: f.get_default() for f in fields}
    row.update(
        email_id=email_id,
        status=Delivery.Status.QUEUED,
        priority=p.priority,
        max_attempts=p.max_attempts,
        not_before=not_before,
        created_at=now,
        updated_at=now,
    )
    template = [row[name] for name in names]
    slots = [names.index(name) for name in ("id", "recipient", "message_id")]
    cache = Delivery.email.field
    created = []
    for recipient, message_id in zip(p.recipients, message_ids, strict=True):
        values = template.copy()
        for slot, value in zip(slots, (ids[message_id], recipient, message_id), strict=True):
            values[slot] = value
        delivery = Delivery.from_db(using, names, values)
        cache.set_cached_value(delivery, email)
        created.append(delivery)
    at = not_before.timestamp()
    entries = [QueueEntry(d.pk, p.priority, at) for d in created]
    transaction.on_commit(partial(_after_commit, email, created, entries), using=using)
    return created


def _email(p: _Prepared, now: datetime) -> Email:
    return Email(
        subject=p.subject,
        body=p.body,
        html_message=p.html_message,
        from_email=p.from_email,
        reply_to=p.reply_to,
        headers=p.headers,
        created_at=now,
    )


def _existing(using: str, key: str, recipients: list[str]) -> dict[str, Delivery]:
    found: dict[str, Delivery] = {}
    for start in range(0, len(recipients), _IN_CHUNK):
        chunk = recipients[start : start + _IN_CHUNK]
        for delivery in Delivery.objects.using(using).filter(
            idempotency_key=key, recipient__in=chunk
        ):
            found[delivery.recipient] = delivery
    return found


def mirror(entries: list[QueueEntry]) -> bool:
    """Push rows to Redis, logging instead of raising when Redis is away.

    The rows are already committed, so losing this push loses no email: the
    sweeper mirrors every queued row that Redis does not hold.
    """
    try:
        RedisQueue().push(entries)
    except Exception:
        logger.warning(
            "Redis is unreachable; %d queued deliveries stay in the database until "
            "outbox_sweep mirrors them.",
            len(entries),
            exc_info=True,
        )
        return False
    return True


def _after_commit(email: Email, deliveries: list[Delivery], entries: list[QueueEntry]) -> None:
    mirror(entries)
    signals.email_enqueued.send_robust(sender=Email, email=email, deliveries=deliveries)
