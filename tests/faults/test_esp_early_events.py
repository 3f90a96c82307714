"""An ESP's word is kept, whenever it comes (issue 41, items 1 and 2).

The fake ESP (``tests/esp.py``) takes the message and posts its Delivery
webhook, naming the attempt by metadata, to anymail's real tracking view served
by a real ``runserver`` process, *before* it answers: then the answer is lost
(a timeout), or is a 500, or the worker is killed before it writes the outcome.
The worker and the sweeper are real processes. Before the fix the event was
only logged: the row ended ``abandoned`` (in doubt) or was retried and reached
the ESP twice.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage
from django.utils import timezone

from outbox import enqueue_email, operations
from outbox.models import Attempt, Delivery
from outbox.sweeper import Sweeper
from tests.cells import slow_processes
from tests.delivery import use_outbox
from tests.esp import HEARTBEATS, POSTMARK_BACKEND, FakeESP, anymail_settings, worker_env
from tests.processes import process_state
from tests.servers import runserver, wait_until

pytestmark = slow_processes(
    ("6.1:postgres", "5.2:sqlite"),
    why="a fake ESP, a runserver for its webhooks, worker processes; one cell per Django and database",
)

Status = Delivery.Status
Outcome = Attempt.Outcome
TIMEOUT = 0.6  # anymail's REQUESTS_TIMEOUT in the worker; the fake's "slow" answers after 2 s


@pytest.fixture(scope="module")
def webhooks(esp: FakeESP, tmp_path_factory, django_db_setup) -> Iterator[None]:
    """anymail's tracking view in a real ``runserver`` process, where the fake ESP posts."""
    log = tmp_path_factory.mktemp("webhooks") / "runserver.log"
    with runserver(log, OUTBOX_TEST_ESP_URL=esp.url) as port:
        esp.webhook_url = f"http://127.0.0.1:{port}/anymail/postmark/tracking/"
        yield


@pytest.fixture(autouse=True)
def fresh(esp: FakeESP, settings, webhooks) -> None:
    esp.reset()  # the webhook URL stays: the module's runserver
    settings.ANYMAIL = anymail_settings(esp.url, TIMEOUT)


def env(esp: FakeESP, policy: str = "review", **extra: str) -> dict[str, str]:
    return worker_env(
        esp, TIMEOUT, **{"OUTBOX_TEST_ABANDONED_POLICY": policy, **HEARTBEATS, **extra}
    )


def settled(pk: int, *statuses: str, timeout: float = 30) -> Delivery:
    return wait_until(
        lambda: (row := Delivery.objects.get(pk=pk)).status in statuses and row, timeout
    )


def no_retry_after(esp: FakeESP) -> None:
    """Until the worker sent a later email, due after any retry's backoff of the first."""
    [later] = enqueue_email(
        "Later", "Body", None, ["later@example.com"], send_at=timezone.now() + timedelta(seconds=1)
    )
    settled(later.pk, Status.SENT)


@pytest.mark.parametrize("action", ["earlyslow", "early500"])
def test_an_event_before_a_lost_answer_or_a_500_settles_the_attempt_sent(
    esp, worker_process, action
):
    [row] = enqueue_email("Hi", "Body", None, ["early@example.com"])
    esp.plan["early@example.com"] = [action]
    worker_process("--concurrency", "1", **env(esp))
    row = settled(row.pk, Status.SENT, Status.ABANDONED)
    no_retry_after(esp)
    row.refresh_from_db()
    assert row.status == Status.SENT, row.last_error
    assert esp.webhook_statuses == [200]
    assert len(esp.accepted_for("early@example.com")) == 1  # never sent again
    kept = row.attempt_log.get(actor="esp:Postmark")
    assert kept.outcome == Outcome.REPORTED and kept.claim_token == row.claim_token
    decided = row.attempt_log.get(outcome=Outcome.SENT)
    assert "the ESP's event for this attempt came first" in decided.error
    assert decided.esp_message_id == esp.accepted_for("early@example.com")[0].esp_id


@pytest.mark.parametrize("policy", ["review", "requeue"])
def test_an_event_before_its_worker_died_settles_it_sent_whatever_the_policy(
    esp, worker_process, queue, policy
):
    """The ESP posts its event and answers; the worker dies before writing ``sent``."""
    [row] = enqueue_email("Hi", "Body", None, ["dies@example.com"])
    esp.plan["dies@example.com"] = ["earlyok"]
    proc = worker_process("--concurrency", "1", **env(esp, policy, OUTBOX_FAULT_POINT="after_send"))
    wait_until(lambda: process_state(proc) == "T", timeout=30)
    assert esp.webhook_statuses == [200]
    assert Delivery.objects.get(pk=row.pk).status == Status.PROCESSING
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    sweeper = Sweeper(queue=queue, timeout=1.5, policy=policy)
    wait_until(lambda: sweeper.run_pass().reaped, timeout=15)
    row.refresh_from_db()
    assert row.status == Status.SENT, row.last_error
    assert row.attempt_log.filter(outcome=Outcome.MARKED_SENT, actor="sweeper").exists()
    assert len(esp.accepted_for("dies@example.com")) == 1


def test_an_event_after_the_sweepers_look_still_stops_its_requeue(
    esp, worker_process, queue, monkeypatch
):
    """The ESP's event lands between the sweeper's look for evidence and its requeue.

    The look is the real query; the wrapper only posts the event (to the real
    runserver) right after it, which is where a webhook can land on a busy
    site. The requeue re-reads the evidence under its lock and leaves the row,
    which the pass's look for stuck rows then settles ``sent``; before, it was
    requeued and sent twice.
    """
    [row] = enqueue_email("Hi", "Body", None, ["late@example.com"])
    proc = worker_process(
        "--concurrency", "1", **env(esp, "requeue", OUTBOX_FAULT_POINT="after_send")
    )
    wait_until(lambda: process_state(proc) == "T", timeout=30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    [taken] = esp.accepted_for("late@example.com")
    look = operations.evidenced

    def look_then_the_event_lands(ids):
        found = look(ids)
        if row.pk in ids and not esp.webhook_statuses:
            esp.post_event(taken)
        return found

    monkeypatch.setattr(operations, "evidenced", look_then_the_event_lands)
    sweeper = Sweeper(queue=queue, timeout=1.5, policy="requeue")
    wait_until(lambda: sweeper.run_pass().reaped, timeout=15)
    assert esp.webhook_statuses == [200]
    monkeypatch.undo()

    def settled_by_a_pass() -> Delivery | None:
        sweeper.run_pass()
        current = Delivery.objects.get(pk=row.pk)
        return current if current.status != Status.PROCESSING else None

    row = wait_until(settled_by_a_pass, timeout=15)
    assert row.status == Status.SENT, row.last_error
    assert row.attempts == 1
    assert len(esp.accepted_for("late@example.com")) == 1


def test_every_row_of_a_message_is_kept_by_its_own_recipients_early_event(
    esp, worker_process, settings
):
    use_outbox(settings, POSTMARK_BACKEND)
    esp.plan["ann@example.com"] = ["early500"]
    message = EmailMessage(
        "Hi", "Body", "from@example.com", ["ann@example.com"], cc=["bob@example.com"]
    )
    assert message.send() == 1
    worker_process("--concurrency", "1", **env(esp))
    rows = list(Delivery.objects.order_by("pk"))
    for row in rows:
        settled(row.pk, Status.SENT, Status.QUEUED, Status.ABANDONED)
    no_retry_after(esp)
    assert esp.webhook_statuses == [200, 200]
    for row in rows:
        row.refresh_from_db()
        assert row.status == Status.SENT, (row.recipient, row.status, row.last_error)
        assert len(esp.accepted_for(row.recipient)) == 1
