"""The raw-SQL writes of enqueueing: ``enqueue_email`` on PostgreSQL, and ``enqueue_many``.

The statements are in ``outbox/statements/``; this runs them and builds the
rows' model instances without reading them back. Only the writing lives here:
:mod:`outbox.enqueue.api` and :mod:`outbox.enqueue.bulk` decide when a path applies (no
idempotency key, no attachments), make the Message-IDs and schedule the Redis
push and the signal for after the commit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections

from ..compat.django import mark_saved
from ..db import binding_cursor, loaded_instance, rows_by_name
from ..models import Delivery, Email, instant, stored
from ..statements import postgresql, sqlite
from .prepare import Prepared


def insert_postgresql(
    p: Prepared,
    email: Email,
    message_ids: Sequence[str],
    bare: Sequence[str],
    *,
    using: str,
    not_before: datetime,
) -> list[Delivery]:
    """Insert ``email`` (unsaved) and one delivery per recipient; return the deliveries.

    ``message_ids`` and ``bare`` (the lower-cased addresses the suppression
    list is matched on) pair with ``p.recipients``. ``email`` becomes the saved
    row (its ``pk`` set) and is cached on every delivery returned. The rows'
    times are the database's ``now()``, never this host's (see the statements).
    """
    params: dict[str, Any] = {
        "subject": p.subject,
        "body": p.body,
        "html": p.html_message,
        "from": p.from_email,
        "reply_to": json.dumps(p.reply_to) if p.reply_to else "[]",
        "headers": json.dumps(p.headers) if p.headers else "{}",
        # Instants, aware: psycopg sends the offset (a naive value would be read
        # in the session's zone, once for a repeated hour's two times).
        "expires_at": instant(p.expires_at) if p.expires_at else None,
        "priority": p.priority,
        "max_attempts": p.max_attempts,
        # NULL when due now: the statement writes the database's now() (its clock,
        # not this host's); an explicit send_at is the caller's own time.
        "not_before": instant(p.send_at) if p.send_at else None,
        "mailer": p.mailer,
        "structure": None if p.structure is None else json.dumps(p.structure),
    }
    with binding_cursor(connections[using]) as cursor:
        if len(p.recipients) == 1:
            params.update(recipient=p.recipients[0], message_id=message_ids[0], bare=bare[0])
            cursor.execute(postgresql.ENQUEUE_ONE_CALL, params)
            one = rows_by_name.one(EnqueuedOne, cursor, cursor.fetchone())
            # outbox_enqueue_one() returns an array (its type is fixed by its migration).
            pk, email_id, reason = one.enqueued
            returned = [
                Inserted(
                    id=int(pk),
                    message_id=message_ids[0],
                    email_id=int(email_id),
                    last_error=reason,
                    now=one.now,
                )
            ]
        else:
            params.update(
                recipients=p.recipients,
                message_ids=list(message_ids),
                bare=list(bare),
            )
            cursor.execute(postgresql.ENQUEUE_CALL, params)
            returned = rows_by_name.all(Inserted, cursor, cursor.fetchall())
    email.pk = returned[0].email_id
    now = returned[0].now  # the database's now(), which the rows hold
    assert now is not None  # every PostgreSQL enqueue statement returns it
    email.created_at = now
    mark_saved(email, using)
    ids = {row.message_id: row.id for row in returned}
    reasons = {row.message_id: row.last_error for row in returned}
    why = [reasons[m] for m in message_ids]
    if p.send_at is None:
        not_before = now  # the database's now(), which the rows hold
    return _deliveries(
        p, email, message_ids, bare, why, ids, using=using, now=now, not_before=not_before
    )


@functools.cache
def _delivery_defaults() -> dict[str, Any]:
    """Delivery's fields with the defaults of those the insert does not set.

    The fields whose default is callable (the timestamps) are always set by
    the caller, so the defaults are computed once, not once per call.
    """
    fields = Delivery._meta.concrete_fields
    return {f.attname: None if callable(f.default) else f.get_default() for f in fields}


def _deliveries(
    p: Prepared,
    email: Email,
    message_ids: Sequence[str],
    keys: Sequence[str],
    why: Sequence[str],
    ids: dict[str, int],
    *,
    using: str,
    now: datetime,
    not_before: datetime,
) -> list[Delivery]:
    """The inserted rows as Delivery instances, without reading them back.

    ``keys``: each recipient's ``recipient_key`` (``validation.bare_address``).
    """
    template = dict(_delivery_defaults())
    template.update(
        email_id=email.pk,
        status=Delivery.Status.QUEUED,
        priority=p.priority,
        max_attempts=p.max_attempts,
        not_before=not_before,
        expires_at=p.expires_at,
        created_at=now,
        updated_at=now,
    )
    cancelled = Delivery.Status.CANCELLED
    cache = Delivery.email.field
    created = []
    for recipient, message_id, key, reason in zip(
        p.recipients, message_ids, keys, why, strict=True
    ):
        values = template.copy()
        values.update(
            id=ids[message_id], recipient=recipient, recipient_key=key, message_id=message_id
        )
        if reason:
            values.update(status=cancelled, last_error=reason)
        delivery = loaded_instance(Delivery, values, using)
        cache.set_cached_value(delivery, email)
        created.append(delivery)
    return created


class Inserted(NamedTuple):
    """A row an enqueue statement returns (``RETURNING``), read by column name.

    Each statement returns the columns it has: ``id`` always, the others where
    it says (``message_id`` matches a delivery back to its recipient).
    """

    id: int
    message_id: str = ""
    email_id: int = 0
    last_error: str = ""  # why the recipient is suppressed, or ""
    now: datetime | None = None  # the database's now(), which the rows hold


class EnqueuedOne(NamedTuple):
    """``ENQUEUE_ONE_CALL``'s row: the function's array (id, email id, why) and now()."""

    enqueued: list[str]
    now: datetime


# -- enqueue_many: a chunk of emails and all their deliveries --------------------------


class BulkRow(NamedTuple):
    """One validated item of :func:`outbox.enqueue_many`, with what the write adds."""

    prepared: Prepared
    not_before: datetime
    message_ids: list[str]
    keys: list[str]  # per recipient: its recipient_key (validation.bare_address)
    why: list[str]  # per recipient: why it is suppressed, or ""


def insert_many(
    rows: Sequence[BulkRow], *, using: str, now: datetime
) -> tuple[list[Email], list[list[Delivery]]]:
    """Insert one email per row and its deliveries; return both, in row order."""
    connection = connections[using]
    emails = [
        Email(
            subject=r.prepared.subject,
            body=r.prepared.body,
            html_message=r.prepared.html_message,
            from_email=r.prepared.from_email,
            reply_to=r.prepared.reply_to,
            headers=r.prepared.headers,
            mailer=r.prepared.mailer,
            trace_context=r.prepared.trace_context,
            created_at=now,
        )
        for r in rows
    ]
    with binding_cursor(connection) as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(postgresql.ENQUEUE_MANY, _postgresql_params(rows))
            returned = rows_by_name.all(Inserted, cursor, cursor.fetchall())
            email_ids = {row.message_id: row.email_id for row in returned}
            # now(): what every row's times hold, and rows due now their not_before.
            db_now = returned[0].now
            assert db_now is not None  # ENQUEUE_MANY returns it
            now = db_now
            for email, r in zip(emails, rows, strict=True):
                email.pk = email_ids[r.message_ids[0]]
                email.created_at = now
        else:
            ops = connection.ops
            at = ops.adapt_datetimefield_value(now)
            cursor.execute(sqlite.ENQUEUE_MANY_EMAILS, [at, _emails_json(rows)])
            inserted = rows_by_name.all(Inserted, cursor, cursor.fetchall())
            for email, pk in zip(emails, sorted(row.id for row in inserted), strict=True):
                email.pk = pk
            cursor.execute(
                sqlite.ENQUEUE_MANY_DELIVERIES,
                [
                    Delivery.Status.QUEUED,
                    Delivery.Status.CANCELLED,
                    at,
                    at,
                    _deliveries_json(
                        rows, emails, functools.partial(stored, connection=connection)
                    ),
                ],
            )
            returned = rows_by_name.all(Inserted, cursor, cursor.fetchall())
            db_now = None
    ids = {row.message_id: row.id for row in returned}
    deliveries = []
    for email, r in zip(emails, rows, strict=True):
        mark_saved(email, using)
        deliveries.append(
            _deliveries(
                r.prepared,
                email,
                r.message_ids,
                r.keys,
                r.why,
                ids,
                using=using,
                now=now,
                not_before=r.not_before
                if db_now is None or r.prepared.send_at is not None
                else db_now,
            )
        )
    return emails, deliveries


def _postgresql_params(rows: Sequence[BulkRow]) -> dict[str, Any]:
    ps = [r.prepared for r in rows]
    contexts = [p.trace_context for p in ps]
    per_delivery: dict[str, list[Any]] = {
        name: []
        for name in (
            "items",
            "recipients",
            "keys",
            "message_ids",
            "why",
            "priorities",
            "max_attempts",
            "not_befores",
            "expires",
        )
    }
    for item, r in enumerate(rows, start=1):
        p = r.prepared
        n = len(p.recipients)
        per_delivery["items"] += [item] * n
        per_delivery["recipients"] += p.recipients
        per_delivery["keys"] += r.keys
        per_delivery["message_ids"] += r.message_ids
        per_delivery["why"] += r.why
        per_delivery["priorities"] += [p.priority] * n
        per_delivery["max_attempts"] += [p.max_attempts] * n
        # NULL: the database's now(); else instants, as in insert_postgresql.
        per_delivery["not_befores"] += [instant(p.send_at) if p.send_at else None] * n
        per_delivery["expires"] += [instant(p.expires_at) if p.expires_at else None] * n
    return {
        "email_table": Email._meta.db_table,
        "count": len(rows),
        "subjects": [p.subject for p in ps],
        "bodies": [p.body for p in ps],
        "htmls": [p.html_message for p in ps],
        "senders": [p.from_email for p in ps],
        "reply_tos": [json.dumps(p.reply_to) for p in ps],
        "headers": [json.dumps(p.headers) for p in ps],
        "mailers": [p.mailer for p in ps],
        "trace_contexts": [None if c is None else json.dumps(c) for c in contexts],
        "queued": Delivery.Status.QUEUED,
        "cancelled": Delivery.Status.CANCELLED,
        **per_delivery,
    }


def _emails_json(rows: Sequence[BulkRow]) -> str:
    return json.dumps(
        [
            [
                r.prepared.subject,
                r.prepared.body,
                r.prepared.html_message,
                r.prepared.from_email,
                json.dumps(r.prepared.reply_to),
                json.dumps(r.prepared.headers),
                r.prepared.mailer,
                r.prepared.trace_context,  # an object, or null: stored as its JSON
            ]
            for r in rows
        ]
    )


def _deliveries_json(rows: Sequence[BulkRow], emails: Sequence[Email], adapt: Any) -> str:
    out = []
    for r, email in zip(rows, emails, strict=True):
        p = r.prepared
        not_before = adapt(r.not_before)
        expires = adapt(p.expires_at) if p.expires_at is not None else None
        for recipient, message_id, key, why in zip(
            p.recipients, r.message_ids, r.keys, r.why, strict=True
        ):
            out.append(
                [
                    email.pk,
                    recipient,
                    message_id,
                    why,
                    p.priority,
                    p.max_attempts,
                    not_before,
                    expires,
                    key,
                ]
            )
    return json.dumps(out)
