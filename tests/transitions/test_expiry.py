"""expires_at: refused when it cannot be met, and a row past it is never sent.

The worker finds an expired row in its claim UPDATE (the same conditional
statement that would mark it processing) and the sweeper settles expired rows
that no worker claims; either way the row ends ``cancelled`` with
``last_error`` saying it expired.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from outbox import enqueue_email, enqueue_template
from outbox.models import Attempt, Delivery, EmailTemplate
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.delivery import use_smtp
from tests.servers import SMTPRecorder, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def soon(seconds: float = 0.5) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "past"),
        ({"expires_at": datetime(2100, 1, 1)}, "naive"),
        (
            {
                "send_at": timezone.now() + timedelta(hours=2),
                "expires_at": timezone.now() + timedelta(hours=1),
            },
            "before_send_at",
        ),
    ],
)
def test_an_expiry_that_cannot_be_met_is_refused(options, code):
    with pytest.raises(ValidationError) as info:
        enqueue_email("s", "b", None, ["a@example.com"], **options)
    assert info.value.error_dict["expires_at"][0].code == code
    EmailTemplate.objects.create(name="t", subject="s", text="b")
    with pytest.raises(ValidationError):
        enqueue_template("t", {}, None, ["a@example.com"], **options)
    assert not Delivery.objects.exists()


def test_expires_at_must_be_a_datetime():
    with pytest.raises(TypeError, match="expires_at"):
        enqueue_email("s", "b", None, ["a@example.com"], expires_at="tomorrow")


def past(moment: datetime) -> None:
    wait_until(lambda: timezone.now() > moment + timedelta(milliseconds=50), timeout=10)


def test_the_worker_cancels_an_expired_row_in_its_claim_without_sending(outbox_mail):
    expires = soon()
    [late] = enqueue_email("late", "b", None, ["late@example.com"], expires_at=expires)
    [fine] = enqueue_email("fine", "b", None, ["fine@example.com"], expires_at=soon(3600))
    past(expires)
    Worker(burst=True).run(install_signal_handlers=False)
    assert [m.subject for m in outbox_mail] == ["fine"]
    late.refresh_from_db()
    assert late.status == Status.CANCELLED
    assert "expired" in late.last_error
    assert late.attempts == 0  # the cancelling claim is no attempt
    assert Delivery.objects.get(pk=fine.pk).status == Status.SENT


def test_a_row_whose_expiry_passes_while_it_waits_for_a_retry_is_never_sent(settings):
    # The server refuses for now (451); the retry (3 to 6 s later) is due after
    # the row expired (2 s).
    server = SMTPRecorder(refuse={"a@example.com": "451 4.3.0 try later"}).start()
    worker = None
    thread = None
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0, RETRY_BACKOFF=(6.0, 6.0))
        [row] = enqueue_email("s", "b", None, ["a@example.com"], expires_at=soon(2.0))
        worker = Worker()
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.CANCELLED, 15)
        # Let the server accept from now on: nothing may arrive anyway.
        server.refuse.clear()
    finally:
        if worker is not None and thread is not None:
            worker.stop()
            thread.join(30)
            assert not thread.is_alive()
        server.stop()
    row.refresh_from_db()
    assert row.attempts == 1 and "expired" in row.last_error
    assert server.count() == 0
    assert list(row.attempt_log.values_list("outcome", flat=True)) == [Attempt.Outcome.RETRY]


def test_the_sweeper_cancels_expired_queued_rows_with_an_attempt_each(outbox_mail):
    expires = soon()
    [late] = enqueue_email("late", "b", None, ["late@example.com"], expires_at=expires)
    [other] = enqueue_email("other", "b", None, ["o@example.com"], expires_at=soon(3600))
    [plain] = enqueue_email("plain", "b", None, ["p@example.com"])
    past(expires)
    report = Sweeper().run_pass()
    assert report.expired == 1 and "expired 1" in report.line()
    late.refresh_from_db()
    assert late.status == Status.CANCELLED and "expired" in late.last_error
    [attempt] = late.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.CANCELLED and attempt.actor == "sweeper"
    assert "expired" in attempt.error
    statuses = set(Delivery.objects.exclude(pk=late.pk).values_list("status", flat=True))
    assert statuses == {Status.QUEUED}
    # Its id is still in Redis: a worker drops it and sends only the others.
    Worker(burst=True).run(install_signal_handlers=False)
    assert sorted(m.subject for m in outbox_mail) == ["other", "plain"]
    assert Sweeper().run_pass().expired == 0
    assert {other.pk, plain.pk} == set(
        Delivery.objects.filter(status=Status.SENT).values_list("pk", flat=True)
    )
