"""Whose clock a row's times come from: settings without time zones, and the web host's clock.

- ``USE_TZ = False``: the worker and the sweeper time rows by Redis (``outbox/clock.py``)
  and must write those times the way Django stores them, naive.
- A row due now is due by the database's clock on PostgreSQL, not by the clock of the
  host that enqueued or requeued it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.db import connection, transaction
from django.test import override_settings

from outbox import enqueue_email, enqueue_many, operations
from outbox.models import Delivery
from outbox.sweeper import Sweeper
from outbox.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def run_worker() -> None:
    Worker(burst=True).run(install_signal_handlers=False)


@override_settings(USE_TZ=False)
def test_without_time_zone_support_mail_is_enqueued_swept_and_sent():
    # The API still takes aware times; the rows hold them naive, as Django does.
    now = datetime.now(UTC)
    rows = [
        *enqueue_email("Hi", "Body", None, ["a@example.com", "b@example.com"]),
        *enqueue_email(
            "Hi",
            "Body",
            None,
            ["c@example.com"],
            send_at=now - timedelta(seconds=5),
            expires_at=now + timedelta(hours=1),
        ),
    ]
    for created in enqueue_many(
        [{"subject": "s", "message": "b", "recipient_list": ["d@example.com"], "send_at": now}]
    ):
        rows += created
    Sweeper().run_pass()
    run_worker()
    assert {Delivery.objects.get(pk=d.pk).status for d in rows} == {Status.SENT}
    assert len(mail.outbox) == 4


# -- a row due now is due by the database's clock (PostgreSQL) -------------------------

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite has no server clock: rows keep this host's time (the worker uses Redis')",
)


def transaction_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def not_before(rows) -> set[datetime]:
    return set(
        Delivery.objects.filter(pk__in=[d.pk for d in rows]).values_list("not_before", flat=True)
    )


@postgresql_only
@pytest.mark.parametrize("functions", [True, False])
def test_enqueue_writes_the_databases_now_as_not_before(settings, functions, queue):
    settings.OUTBOX = {**settings.OUTBOX, "POSTGRESQL_FUNCTIONS": functions}
    send_at = datetime.now(UTC) + timedelta(hours=1)
    with transaction.atomic():
        # now() is the transaction's start: before any time this host reads inside it.
        db_now = transaction_now()
        one = enqueue_email("s", "b", None, ["a@example.com"])
        two = enqueue_email("s", "b", None, ["b@example.com", "c@example.com"])
        [many, later_many] = enqueue_many(
            [
                {"subject": "s", "message": "b", "recipient_list": ["d@example.com"]},
                {
                    "subject": "s",
                    "message": "b",
                    "recipient_list": ["e@example.com"],
                    "send_at": send_at,
                },
            ]
        )
        later = enqueue_email("s", "b", None, ["f@example.com"], send_at=send_at)
        # The ORM path: an idempotency key, or attachments.
        keyed = enqueue_email("s", "b", None, ["g@example.com"], idempotency_key="order-1")
        attached = enqueue_email(
            "s", "b", None, ["h@example.com"], attachments=[("a.txt", b"x", "text/plain")]
        )
    assert not_before([*one, *two, *many, *keyed, *attached]) == {db_now}
    assert not_before([*later, *later_many]) == {send_at}  # the caller's own time, as given
    due = {d.pk for d in [*one, *two, *many, *keyed, *attached]}
    assert due <= queue.waiting_ids()


@postgresql_only
def test_an_operators_requeue_writes_the_databases_now_as_not_before(queue):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    operations.cancel([row.pk], "tester")
    with transaction.atomic():
        db_now = transaction_now()
        assert operations.requeue([row.pk], "tester").changed == [row.pk]
    assert not_before([row]) == {db_now}
