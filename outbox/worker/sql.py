"""The worker's statements, and the mapping of their rows, for each database.

What runs once per email is raw SQL: the ORM's query building costs more CPU
than the round trip. Each statement is still one conditional write, and every
status test repeats the state the row must be in, so a stale id or a late
worker changes nothing.

Whether a row is due is decided by the database's own clock (``{db_now}``:
``now()`` on PostgreSQL; SQLite has no server clock, so there it is Redis
time), never by the worker host's clock; see ``outbox/clock.py``. Times the
worker writes (``%(now)s``) are Redis time from its RedisClock.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models.functions import Now

from ..conf import outbox_settings
from ..db import binding_cursor
from ..models import Attachment, Delivery, Email

Status = Delivery.Status

# The clock that decides whether a row is due, as each vendor writes it in SQL.
# PostgreSQL: the server's own clock. SQLite has no server: its "now" would be
# the clock of whichever host runs the statement, so the worker passes Redis
# time instead (%(now)s), the clock that also promoted the id.
_DB_NOW = {
    "postgresql": "now()",
}

# Each finds its row by primary key. The status test is written as
# ``(status = ...) IS TRUE``, which no index can serve, because PostgreSQL
# otherwise may plan it on a partial index of queued rows when its statistics
# say few rows are queued (a new table, or one analysed just after a drain):
# each claim would then scan every queued row, and a burst of n emails would
# cost O(n^2).

# Step 4 for a success and step 2, with named parameters (``_params``); used
# alone, and together in the PostgreSQL step statement below.
_SENT_SQL = """
UPDATE {delivery} SET status = %(sent)s, sent_at = %(now)s, updated_at = %(now)s,
    last_error = ''
WHERE id = %(settle_id)s AND (status = %(processing)s) IS TRUE
    AND claim_token = %(settle_token)s
"""

# A row whose ``expires_at`` has passed is claimed into ``cancelled`` instead
# of ``processing`` (the same one conditional UPDATE, by the same clock as the
# due test), without counting an attempt; its status, last in RETURNING, tells
# the loop to drop it unsent.
_CLAIM_SQL = """
UPDATE {delivery} SET
    status = CASE WHEN expires_at <= {db_now} THEN %(cancelled)s ELSE %(processing)s END,
    last_error = CASE WHEN expires_at <= {db_now} THEN %(expired)s ELSE last_error END,
    worker_id = %(worker)s,
    claim_token = %(token)s, processing_started_at = %(now)s, updated_at = %(now)s,
    attempts = attempts + CASE WHEN expires_at <= {db_now} THEN 0 ELSE 1 END
WHERE id = %(claim_id)s AND (status = %(queued)s) IS TRUE AND not_before <= {db_now}
RETURNING email_id, recipient, priority, attempts, max_attempts, message_id, status
"""

# PostgreSQL: the success of the previous message (if any), the claim of the
# next one and the next one's content, in one statement. A statement run in
# autocommit is its own transaction, so both UPDATEs commit together or not at
# all. They touch different rows; a CTE's RETURNING is all the SELECT reads.
# The email's content is skipped when the worker has it cached (%(known)s).
_STEP_SQL_POSTGRESQL = (
    "WITH settled AS ("
    + _SENT_SQL
    + "RETURNING id\n), claimed AS ("
    + _CLAIM_SQL
    + """)
SELECT (SELECT count(*) FROM settled),
    c.email_id, c.recipient, c.priority, c.attempts, c.max_attempts, c.message_id,
    e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers,
    EXISTS (SELECT 1 FROM {attachment} a WHERE a.email_id = e.id),
    c.status
FROM (VALUES (1)) AS one
LEFT JOIN claimed c ON true
LEFT JOIN {email} e ON e.id = c.email_id AND e.id <> %(known)s
"""
)

# The same step through the PL/pgSQL function of outbox/plpgsql.py, whose
# statements keep their plans for the life of the connection: at Django's
# defaults this saves the planning the statement above pays on every call.
# Same parameters, same row.
_STEP_CALL_POSTGRESQL = """
SELECT * FROM outbox_step(%(settle_id)s, %(settle_token)s, %(claim_id)s, %(worker)s, %(token)s,
    %(now)s, %(known)s, %(expired)s)
"""

# SQLite: the claim returns the email's content too, as one JSON array built by
# a subquery (SQLite has no data-modifying CTE), unless the worker has it cached.
# The attachments test is inside it, so the whole step is two statements.
_CLAIM_SQL_SQLITE = (
    _CLAIM_SQL.rstrip()
    + """,
    CASE WHEN email_id = %(known)s THEN NULL ELSE (
        SELECT json_array(e.subject, e.body, e.html_message, e.from_email, json(e.reply_to),
            json(e.headers), EXISTS (SELECT 1 FROM {attachment} a WHERE a.email_id = e.id))
        FROM {email} e WHERE e.id = email_id
    ) END
"""
)

_EMAIL_SQL = """
SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers,
    EXISTS (SELECT 1 FROM {attachment} a WHERE a.email_id = e.id)
FROM {email} e WHERE e.id = %s
"""


class ClaimedRow(NamedTuple):
    delivery: Delivery
    email: Email | None  # None: not read with the claim (cached, or SQLite)
    has_attachments: bool
    expired: bool = False  # claimed into `cancelled`: drop it, never send it


# The last_error of a row the claim found expired.
EXPIRED_ERROR = "expired: not sent before its expires_at; cancelled at claim"


def sql_text(template: str) -> str:
    return _sql_for_vendor(template, connection.vendor)


@functools.cache
def _sql_for_vendor(template: str, vendor: str) -> str:
    # Formatted once per statement, not once per email.
    quote = connection.ops.quote_name
    return template.format(
        db_now=_DB_NOW.get(vendor, "%(now)s"),
        delivery=quote(Delivery._meta.db_table),
        email=quote(Email._meta.db_table),
        attachment=quote(Attachment._meta.db_table),
    )


def _params(
    now: datetime,
    *,
    settle_id: int | None = None,
    settle_token: uuid.UUID | None = None,
    claim_id: int | None = None,
    worker: str = "",
    token: uuid.UUID | None = None,
    known: int = 0,
) -> dict[str, Any]:
    """The named parameters of the statements above, adapted for this database."""
    claim_token = Delivery._meta.get_field("claim_token")
    return {
        "sent": Status.SENT,
        "processing": Status.PROCESSING,
        "queued": Status.QUEUED,
        "cancelled": Status.CANCELLED,
        "expired": EXPIRED_ERROR,
        "now": connection.ops.adapt_datetimefield_value(now),
        "settle_id": settle_id,
        "settle_token": claim_token.get_db_prep_value(settle_token, connection),
        "claim_id": claim_id,
        "worker": worker,
        "token": claim_token.get_db_prep_value(token, connection),
        "known": known,
    }


def _delivery(
    pk: int, worker_id: str, token: uuid.UUID, now: datetime, row: Sequence[Any]
) -> Delivery:
    """The claimed row as the worker needs it, from the RETURNING columns."""
    email_id, recipient, priority, attempts, max_attempts, message_id = row
    return Delivery(
        pk=pk,
        email_id=email_id,
        recipient=recipient,
        priority=priority,
        attempts=attempts,
        max_attempts=max_attempts,
        message_id=message_id,
        status=Status.PROCESSING,
        worker_id=worker_id,
        claim_token=token,
        processing_started_at=now,
    )


def _email_from(pk: int, row: Sequence[Any]) -> Email:
    subject, body, html_message, from_email, reply_to, headers = row
    return Email(
        pk=pk,
        subject=subject,
        body=body,
        html_message=html_message,
        from_email=from_email,
        reply_to=_json(reply_to),
        headers=_json(headers),
    )


def claim_row(pk: int, worker_id: str, token: uuid.UUID, now: datetime) -> ClaimedRow | None:
    """The conditional UPDATE of step 2 with RETURNING (PostgreSQL, SQLite >= 3.35).

    Returns the claimed row (the fields the worker needs), or None if the row
    was not queued and due.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql_text(_CLAIM_SQL), _params(now, claim_id=pk, worker=worker_id, token=token)
        )
        row = cursor.fetchone()
    if row is None:
        return None
    expired = row[6] == Status.CANCELLED
    return ClaimedRow(_delivery(pk, worker_id, token, now, row[:6]), None, False, expired)


def step_postgresql(
    settle: tuple[int, uuid.UUID] | None,
    claim_id: int | None,
    worker_id: str,
    token: uuid.UUID,
    now: datetime,
    known_email: int,
) -> tuple[int, ClaimedRow | None]:
    """Record a success and claim the next row in one statement (PostgreSQL).

    Returns how many rows the success UPDATE changed and the claimed row (with
    its email's content unless it is ``known_email``), or None.
    """
    statement = (
        _STEP_CALL_POSTGRESQL if outbox_settings.POSTGRESQL_FUNCTIONS else _STEP_SQL_POSTGRESQL
    )
    with binding_cursor(connection) as cursor:
        cursor.execute(
            sql_text(statement),
            _params(
                now,
                settle_id=settle[0] if settle is not None else None,
                settle_token=settle[1] if settle is not None else None,
                claim_id=claim_id,
                worker=worker_id,
                token=token,
                known=known_email,
            ),
        )
        row = cursor.fetchone()
    assert row is not None  # the SELECT always returns its one row
    settled = int(row[0])
    if row[1] is None:
        return settled, None
    assert claim_id is not None  # a claimed row came back
    delivery = _delivery(claim_id, worker_id, token, now, row[1:7])
    expired = row[14] == Status.CANCELLED
    if row[7] is None or expired:
        return settled, ClaimedRow(delivery, None, False, expired)
    return settled, ClaimedRow(delivery, _email_from(row[1], row[7:13]), bool(row[13]))


def step_sqlite(
    settle: tuple[int, uuid.UUID] | None,
    claim_id: int | None,
    worker_id: str,
    token: uuid.UUID,
    now: datetime,
    known_email: int,
) -> tuple[int, ClaimedRow | None]:
    """Record a success and claim the next row in one transaction (SQLite).

    The same contract as :func:`step_postgresql`. It runs on the DB-API
    connection with its own BEGIN IMMEDIATE ... COMMIT: Django's atomic() and
    cursor wrappers cost more Python than the two statements, and this is the
    only write of a delivered email. Errors still surface as Django's
    DatabaseError, and a failed transaction is rolled back whole.
    """
    params = _params(
        now,
        settle_id=settle[0] if settle is not None else None,
        settle_token=settle[1] if settle is not None else None,
        claim_id=claim_id,
        worker=worker_id,
        token=token,
        known=known_email,
    )
    connection.ensure_connection()
    raw = connection.connection
    settled, row = 0, None
    with connection.wrap_database_errors:
        cursor = raw.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            if settle is not None:
                cursor.execute(_sqlite_text(_SENT_SQL), params)
                settled = cursor.rowcount
            if claim_id is not None:
                cursor.execute(_sqlite_text(_CLAIM_SQL_SQLITE), params)
                row = cursor.fetchone()
            cursor.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:
                raw.rollback()
            raise
        finally:
            cursor.close()
    if row is None:
        return settled, None
    assert claim_id is not None
    delivery = _delivery(claim_id, worker_id, token, now, row[:6])
    expired = row[6] == Status.CANCELLED
    if row[7] is None or expired:
        return settled, ClaimedRow(delivery, None, False, expired)
    content = json.loads(row[7])
    return settled, ClaimedRow(delivery, _email_from(row[0], content[:6]), bool(content[6]))


@functools.cache
def _sqlite_text(template: str) -> str:
    # The DB-API's own placeholders (:name), as Django's SQLite cursor would write them.
    names = _params(datetime(2000, 1, 1)).keys()
    return _sql_for_vendor(template, "sqlite") % {name: f":{name}" for name in names}


def mark_sent(pk: int, token: uuid.UUID, now: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql_text(_SENT_SQL), _params(now, settle_id=pk, settle_token=token))
        return int(cursor.rowcount)


def load_email(email_id: int) -> tuple[Email, bool]:
    """The email's content and whether it has attachments, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(sql_text(_EMAIL_SQL), [email_id])
        row = cursor.fetchone()
    if row is None:
        raise Email.DoesNotExist(f"email {email_id} is gone")
    return _email_from(email_id, row[:6]), bool(row[6])


def _json(value: Any) -> Any:
    # A raw cursor gets JSON columns as text on PostgreSQL (Django's loader) and SQLite.
    return json.loads(value) if isinstance(value, str | bytes) else value


def due_clock(redis_now: datetime) -> Now | datetime:
    """The clock of the claim statement's due test, for an ORM filter.

    The same rule as ``{db_now}`` above: the database's clock on PostgreSQL,
    Redis time (passed in) elsewhere.
    """
    return Now() if connection.vendor in _DB_NOW else redis_now
