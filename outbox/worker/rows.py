"""The worker's rows, read by column name: what its statements return, as model instances.

The statements and their runners are :mod:`outbox.worker.sql`; this is only the mapping,
so that the runners read the columns by name and build the instances the
sender needs without a query of their own.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from ..db import loaded_instance
from ..models import Delivery, Email

Status = Delivery.Status


class MarkedRow(NamedTuple):
    delivery: Delivery
    email: Email | None  # None: not read with the mark (cached, or SQLite)
    has_attachments: bool
    expired: bool = False  # marked `cancelled` (past its expires_at): drop it, never send it


class MarkColumns(NamedTuple):
    """What the mark returns (``MARK``'s RETURNING), read by column name."""

    email_id: int
    recipient: str
    priority: str
    attempts: int
    max_attempts: int
    message_id: str
    status: str  # cancelled: the mark found the row past its expires_at
    content: str | None = None  # SQLite's MARKED_CONTENT: the email's content, JSON


class CompanionColumns(NamedTuple):
    """What the companions' mark returns (``MARK_COMPANIONS``'s RETURNING), by column name."""

    id: int
    email_id: int
    recipient: str
    priority: str
    attempts: int
    max_attempts: int
    message_id: str


class ContentColumns(NamedTuple):
    """An email's content as ``EMAIL`` returns it (and SQLite's mark, as JSON keys)."""

    subject: str
    body: str
    html_message: str
    from_email: str
    reply_to: Any
    headers: Any
    mailer: str
    has_attachments: bool
    structure: Any


class StepColumns(NamedTuple):
    """A step's row: the columns of ``outbox_step()`` and ``outbox_steps()``.

    The mark's columns are None when nothing was marked, the content's when
    the worker has the email cached (or the mark found the row expired).
    """

    settled: int
    email_id: int | None
    recipient: str | None
    priority: str | None
    attempts: int | None
    max_attempts: int | None
    message_id: str | None
    subject: str | None
    body: str | None
    html_message: str | None
    from_email: str | None
    reply_to: Any
    headers: Any
    mailer: str | None
    has_attachments: bool | None
    claimed_status: str | None
    structure: Any


def delivery_from(
    pk: int,
    worker_id: str,
    token: uuid.UUID,
    now: datetime,
    row: MarkColumns | CompanionColumns | StepColumns,
    using: str,
) -> Delivery:
    """The marked row as the worker needs it, from the RETURNING columns.

    The columns the statements do not return are left as ``Delivery()``
    would set them, except ``not_before``: the row was due at ``now``.
    """
    return loaded_instance(
        Delivery,
        {
            "id": pk,
            "email_id": row.email_id,
            "recipient": row.recipient,
            "recipient_key": "",
            "status": Status.PROCESSING,
            "priority": row.priority,
            "attempts": row.attempts,
            "max_attempts": row.max_attempts,
            "not_before": now,
            "worker_id": worker_id,
            "claim_token": token,
            "processing_started_at": now,
            "sent_at": None,
            "server_host": "",  # not returned: written by note_server() before the send
            "server_address": "",
            "message_id": row.message_id,
            "last_error": "",
            "expires_at": None,
            "idempotency_key": None,
            "created_at": None,
            "updated_at": None,
        },
        using,
    )


def email_from(pk: int, row: ContentColumns | StepColumns, using: str) -> Email:
    """The email as the worker needs it, from the content columns the statements return."""
    return loaded_instance(
        Email,
        {
            "id": pk,
            "subject": row.subject,
            "body": row.body,
            "html_message": row.html_message,
            "from_email": row.from_email,
            "reply_to": json_value(row.reply_to),
            "headers": json_value(row.headers),
            "created_at": None,
            "mailer": row.mailer,
            "structure": json_value(row.structure),
            # Not read by the worker: a cleared email's structure says so
            # (outbox.mail.structure.CLEARED).
            "sensitive": False,
            "trace_context": None,  # not returned: read by outbox.tracing.sending when traced
            "content_cleared_at": None,
        },
        using,
    )


def json_value(value: Any) -> Any:
    # A raw cursor gets JSON columns as text on PostgreSQL (Django's loader) and SQLite.
    return json.loads(value) if isinstance(value, str | bytes) else value
