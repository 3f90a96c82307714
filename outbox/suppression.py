"""The suppression list: addresses the outbox never sends to.

An enqueue call looks all its recipients up in ONE query (the unique index on
``address``, stored in one form, :func:`suppression_key`: lower-cased, the
domain IDNA-encoded, as a refusal names it): a suppressed recipient's delivery
is written ``cancelled`` with ``last_error`` naming the suppression, and its
id is never pushed to Redis. Other recipients of the call are unaffected.

The list is fed by people (:func:`suppress`, the admin) and by the worker: a
permanent 5xx refusal of a recipient at RCPT adds that recipient (source
``refusal``) when ``OUTBOX["SUPPRESS_ON_REFUSAL"]`` is on. A refusal of the
sender or of the message (MAIL FROM, DATA) says nothing about the recipient
and adds nothing.
"""

from __future__ import annotations

import json
import smtplib
from collections.abc import Iterable, Sequence

from django.db import connections
from django.utils import timezone

from .models import Suppression, outbox_alias

# bare_address lives with suppression_key (the staging valve, below the mail layer, uses it too).
from .validation import bare_address, suppression_key

__all__ = [
    "bare_address",
    "refused_recipients",
    "suppress",
    "suppressed",
    "suppression_key",
    "unsuppress",
]


def suppress(address: str, reason: str = "", *, source: str = Suppression.Source.API) -> bool:
    """Put ``address`` on the suppression list; False if it was already there.

    Later enqueue calls create a ``cancelled`` delivery for it instead of
    sending. Deliveries already queued are not touched.
    """
    _row, created = Suppression.objects.get_or_create(
        address=suppression_key(address),
        defaults={"reason": reason, "source": source, "created_at": timezone.now()},
    )
    return created


def unsuppress(address: str) -> bool:
    """Take ``address`` off the suppression list; False if it was not on it."""
    deleted, _ = Suppression.objects.filter(address=suppression_key(address)).delete()
    return bool(deleted)


def suppressed(using: str, addresses: Sequence[str]) -> dict[str, str]:
    """Which of ``addresses`` (in :func:`suppression_key` form) are suppressed, with why: one indexed query.

    The addresses travel as one parameter (an array on PostgreSQL, a JSON
    list on SQLite), so the query is one statement however many there are.
    """
    if not addresses:
        return {}
    connection = connections[using]
    table = connection.ops.quote_name(Suppression._meta.db_table)
    distinct = sorted(set(addresses))
    if connection.vendor == "postgresql":
        sql = f"SELECT address, reason, source FROM {table} WHERE address = ANY(%s::text[])"
        param: list[str] | str = distinct
    elif connection.vendor == "sqlite":
        sql = (
            f"SELECT address, reason, source FROM {table} "
            "WHERE address IN (SELECT value FROM json_each(%s))"
        )
        param = json.dumps(distinct)
    else:
        rows = Suppression.objects.using(using).filter(address__in=distinct)
        return {r.address: _why(r.address, r.reason, r.source) for r in rows}
    with connection.cursor() as cursor:
        cursor.execute(sql, [param])
        return {address: _why(address, reason, source) for address, reason, source in cursor}


def _why(address: str, reason: str, source: str) -> str:
    # The same text as PostgreSQL's INSERT behind outbox.statements.postgresql.ENQUEUE_CALL.
    text = f"suppressed: {address} is on the suppression list ({source})"
    return (f"{text}: {reason}" if reason else text)[:2000]


def refused_recipients(exc: BaseException) -> list[str]:
    """Recipients a server refused for good (5xx at RCPT) in ``exc``, in the list's form.

    Only :class:`smtplib.SMTPRecipientsRefused` names recipients; a refusal of
    the sender or of the data is about something else.
    """
    if not isinstance(exc, smtplib.SMTPRecipientsRefused):
        return []
    return [
        bare_address(str(address))
        for address, (code, _msg) in exc.recipients.items()
        if 500 <= code < 600
    ]


def add_refused(addresses: Iterable[str], reason: str, using: str | None = None) -> None:
    """Add refused recipients (source ``refusal``); addresses already listed stay as they are."""
    using = using or outbox_alias()
    now = timezone.now()
    Suppression.objects.using(using).bulk_create(
        [
            Suppression(
                address=a, reason=reason[:2000], source=Suppression.Source.REFUSAL, created_at=now
            )
            for a in dict.fromkeys(suppression_key(a) for a in addresses)
        ],
        ignore_conflicts=True,
    )
