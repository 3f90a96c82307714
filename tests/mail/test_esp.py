"""Delivery through an ESP's HTTP API (django-anymail), inside the promise.

The ESP is ``tests/esp.py``: a real HTTP server on loopback speaking
Postmark's and Mailgun's send APIs, which anymail's real backends reach by
their API URL settings. Its webhooks are posted, in each ESP's own JSON, to
anymail's real tracking views. The first section asks
:func:`outbox.mail.failures.classify` about the errors anymail really raises;
the others run real worker (and sweeper) processes, one per test.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.mail import EmailMessage
from django.test import Client
from django.utils import timezone
from django.utils.module_loading import import_string

from outbox import enqueue_email
from outbox.mail.esp import DELIVERY_KEY, TOKEN_KEY, esp_message_id, identify
from outbox.mail.failures import FailureKind, classify, http_failure, refused_by_esp
from outbox.models import Attempt, Delivery, Suppression
from outbox.queue import control
from tests.cells import EACH_DJANGO_AND_DATABASE, slow_processes
from tests.esp import (
    HEARTBEATS,
    MAILGUN_BACKEND,
    POSTMARK_BACKEND,
    FakeESP,
    anymail_settings,
    basic_auth,
    mailgun_event,
    postmark_event,
    worker_env,
)
from tests.servers import free_port, wait_until

pytestmark = slow_processes(
    EACH_DJANGO_AND_DATABASE,
    why="real worker and sweeper processes against a fake ESP; one cell per Django and database",
)

Status = Delivery.Status
Outcome = Attempt.Outcome
TIMEOUT = 0.6  # anymail's REQUESTS_TIMEOUT; the fake's "slow" answers after 2 s


@pytest.fixture(autouse=True)
def fresh(esp: FakeESP, settings) -> None:
    esp.reset()
    settings.ANYMAIL = anymail_settings(esp.url, TIMEOUT)


def env(esp: FakeESP, backend: str = POSTMARK_BACKEND, **extra: str) -> dict[str, str]:
    return worker_env(
        esp, TIMEOUT, backend, **{"OUTBOX_TEST_ABANDONED_POLICY": "review", **HEARTBEATS, **extra}
    )


def post(esp_name: str, body: object) -> int:
    response = Client().post(
        f"/anymail/{esp_name}/tracking/", data=json.dumps(body),
        content_type="application/json", HTTP_AUTHORIZATION=basic_auth(),
    )  # fmt: skip
    return response.status_code


def settled(pk: int, *statuses: str, timeout: float = 20) -> Delivery:
    return wait_until(
        lambda: (row := Delivery.objects.get(pk=pk)).status in statuses and row, timeout
    )


# -- what anymail's errors mean (one request each, in this process) ---------------


def send_error(esp: FakeESP, action: str, backend: str = POSTMARK_BACKEND) -> BaseException:
    esp.plan["bob@example.com"] = [action]
    message = EmailMessage("Hi", "Body", "from@example.com", ["bob@example.com"])
    with pytest.raises(Exception) as info:
        # The backend's own class: Django 6.1's get_connection() refuses a path under MAILERS.
        import_string(backend)().send_messages([message])
    return info.value


@pytest.mark.parametrize(
    ("action", "kind"),
    [
        ("slow", FailureKind.AMBIGUOUS),  # the read timed out: the ESP took it
        ("reset", FailureKind.AMBIGUOUS),  # reset while waiting for the answer
        ("502", FailureKind.AMBIGUOUS),  # a gateway lost the ESP's verdict
        ("429", FailureKind.TRANSIENT),
        ("503", FailureKind.TRANSIENT),
        ("500", FailureKind.TRANSIENT),  # unknown: as before
        ("422", FailureKind.PERMANENT),  # Postmark's ErrorCode 300: the recipient refused
    ],
)
def test_each_answer_of_the_esp_is_classified(esp, action, kind):
    exc = send_error(esp, action)
    assert classify(exc) is kind, exc
    if action in ("429", "503"):
        assert http_failure(exc).retry_after == 1.0
    if action == "422":
        assert refused_by_esp(exc) == ["bob@example.com"]


def test_mailguns_400_is_permanent_and_a_request_that_never_left_is_transient(esp, settings):
    assert classify(send_error(esp, "422", MAILGUN_BACKEND)) is FailureKind.PERMANENT
    settings.ANYMAIL = anymail_settings(f"http://127.0.0.1:{free_port()}/", TIMEOUT)
    refused = send_error(esp, "ok")
    assert http_failure(refused).why == "the request never left"
    assert classify(refused) is FailureKind.TRANSIENT


def test_the_copy_carries_the_delivery_and_its_token_and_keeps_the_esps_id(esp):
    message = EmailMessage("Hi", "Body", "from@example.com", ["bob@example.com"])
    message.metadata = {"campaign": "spring"}  # the caller's own metadata stays
    identify(message, 42, uuid.UUID(int=7))
    assert import_string(POSTMARK_BACKEND)().send_messages([message]) == 1
    [taken] = esp.accepted
    assert taken.metadata == {"campaign": "spring", DELIVERY_KEY: "42", TOKEN_KEY: "0" * 31 + "7"}
    assert esp_message_id(message) == taken.esp_id


# -- real worker processes ---------------------------------------------------------


def test_a_timeout_after_the_esp_took_it_is_in_doubt_and_its_webhook_settles_it(
    esp, worker_process
):
    """The ESP answers after the client's timeout: before the fix, retried and sent twice."""
    [row] = enqueue_email("Hi", "Body", None, ["slow@example.com"])
    esp.plan["slow@example.com"] = ["slow"]
    worker_process("--concurrency", "1", **env(esp))
    row = settled(row.pk, Status.ABANDONED, Status.SENT)
    # Until the worker sent a later email, due after any retry's backoff (0.1-0.4 s):
    # by then a wrong retry of the first would have been made.
    [later] = enqueue_email(
        "Hi", "Body", None, ["later@example.com"], send_at=timezone.now() + timedelta(seconds=1)
    )
    settled(later.pk, Status.SENT)
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
    [taken] = esp.accepted_for("slow@example.com")
    [doubt] = row.attempt_log.all()
    assert doubt.outcome == Outcome.AMBIGUOUS and doubt.esp_message_id == ""
    assert taken.metadata == {DELIVERY_KEY: str(row.pk), TOKEN_KEY: row.claim_token.hex}
    assert "@" not in json.dumps(taken.metadata)  # never an address

    # The ESP's Delivery webhook names the row by its metadata: settled sent, once.
    for _ in range(2):
        assert post("postmark", postmark_event(taken)) == 200
    row.refresh_from_db()
    assert row.status == Status.SENT
    decision = row.attempt_log.get(outcome=Outcome.MARKED_SENT)
    assert decision.actor == "esp:Postmark"
    assert "Postmark reported delivered" in decision.error and taken.esp_id in decision.error
    assert row.attempt_log.count() == 2  # the second post added nothing
    assert len(esp.accepted_for("slow@example.com")) == 1


def test_a_reset_or_a_gateways_502_is_in_doubt_settled_by_mailguns_webhook(esp, worker_process):
    rows = {
        to: enqueue_email("Hi", "Body", None, [to])[0]
        for to in ("reset@example.com", "gateway@example.com")
    }
    esp.plan["reset@example.com"] = ["reset"]
    esp.plan["gateway@example.com"] = ["502"]
    worker_process("--concurrency", "2", **env(esp, MAILGUN_BACKEND))
    for row in rows.values():
        settled(row.pk, Status.ABANDONED)
    # The reset one the ESP took (its webhook comes); the 502 one it did not.
    [taken] = esp.accepted_for("reset@example.com")
    assert not esp.accepted_for("gateway@example.com")
    late = mailgun_event(taken, "opened")
    assert post("mailgun", mailgun_event(taken, "delivered")) == 200
    assert post("mailgun", late) == 200
    assert Delivery.objects.get(pk=rows["reset@example.com"].pk).status == Status.SENT
    # No webhook, no proof: the 502's row waits for a person.
    assert Delivery.objects.get(pk=rows["gateway@example.com"].pk).status == Status.ABANDONED


def test_429_and_503_wait_for_retry_after_and_slow_all_sending(esp, worker_process):
    esp.retry_after = "1"
    [row] = enqueue_email("Hi", "Body", None, ["busy@example.com"])
    esp.plan["busy@example.com"] = ["429", "503"]
    worker_process("--concurrency", "1", **env(esp))
    # The whole mailer (here the default backend: "*") waits, not only this row.
    wait_until(lambda: control.state().slow_domains.get("*", 0) > time.time() + 0.5, 20)
    row = settled(row.pk, Status.SENT, timeout=30)
    times = [a.finished_at for a in row.attempt_log.filter(outcome=Outcome.RETRY)]
    assert len(times) == 2
    # Each retry came no earlier than the Retry-After (RETRY_BACKOFF alone: 0.1-0.4 s).
    assert (times[1] - times[0]).total_seconds() >= 0.95
    assert (row.sent_at - times[1]).total_seconds() >= 0.95
    assert len(esp.accepted_for("busy@example.com")) == 1


def test_a_refused_recipient_fails_at_once_and_is_suppressed(esp, worker_process):
    [refused] = enqueue_email("Hi", "Body", None, ["Nobody <Nobody@example.com>"])
    [flaky] = enqueue_email("Hi", "Body", None, ["flaky@example.com"])
    esp.plan["nobody@example.com"] = ["422", "ok"]
    esp.plan["flaky@example.com"] = ["500"]
    worker_process("--concurrency", "2", **env(esp))
    refused = settled(refused.pk, Status.FAILED)
    assert [r for r, _a in esp.requests].count("nobody@example.com") == 1  # never retried
    assert "HTTP 422" in refused.last_error and "Invalid 'To'" in refused.last_error
    assert Suppression.objects.filter(address="nobody@example.com", source="refusal").exists()
    # A 500 is not known to mean anything: retried, as before, with the ESP's answer logged.
    flaky = settled(flaky.pk, Status.SENT)
    [retry] = flaky.attempt_log.filter(outcome=Outcome.RETRY)
    assert "500" in retry.error and "fake failure" in retry.error


def test_a_success_records_the_esps_message_id_and_its_events_add_evidence_once(
    esp, worker_process
):
    [row] = enqueue_email("Hi", "Body", None, ["ok@example.com"])
    worker_process("--concurrency", "1", **env(esp))
    row = settled(row.pk, Status.SENT)
    [taken] = esp.accepted_for("ok@example.com")
    [attempt] = row.attempt_log.all()
    assert (attempt.outcome, attempt.esp_message_id) == (Outcome.SENT, taken.esp_id)
    # Found by the ESP's message id alone (no metadata): evidence, once per event type.
    taken.metadata = {}
    for record in ("Delivery", "Delivery", "Open", "Bounce", "Bounce"):
        assert post("postmark", postmark_event(taken, record)) == 200
    outcomes = list(row.attempt_log.values_list("outcome", flat=True))
    assert outcomes == [Outcome.SENT, Outcome.REPORTED, Outcome.REPORTED, Outcome.BOUNCED]
    assert Suppression.objects.filter(address="ok@example.com").exists()
    # An event about a message the outbox never sent changes nothing.
    other = esp.accept("Postmark", "x@example.com", {DELIVERY_KEY: str(row.pk)}, "")
    assert post("postmark", postmark_event(other)) == 200
    assert row.attempt_log.count() == 4


def test_a_worker_killed_mid_request_is_abandoned_by_the_sweeper_then_settled_by_the_webhook(
    esp, worker_process, sweeper_process
):
    esp.answer_after = 30.0  # the answer never comes in time
    [row] = enqueue_email("Hi", "Body", None, ["killed@example.com"])
    esp.plan["killed@example.com"] = ["slow"]
    worker = worker_process(
        "--concurrency", "1", **env(esp, OUTBOX_TEST_ESP_TIMEOUT="30")
    )  # fmt: skip
    sweeper_process("--loop", "0.3", OUTBOX_TEST_ABANDONED_POLICY="review", **HEARTBEATS)
    wait_until(lambda: esp.accepted_for("killed@example.com"), 20)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    settled(row.pk, Status.ABANDONED)
    [taken] = esp.accepted_for("killed@example.com")
    assert post("postmark", postmark_event(taken)) == 200
    row.refresh_from_db()
    assert row.status == Status.SENT
    assert row.attempt_log.filter(outcome=Outcome.MARKED_SENT, actor="esp:Postmark").exists()


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("T")


def test_the_lease_is_asked_right_before_the_request(esp, worker_process, sweeper_process):
    """Frozen with the copy built, declared dead meanwhile: no request is made.

    Before the fix the lease was asked only before the copy was built, so the
    request went out after SIGCONT, from a worker the sweeper had given up on.
    """
    [row] = enqueue_email("Hi", "Body", None, ["frozen@example.com"])
    worker = worker_process(
        "--concurrency", "1", **env(esp, OUTBOX_FAULT_POINT="before_send", OUTBOX_FAULT_COUNT="1")
    )
    sweeper = sweeper_process("--loop", "0.3", **HEARTBEATS)
    wait_until(lambda: _stopped(worker.pid), 20)
    settled(row.pk, Status.ABANDONED)
    sweeper.terminate()
    worker.send_signal(signal.SIGCONT)
    released = wait_until(
        lambda: Attempt.objects.filter(delivery_id=row.pk, outcome=Outcome.RELEASED).first(), 20
    )
    assert "lease ran out before the request started" in released.error
    assert esp.requests == []
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
