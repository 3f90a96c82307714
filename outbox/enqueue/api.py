"""Put email in the outbox: one validated write path, two ways in.

``enqueue_email`` takes ``send_mail``-style arguments and gives each recipient
a copy addressed to them alone. The outbox email backend
(:class:`outbox.backends.OutboxBackend`) hands over Django ``EmailMessage``
objects through :func:`~outbox.enqueue.messages.prepare_message` and
:func:`write_prepared`: every envelope recipient (To, Cc and Bcc) gets one
delivery, and the message's structure is stored so that every copy is the
message Django would have sent (see :mod:`outbox.mail.message`).

Both paths validate everything before writing, write the rows in the caller's
transaction, and push ids to Redis only after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from django.db import IntegrityError, connections, router, transaction
from django.utils import timezone

from .. import signals
from ..db import database_now
from ..mail import valve
from ..mail.message_id import copy_message_ids, make_message_id, message_id_domain
from ..models import Attachment, Delivery, Email, EmailTemplate, epoch, outbox_alias
from ..queue.entries import QueueEntry
from ..queue.publish import publish
from ..rendering import TemplateCache, render
from ..suppression import bare_address, suppressed

# Re-exported: the validation step's public names, where callers found them.
from .prepare import Prepared, prepare
from .sql import insert_postgresql
from .turns import write_transaction

logger = logging.getLogger("outbox.enqueue")

# Chunk size of `recipient__in` look-ups (SQLite limits query parameters).
_IN_CHUNK = 500

_T = TypeVar("_T")


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
    expires_at: datetime | None = None,
    mailer: str | None = None,
    sensitive: bool = False,
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
    two calls race. Recipients are matched by address, however written
    ("Bob <bob@example.com>", "BOB@Example.com" and "bob@example.com" are one;
    see ``Delivery.recipient_key``).

    With ``expires_at`` (an aware datetime after now and after ``send_at``), a
    delivery not sent by then is never sent: it ends ``cancelled``. A
    recipient on the suppression list (:mod:`outbox.suppression`) gets a
    delivery that is ``cancelled`` at once and never pushed; so does one the
    staging valve stops (``OUTBOX["ALLOWED_RECIPIENTS"]`` without
    ``REDIRECT_TO``, :mod:`outbox.mail.valve`).

    With ``mailer`` (an alias of ``MAILERS`` on Django 6.1, else a key of
    ``OUTBOX["BACKENDS"]``), the worker delivers every copy through that
    backend instead of its default one (see :mod:`outbox.mail.mailers`); an
    unknown mailer is a ``ValidationError`` on ``mailer``.

    With ``sensitive=True`` (a password reset, a login code) the email's
    content is cleared at the sweeper's first pass after every delivery is
    settled, instead of after ``OUTBOX["CONTENT_RETENTION"]``; so is that of
    mail linking to a page named in ``OUTBOX["SENSITIVE_LINKS"]``
    (:mod:`outbox.enqueue.sensitive`). A settled row without content cannot
    be requeued.

    Raises :class:`~django.core.exceptions.ValidationError` naming the field for
    bad input (and :class:`TypeError` for a value of the wrong type) before
    anything is written.
    """
    prepared = prepare_email(
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
        expires_at=expires_at,
        mailer=mailer,
        sensitive=sensitive,
    )
    return write_one(prepared)


def enqueue_template(
    name: str,
    context: Mapping[str, Any],
    from_email: str | None,
    recipient_list: Sequence[str],
    *,
    language: str | None = None,
    reply_to: Sequence[str] | None = None,
    headers: dict[str, str] | None = None,
    attachments: Sequence[tuple[str, bytes | str, str | None]] | None = None,
    send_at: datetime | None = None,
    priority: str = "normal",
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    mailer: str | None = None,
    sensitive: bool = False,
) -> list[Delivery]:
    """Render the template ``name`` with ``context`` and queue the result.

    The template is looked up for ``language`` (default
    ``settings.LANGUAGE_CODE``) in the database, then in template files; see
    :mod:`outbox.rendering` for the order and the rendering rules. Every
    recipient gets the same rendered email (for one context per recipient, use
    :func:`outbox.enqueue_many`). The other arguments, the return value and
    the transactional behaviour are those of :func:`enqueue_email`.

    Raises :class:`~django.core.exceptions.ValidationError` naming the
    template and the part when it is missing, does not compile or fails to
    render, and nothing is written.
    """
    prepared = prepare_template(
        TemplateCache(router.db_for_read(EmailTemplate)),
        name,
        context,
        from_email,
        recipient_list,
        language=language,
        reply_to=reply_to,
        headers=headers,
        attachments=attachments,
        send_at=send_at,
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        expires_at=expires_at,
        mailer=mailer,
        sensitive=sensitive,
    )
    return write_one(prepared)


def prepare_email(
    subject: Any,
    message: Any,
    from_email: Any = None,
    recipient_list: Any = (),
    *,
    html_message: Any = None,
    reply_to: Any = None,
    headers: Any = None,
    attachments: Any = None,
    send_at: Any = None,
    priority: Any = "normal",
    idempotency_key: Any = None,
    max_attempts: Any = None,
    expires_at: Any = None,
    mailer: Any = None,
    sensitive: Any = False,
) -> Prepared:
    """Validate :func:`enqueue_email`'s arguments (with its defaults); write nothing."""
    return prepare(
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
        expires_at=expires_at,
        mailer=mailer,
        sensitive=sensitive,
    )


def prepare_template(
    cache: TemplateCache,
    name: Any,
    context: Any = None,
    from_email: Any = None,
    recipient_list: Any = (),
    *,
    language: Any = None,
    **options: Any,
) -> Prepared:
    """Render and validate :func:`enqueue_template`'s arguments; write nothing.

    The defaults (no context, ``DEFAULT_FROM_EMAIL``) serve ``enqueue_many``'s
    items, which may leave those keys out.
    """
    compiled = cache.get(name, language)
    subject, text, html = render(compiled, {} if context is None else context)
    return prepare_email(subject, text, from_email, recipient_list, html_message=html, **options)


def write_prepared(prepared: Sequence[Prepared]) -> list[list[Delivery]]:
    """Write validated emails in one transaction (a savepoint in the caller's)."""
    using = outbox_alias()
    with write_transaction(using):
        return [write_one(p) for p in prepared]


def write_one(p: Prepared) -> list[Delivery]:
    using = outbox_alias()
    now = timezone.now()
    not_before = p.send_at or now
    domain = message_id_domain(p.from_email)
    # Recipients the staging valve cancels (none while it is off): the
    # statement below knows only the suppression list, so they take this path.
    stopped = valve.refusals(p.recipients)
    if (
        p.idempotency_key is None
        and not p.attachments
        and not stopped
        and not p.sensitive  # the statement's function has no such argument
        and p.trace_context is None  # nor this one
        and connections[using].vendor == "postgresql"
    ):
        return _write_postgresql(p, using, now, not_before, domain)
    # One indexed query for every recipient of the call (on the PostgreSQL
    # path above it is part of the INSERT statement). A suppression's reason
    # wins over the valve's: it outlives the valve.
    # Each recipient's recipient_key: suppression and idempotency match on it.
    keys = [bare_address(r) for r in p.recipients]
    stopped.update(suppressed(using, keys))
    with write_transaction(using):
        db_now = database_now(using)
        if db_now is not None:
            # On PostgreSQL every time the row holds is the database's clock
            # (the statement path does the same): due now by the clock the
            # worker's claim reads, and ``updated_at`` on the clock of the
            # sweeper's incremental mirror check, whatever this host's says.
            now = db_now
            not_before = p.send_at or now
        existing: dict[str, Delivery] = {}
        if p.idempotency_key is not None:
            existing = _existing(using, p.idempotency_key, keys)
        missing = [(k, r) for r, k in zip(p.recipients, keys, strict=True) if k not in existing]
        if not missing:
            return [existing[k] for k in keys]

        email = _email(p, now)
        email.save(force_insert=True, using=using)
        if p.attachments:
            Attachment.objects.using(using).bulk_create(
                Attachment(
                    email=email,
                    name=f.name,
                    content=f.content,
                    mimetype=f.mimetype,
                    mime_part=f.mime_part,
                )
                for f in p.attachments
            )

        def deliveries(message_ids: list[str]) -> list[Delivery]:
            return [
                Delivery(
                    email=email,
                    recipient=recipient,
                    recipient_key=key,
                    status=Delivery.Status.CANCELLED if why else Delivery.Status.QUEUED,
                    last_error=why,
                    priority=p.priority,
                    max_attempts=p.max_attempts,
                    not_before=not_before,
                    expires_at=p.expires_at,
                    message_id=message_id,
                    idempotency_key=p.idempotency_key,
                    created_at=now,
                    updated_at=now,
                )
                for (key, recipient), message_id in zip(missing, message_ids, strict=True)
                for why in [stopped.get(key, "")]
            ]

        if p.idempotency_key is None:
            created = _with_message_ids(
                p,
                len(missing),
                domain,
                using,
                lambda ids: Delivery.objects.using(using).bulk_create(deliveries(ids)),
            )
        else:
            # A concurrent call with the same key may insert the same
            # (key, recipient_key) first: ON CONFLICT DO NOTHING waits for it
            # and skips (the unique constraint outbox_delivery_idempotency_key),
            # and the re-read below returns whichever row won.
            # (A sender's own Message-ID comes only from the drop-in backend,
            # which has no key: these IDs are all ours, unique.)
            rows = deliveries(_message_ids(p, len(missing), domain, using))
            Delivery.objects.using(using).bulk_create(rows, ignore_conflicts=True)
            existing = _existing(using, p.idempotency_key, keys)
            created = [d for d in existing.values() if d.email_id == email.pk]
            if not created:
                email.delete()

        if created:
            entries = queue_entries(created, not_before)
            transaction.on_commit(partial(_after_commit, email, created, entries), using=using)
    if p.idempotency_key is None:
        return created
    return [existing[k] for k in keys]


def _message_ids(p: Prepared, count: int, domain: str, using: str) -> list[str]:
    if p.message_id is None:
        return [make_message_id(domain) for _ in range(count)]
    taken = Delivery.objects.using(using).filter(message_id=p.message_id).exists()
    return copy_message_ids(p.message_id, count, domain, taken=taken)


def _with_message_ids(
    p: Prepared, count: int, domain: str, using: str, insert: Callable[[list[str]], _T]
) -> _T:
    """``insert(message_ids)`` with the Message-IDs of ``p``'s ``count`` copies.

    Only the sender's own ID, kept as it is, can be in the table already: a
    concurrent send of the same message may insert it between the check
    (:func:`_message_ids`) and this insert. The insert then waits for that
    transaction and, once it commits, fails on ``outbox_delivery_message_id_uniq``.
    So that the failure never reaches the caller (nor aborts the caller's
    transaction), that insert runs in a savepoint (a transaction of its own
    in autocommit), and after a failure the copy takes the ID a second send
    gets, as if the two had come one after the other. On SQLite the writes
    are serialised: the check already sees the first send's row.
    """
    message_ids = _message_ids(p, count, domain, using)
    if p.message_id is None or message_ids != [p.message_id]:
        return insert(message_ids)  # our own unique IDs: no conflict to fear
    try:
        with transaction.atomic(using=using):
            return insert(message_ids)
    except IntegrityError:
        if not Delivery.objects.using(using).filter(message_id=p.message_id).exists():
            raise  # another constraint's refusal
    return insert(copy_message_ids(p.message_id, count, domain, taken=True))


def _write_postgresql(
    p: Prepared,
    using: str,
    now: datetime,
    not_before: datetime,
    domain: str,
) -> list[Delivery]:
    """The common case (no idempotency key, no attachments) as one INSERT statement.

    Outside a transaction the statement is atomic on its own, so no
    BEGIN/COMMIT round trips are spent on it; inside one, it joins it. Either
    way the Redis push and the signal run after the commit.
    """
    email = _email(p, now)
    bare = [bare_address(r) for r in p.recipients]
    created = _with_message_ids(
        p,
        len(p.recipients),
        domain,
        using,
        lambda ids: insert_postgresql(p, email, ids, bare, using=using, not_before=not_before),
    )
    # Due now by the database's clock: due now by Redis' too (this host's clock may be ahead).
    entries = queue_entries(created, p.send_at)
    transaction.on_commit(partial(_after_commit, email, created, entries), using=using)
    return created


def queue_entries(deliveries: Sequence[Delivery], not_before: datetime | None) -> list[QueueEntry]:
    """What to push after the commit: only queued rows (a suppressed one is cancelled).

    ``not_before`` None: the rows are due now (the database wrote its own now()).
    """
    at = 0.0 if not_before is None else epoch(not_before)
    queued = Delivery.Status.QUEUED
    return [QueueEntry(d.pk, d.priority, at) for d in deliveries if d.status == queued]


def _email(p: Prepared, now: datetime) -> Email:
    return Email(
        subject=p.subject,
        body=p.body,
        html_message=p.html_message,
        from_email=p.from_email,
        reply_to=p.reply_to,
        headers=p.headers,
        mailer=p.mailer,
        structure=p.structure,
        sensitive=p.sensitive,
        trace_context=p.trace_context,
        created_at=now,
    )


def _existing(using: str, key: str, recipient_keys: list[str]) -> dict[str, Delivery]:
    """The deliveries already made under idempotency key ``key``, by recipient_key.

    Matched on the normalised address, not on the recipient as written: a
    retry that writes "Bob <bob@example.com>" or "BOB@Example.com" for
    "bob@example.com" finds the first call's row.
    """
    found: dict[str, Delivery] = {}
    for start in range(0, len(recipient_keys), _IN_CHUNK):
        chunk = recipient_keys[start : start + _IN_CHUNK]
        for delivery in Delivery.objects.using(using).filter(
            idempotency_key=key, recipient_key__in=chunk
        ):
            found[delivery.recipient_key] = delivery
    return found


def _after_commit(email: Email, deliveries: list[Delivery], entries: list[QueueEntry]) -> None:
    publish(entries)
    signals.email_enqueued.send_robust(sender=Email, email=email, deliveries=deliveries)
