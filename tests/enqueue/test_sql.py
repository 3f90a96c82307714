"""enqueue_email's raw-SQL path on PostgreSQL (``outbox/enqueue/sql.py``): every common call runs a function.

Through the PL/pgSQL functions, each case must write the rows that the general
path (the ORM's) writes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.db import connection, transaction
from django.utils import timezone

from outbox.mail.targets import HAS_MAILERS
from outbox.models import Delivery, Email

pytestmark = pytest.mark.django_db(transaction=True)


# -- PostgreSQL: every common-case call runs a function -------------------------------------

# Calls with one recipient run outbox_enqueue_one(), the others outbox_enqueue().
FUNCTION_CASES = {
    "one recipient": dict(to=["a@example.com"]),
    "one suppressed recipient": dict(to=["Blocked@Example.com"]),
    "one recipient, scheduled, expiring, low priority, reply-to, headers, a mailer": dict(
        to=["a@example.com"],
        send_at=timezone.now() + timedelta(days=2),
        expires_at=timezone.now() + timedelta(days=3),
        priority="low",
        max_attempts=2,
        reply_to=["r@example.com"],
        headers={"X-Tag": "t"},
        html_message="<p>b</p>",
        mailer="bulk",
    ),
    "several, one suppressed with a reason, one without": dict(
        to=["a@example.com", "Blocked@Example.com", "quiet@example.com", "c@x.org"]
    ),
    "several, scheduled, expiring, high priority, a mailer": dict(
        to=["a@example.com", "b@example.com"],
        send_at=timezone.now() + timedelta(days=2),
        expires_at=timezone.now() + timedelta(days=3),
        priority="high",
        max_attempts=3,
        mailer="bulk",
    ),
}
DELIVERY_COLUMNS = (
    "recipient",
    "recipient_key",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "expires_at",
    "worker_id",
    "last_error",
    "claim_token",
)
EMAIL_COLUMNS = (
    "subject",
    "body",
    "html_message",
    "from_email",
    "reply_to",
    "headers",
    "mailer",
    "structure",
)


def _function_calls() -> dict[str, int]:
    """Calls of each PL/pgSQL function in this transaction (``track_functions`` set in it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions")
        return dict(cursor.fetchall())


@pytest.mark.parametrize("drop_in", [False, True], ids=["enqueue_email", "drop-in backend"])
@pytest.mark.parametrize("case", FUNCTION_CASES.values(), ids=FUNCTION_CASES.keys())
def test_postgresql_writes_through_a_function_the_rows_the_orm_path_writes(settings, case, drop_in):
    """enqueue_email and a drop-in message (its structure) both go through the functions.

    The rows must be those of the general path (the ORM's, taken with an
    idempotency key): the suppression list's text included.
    """
    if connection.vendor != "postgresql":
        pytest.skip("PL/pgSQL exists on PostgreSQL only")
    from dataclasses import replace

    from outbox import suppress
    from outbox.enqueue.api import write_prepared
    from outbox.enqueue.messages import prepare_message
    from outbox.enqueue.prepare import prepare

    suppress("blocked@example.com", "hard bounce")
    suppress("quiet@example.com")
    bulk = {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}
    if HAS_MAILERS:
        settings.MAILERS = {**settings.MAILERS, "bulk": bulk}
    else:
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {"bulk": bulk}}
    case = dict(case)
    to = case.pop("to")
    if drop_in:
        message = EmailMessage("s", "b", "from@example.com", to, headers=case.get("headers"))
        if case.get("html_message"):
            message = EmailMultiAlternatives(
                "s", "b", "from@example.com", to, headers=case.get("headers")
            )
            message.attach_alternative(case["html_message"], "text/html")
        message.reply_to = case.get("reply_to", [])
        p = prepare_message(
            message,
            priority=case.get("priority", "normal"),
            max_attempts=case.get("max_attempts"),
            mailer=case.get("mailer"),
        )
        p = replace(p, send_at=case.get("send_at"), expires_at=case.get("expires_at"))
        assert p.structure is not None
    else:
        p = prepare(
            "s",
            "b",
            "from@example.com",
            to,
            html_message=case.get("html_message", ""),
            reply_to=case.get("reply_to"),
            headers=case.get("headers"),
            attachments=None,
            send_at=case.get("send_at"),
            priority=case.get("priority", "normal"),
            idempotency_key=None,
            max_attempts=case.get("max_attempts"),
            expires_at=case.get("expires_at"),
            mailer=case.get("mailer"),
        )
        assert p.structure is None

    def written(deliveries: list[Delivery]) -> tuple[Any, ...]:
        rows = list(
            Delivery.objects.filter(pk__in=[d.pk for d in deliveries])
            .order_by("recipient")  # the two paths need not insert in the same order
            .values_list(*DELIVERY_COLUMNS)
        )
        (email,) = Email.objects.filter(pk=deliveries[0].email_id).values_list(*EMAIL_COLUMNS)
        returned = sorted((d.recipient, d.status, d.last_error) for d in deliveries)
        return returned, rows, email

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL track_functions = 'pl'")
        [by_function] = write_prepared([p])
        called = _function_calls()
    one = len(to) == 1
    assert called == {("outbox_enqueue_one" if one else "outbox_enqueue"): 1}
    [by_orm] = write_prepared([replace(p, idempotency_key="the ORM's path")])
    assert written(by_function) == written(by_orm)
    assert len(by_function) == len(to)
    suppressed = {"Blocked@Example.com", "quiet@example.com"}.intersection(to)
    cancelled = [d for d in by_function if d.status == Delivery.Status.CANCELLED]
    assert len(cancelled) == len(suppressed)  # the case did meet the suppression list
