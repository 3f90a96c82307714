"""The worker's statements run, for each database (``outbox.worker.rows`` maps their rows).

What runs once per email is raw SQL: the ORM's query building costs more CPU
than the round trip. The statements themselves, with the rules they keep, are
in :mod:`outbox.statements.postgresql` and :mod:`outbox.statements.sqlite`, and those that
write a status are rendered from the table by :mod:`outbox.transitions.hotpath`
(all of them, as SQL: ``outbox/transitions/sql/``): each is one
conditional write that repeats the state the row must be in, so a stale id or
a late worker changes nothing. Whether a row is due is decided by the
database's own clock on PostgreSQL and by Redis time on SQLite, never by the
worker host's clock; times the worker writes are Redis time from its
RedisClock (see :class:`~outbox.queue.clock.RedisClock`).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import Any, NamedTuple

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F
from django.db.models.functions import Now

from .. import transitions
from ..db import binding_cursor, rows_by_name
from ..models import Delivery, Email, epoch, outbox_alias, stored
from ..queue.entries import QueueEntry
from ..statements import postgresql, sqlite
from ..transitions import hotpath
from .rows import (
    CompanionColumns,
    ContentColumns,
    MarkColumns,
    MarkedRow,
    StepColumns,
    delivery_from,
    email_from,
)

Status = Delivery.Status


# The last_error of a row the claim found expired.
EXPIRED_ERROR = "expired: not sent before its expires_at; cancelled at claim"


def _db() -> BaseDatabaseWrapper:
    """This thread's connection to the outbox's database (``outbox_alias``)."""
    return connections[outbox_alias()]


def _statements(db: BaseDatabaseWrapper) -> ModuleType:
    """The statements of ``db``: PostgreSQL's, or SQLite's (which take the clock)."""
    return postgresql if db.vendor == "postgresql" else sqlite


def _params(
    db: BaseDatabaseWrapper,
    now: datetime,
    *,
    settle_id: int | None = None,
    settle_token: uuid.UUID | None = None,
    claim_id: int | None = None,
    worker: str = "",
    token: uuid.UUID | None = None,
    known: int = 0,
) -> dict[str, Any]:
    """The named parameters of the statements above, adapted for ``db``."""
    claim_token = Delivery._meta.get_field("claim_token")
    return {
        "expired": EXPIRED_ERROR,
        "now": db.ops.adapt_datetimefield_value(now),
        "now_instant": stored(now, db),  # the due and expiry tests (SQLite)
        "settle_id": settle_id,
        "settle_token": claim_token.get_db_prep_value(settle_token, db),
        "claim_id": claim_id,
        "worker": worker,
        "token": claim_token.get_db_prep_value(token, db),
        "known": known,
    }


def mark_row(pk: int, worker_id: str, token: uuid.UUID, now: datetime) -> MarkedRow | None:
    """The conditional UPDATE of step 2 with RETURNING (PostgreSQL, SQLite >= 3.35).

    Returns the marked row (the fields the worker needs), or None if the row
    was not queued and due.
    """
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(
            hotpath.mark(db.vendor), _params(db, now, claim_id=pk, worker=worker_id, token=token)
        )
        found = cursor.fetchone()
        if found is None:
            return None
        row = rows_by_name.one(MarkColumns, cursor, found)
    expired = row.status == Status.CANCELLED
    delivery = delivery_from(pk, worker_id, token, now, row, db.alias)
    return MarkedRow(delivery, None, False, expired)


class Step(NamedTuple):
    """One thread's step: the success to record (if any) and the row to claim."""

    settle: tuple[int, uuid.UUID] | None  # (row, its claim token): mark it sent
    claim_id: int | None
    worker_id: str
    token: uuid.UUID  # the claim token of this attempt
    now: datetime  # Redis time
    known_email: int  # the email whose content the thread has (0: none)


StepResult = tuple[int, MarkedRow | None]  # rows the success changed, the claimed row


def run_steps(steps: Sequence[Step], db: BaseDatabaseWrapper | None = None) -> list[StepResult]:
    """Run several threads' steps in one transaction: one commit for all of them.

    Each step is still its own pair of conditional UPDATEs, so the result of
    each is what it would have been alone (a row claimed twice in one batch
    goes to one of them only). The transaction is atomic: if it fails, no step
    happened, and every thread retries its own with the same tokens. Raises
    DatabaseError. ``db``: the connection to use (the worker's step
    connection); this thread's own to the outbox's database by default.
    """
    db = db if db is not None else _db()
    if db.vendor == "sqlite":
        return _steps_sqlite(steps, db)
    if len(steps) == 1:
        return [_step_postgresql(steps[0], db)]
    return _steps_postgresql(steps, db)


def _step_postgresql(step: Step, db: BaseDatabaseWrapper) -> StepResult:
    with binding_cursor(db) as cursor:
        cursor.execute(postgresql.STEP_CALL, _step_params(step, db))
        found = cursor.fetchone()
        assert found is not None  # the SELECT always returns its one row
        row = rows_by_name.one(StepColumns, cursor, found)
    return _step_result(step, row, db.alias)


def _steps_postgresql(steps: Sequence[Step], db: BaseDatabaseWrapper) -> list[StepResult]:
    # One statement, so one transaction: outbox_steps(), a row per step, in order.
    with binding_cursor(db) as cursor:
        cursor.execute(
            postgresql.STEPS_CALL,
            {
                "settle_ids": [s.settle[0] if s.settle else None for s in steps],
                "settle_tokens": [s.settle[1] if s.settle else None for s in steps],
                "claim_ids": [s.claim_id for s in steps],
                "workers": [s.worker_id for s in steps],
                # psycopg takes UUIDs and aware datetimes as they are.
                "tokens": [s.token for s in steps],
                "nows": [s.now for s in steps],
                "knowns": [s.known_email for s in steps],
                "expired": EXPIRED_ERROR,
            },
        )
        rows = rows_by_name.all(StepColumns, cursor, cursor.fetchall())
    assert len(rows) == len(steps)  # one row per step, in order
    return [_step_result(step, row, db.alias) for step, row in zip(steps, rows, strict=True)]


def _step_params(step: Step, db: BaseDatabaseWrapper) -> dict[str, Any]:
    return _params(
        db,
        step.now,
        settle_id=step.settle[0] if step.settle is not None else None,
        settle_token=step.settle[1] if step.settle is not None else None,
        claim_id=step.claim_id,
        worker=step.worker_id,
        token=step.token,
        known=step.known_email,
    )


def _step_result(step: Step, row: StepColumns, using: str) -> StepResult:
    """A step's row (``outbox_step``'s columns) as the worker needs it."""
    settled = int(row.settled)
    if row.email_id is None:
        return settled, None
    assert step.claim_id is not None  # a claimed row came back
    delivery = delivery_from(step.claim_id, step.worker_id, step.token, step.now, row, using)
    expired = row.claimed_status == Status.CANCELLED
    if row.subject is None or expired:
        return settled, MarkedRow(delivery, None, False, expired)
    email = email_from(row.email_id, row, using)
    return settled, MarkedRow(delivery, email, bool(row.has_attachments))


def _steps_sqlite(steps: Sequence[Step], db: BaseDatabaseWrapper) -> list[StepResult]:
    """The steps in one transaction on SQLite.

    The same contract as :func:`run_steps`. It runs on the DB-API connection
    with its own BEGIN IMMEDIATE ... COMMIT: Django's atomic() and cursor
    wrappers cost more Python than the statements, and this is the only write
    of a delivered email. Errors still surface as Django's DatabaseError, and
    a failed transaction is rolled back whole.
    """
    db.ensure_connection()
    raw = db.connection
    found: list[tuple[int, MarkColumns | None]] = []
    with db.wrap_database_errors:
        cursor = raw.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            for step in steps:
                params = _step_params(step, db)
                settled, row = 0, None
                if step.settle is not None:
                    cursor.execute(_dbapi_text(hotpath.sent("sqlite")), params)
                    settled = cursor.rowcount
                if step.claim_id is not None:
                    cursor.execute(_dbapi_text(hotpath.mark("sqlite")), params)
                    claimed = cursor.fetchone()
                    if claimed is not None:
                        row = rows_by_name.one(MarkColumns, cursor, claimed)
                found.append((settled, row))
            cursor.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:
                raw.rollback()
            raise
        finally:
            cursor.close()
    return [
        _sqlite_result(step, settled, row, db.alias)
        for step, (settled, row) in zip(steps, found, strict=True)
    ]


def _sqlite_result(step: Step, settled: int, row: MarkColumns | None, using: str) -> StepResult:
    if row is None:
        return settled, None
    assert step.claim_id is not None
    delivery = delivery_from(step.claim_id, step.worker_id, step.token, step.now, row, using)
    expired = row.status == Status.CANCELLED
    if row.content is None or expired:
        return settled, MarkedRow(delivery, None, False, expired)
    content = ContentColumns(**json.loads(row.content))  # a JSON object: by key
    email = email_from(row.email_id, content, using)
    return settled, MarkedRow(delivery, email, bool(content.has_attachments))


@functools.cache
def _dbapi_text(template: str) -> str:
    # The DB-API's own placeholders (:name), as Django's SQLite cursor would write them.
    names = _params(_db(), datetime(2000, 1, 1)).keys()
    return template % {name: f":{name}" for name in names}


def mark_sent(pk: int, token: uuid.UUID, now: datetime) -> int:
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(hotpath.sent(db.vendor), _params(db, now, settle_id=pk, settle_token=token))
        return int(cursor.rowcount)


def mark_companions(lead: Delivery, worker_id: str, now: datetime) -> list[Delivery]:
    """Mark the other rows of ``lead``'s message under its claim token; returns them in id order.

    :data:`outbox.transitions.MARK_COMPANIONS`, one statement: each row as
    the mark would mark it (due, not expired, ``queued``), so a row another
    worker holds, or that is settled, is not among them.
    """
    db = _db()
    token = lead.claim_token
    assert token is not None  # the lead is marked
    with db.cursor() as cursor:
        cursor.execute(
            hotpath.companions(db.vendor),
            {
                **_params(db, now, worker=worker_id, token=token),
                "email": lead.email_id,
                "id": lead.pk,
            },
        )
        found = rows_by_name.all(CompanionColumns, cursor, cursor.fetchall())
    return sorted(
        (delivery_from(row.id, worker_id, token, now, row, db.alias) for row in found),
        key=lambda delivery: delivery.pk,
    )


def release_companions(lead: Delivery, now: datetime) -> int:
    """Set the companions of ``lead`` back to ``queued`` unsent (``RELEASE_COMPANIONS``).

    For a companions' mark whose reply was lost: whatever it marked under the
    lead's token goes back, due at once, the attempt not counted.
    """
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(
            hotpath.release_companions(db.vendor),
            {
                **_params(db, now, token=lead.claim_token),
                "email": lead.email_id,
                "id": lead.pk,
                "not_before": stored(now, db),  # an instant column
            },
        )
        return int(cursor.rowcount)


def unclaim(pk: int, token: uuid.UUID, now: datetime, not_before: datetime | None = None) -> int:
    """Give a claimed row back unsent (:data:`outbox.transitions.RELEASE`): not an attempt.

    0 means the row is not ours (never claimed under this token, or settled
    by someone else). Its id may be pushed only after this committed: pushed
    first, another worker would skip the row still ``processing`` and drop
    the id. Without ``not_before`` the row keeps the one it was due at.
    """
    when = F("not_before") if not_before is None else not_before
    return transitions.RELEASE.apply(pk, token, now=now, not_before=when)


def note_server(pk: int, token: uuid.UUID, host: str, address: str) -> int:
    """Record on the row where this attempt hands it over, before SMTP's final dot.

    ``processing`` under ``token`` only (:data:`outbox.transitions.NOTE_SERVER`);
    0 means the row is not ours any more (the sweeper or an operator settled
    it): the message must not go. Written before the hand-over, so that a
    worker killed while it waits for the server's reply leaves the row naming
    its server: a reconciler may rule a handover out only from that server's
    log (:mod:`outbox.reconcilers.evidence`).
    """
    return transitions.NOTE_SERVER.apply(pk, token, host=host, address=address)


def load_email(email_id: int) -> tuple[Email, bool]:
    """The email's content and whether it has attachments, in one query."""
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(_statements(db).EMAIL, [email_id])
        found = cursor.fetchone()
        if found is None:
            raise Email.DoesNotExist(f"email {email_id} is gone")
        row = rows_by_name.one(ContentColumns, cursor, found)
    return email_from(email_id, row, db.alias), bool(row.has_attachments)


def early_entry(pk: int, redis_now: datetime) -> QueueEntry | None:
    """The queue entry of a row that is queued but not yet due, else None."""
    row = (
        Delivery.objects.filter(pk=pk, status=Status.QUEUED, not_before__gt=due_clock(redis_now))
        .values("priority", "not_before")
        .first()
    )
    return QueueEntry(pk, row["priority"], epoch(row["not_before"])) if row else None


def due_clock(redis_now: datetime) -> Now | datetime:
    """The clock of the claim statement's due test, for an ORM filter.

    The same rule as the statements': the database's clock on PostgreSQL,
    Redis time (passed in) on SQLite.
    """
    return Now() if _db().vendor == "postgresql" else redis_now
