"""The PostgreSQL fast path of :mod:`outbox.api`: an email and its deliveries in one statement.

Only the writing lives here: :func:`outbox.api.enqueue_email` decides when the
path applies (no idempotency key, no attachments), makes the Message-IDs and
schedules the Redis push and the signal for after the commit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections

from .db import binding_cursor
from .models import Delivery, Email
from .prepare import Prepared

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


def insert_postgresql(
    p: Prepared,
    email: Email,
    message_ids: Sequence[str],
    *,
    using: str,
    now: datetime,
    not_before: datetime,
) -> list[Delivery]:
    """Insert ``email`` (unsaved) and one delivery per recipient; return the deliveries.

    ``message_ids`` pairs with ``p.recipients``. ``email`` becomes the saved
    row (its ``pk`` set) and is cached on every delivery returned.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
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
                "message_ids": list(message_ids),
            },
        )
        returned = cursor.fetchall()
    email_id = returned[0][1]
    email.pk = email_id
    email._state.adding = False
    email._state.db = using
    ids = {message_id: pk for pk, _email, message_id in returned}
    return _deliveries(p, email, message_ids, ids, using=using, now=now, not_before=not_before)


def _deliveries(
    p: Prepared,
    email: Email,
    message_ids: Sequence[str],
    ids: dict[str, int],
    *,
    using: str,
    now: datetime,
    not_before: datetime,
) -> list[Delivery]:
    """The inserted rows as Delivery instances, without reading them back."""
    # Model.from_db() with every field is Django's fast way to build instances
    # (no per-keyword work): it matters at 10,000 recipients.
    fields = Delivery._meta.concrete_fields
    names = [f.attname for f in fields]
    row: dict[str, Any] = {f.attname: f.get_default() for f in fields}
    row.update(
        email_id=email.pk,
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
    return created
