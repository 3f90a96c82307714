"""Whose clock a row's times come from: settings without time zones, and the web host's clock.

- ``USE_TZ = False``: the worker and the sweeper time rows by Redis (``outbox/clock.py``)
  and must write those times the way Django stores them, naive.
- A row due now is due by the database's clock on PostgreSQL, not by the clock of the
  host that enqueued or requeued it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.core import mail
from django.test import override_settings

from outbox import enqueue_email, enqueue_many
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
    now = datetime.now(dt_timezone.utc)
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
