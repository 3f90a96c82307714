"""A message from the drop-in backend reaches an ESP as one request (issue 40, item 1).

Django's ``send_mail``/``EmailMessage`` through ``OutboxBackend``, delivered by
a real worker through anymail's real Postmark backend to the fake ESP of
``tests/esp.py`` (a real HTTP server on loopback): one request carries the To,
Cc and Bcc lists as written and no header the caller did not write; each row
is marked with the one the worker claimed (its companions, under one claim
token) and settled from its own recipient's status in the answer.
"""

from __future__ import annotations

import json
import signal

import pytest
from django.core import mail
from django.core.mail import EmailMessage
from django.test import Client

from outbox import operations
from outbox.mail.esp import DELIVERY_KEY, TOKEN_KEY
from outbox.models import Attempt, Delivery, Suppression
from outbox.sweeper import Sweeper
from tests.cells import EACH_DJANGO_AND_DATABASE, slow_processes
from tests.delivery import deliver, use_outbox
from tests.esp import (
    HEARTBEATS,
    POSTMARK_BACKEND,
    FakeESP,
    anymail_settings,
    basic_auth,
    postmark_event,
    worker_env,
)
from tests.processes import process_state
from tests.servers import wait_until

pytestmark = slow_processes(
    EACH_DJANGO_AND_DATABASE,
    why="one ESP request per message, with worker processes; one cell per Django and database",
)

Status = Delivery.Status
Outcome = Attempt.Outcome
TIMEOUT = 0.6  # anymail's REQUESTS_TIMEOUT; the fake's "slow" answers after 2 s


@pytest.fixture(autouse=True)
def postmark(esp: FakeESP, settings) -> None:
    esp.reset()
    settings.ANYMAIL = anymail_settings(esp.url, TIMEOUT)
    use_outbox(settings, POSTMARK_BACKEND, ABANDONED_POLICY="review")


def rows() -> dict[str, Delivery]:
    return {d.recipient: d for d in Delivery.objects.order_by("pk")}


def custom_headers(body: dict) -> set[str]:
    return {h["Name"].lower() for h in body.get("Headers", [])}


def test_send_mail_with_to_cc_and_bcc_is_one_request_as_written(esp):
    message = EmailMessage(
        "Receipt",
        "Thank you.",
        "Shop <shop@example.com>",
        ["Ann <ann@example.com>", "bob@example.com"],
        cc=["cy@example.com"],
        bcc=["dee@example.com"],
        headers={"X-Order": "42"},
    )
    assert message.send() == 1
    deliver()

    [body] = esp.bodies
    assert body["To"] == "Ann <ann@example.com>, bob@example.com"
    assert body["Cc"] == "cy@example.com"
    assert body["Bcc"] == "dee@example.com"
    assert body["Subject"] == "Receipt" and body["TextBody"] == "Thank you."
    # Only the caller's header: no To, Cc or Message-ID of the outbox's.
    assert custom_headers(body) == {"x-order"}
    found = rows()
    assert {d.status for d in found.values()} == {Status.SENT}
    [lead] = [d for d in found.values() if str(d.pk) == body["Metadata"][DELIVERY_KEY]]
    assert body["Metadata"] == {DELIVERY_KEY: str(lead.pk), TOKEN_KEY: lead.claim_token.hex}
    # One attempt, one token for all four rows; each keeps the ESP's id of the message.
    assert {d.claim_token for d in found.values()} == {lead.claim_token}
    [esp_id] = {a.esp_id for a in esp.accepted}
    for delivery in found.values():
        assert delivery.attempts == 1
        [attempt] = delivery.attempt_log.all()
        assert attempt.outcome == Outcome.SENT and attempt.esp_message_id == esp_id


def test_a_message_with_cc_only_is_sent(esp):
    """Once a KeyError in SendGrid's payload, and Cc twice in Postmark's, per copy."""
    assert EmailMessage("Hi", "Body", "from@example.com", [], cc=["cy@example.com"]).send() == 1
    deliver()
    [body] = esp.bodies
    assert "To" not in body and body["Cc"] == "cy@example.com"
    assert custom_headers(body) == set()
    assert rows()["cy@example.com"].status == Status.SENT


def test_mail_admins_and_send_mail_go_through_the_esp(esp, settings):
    settings.ADMINS = [("Ann", "ann@example.com"), ("Bob", "bob@example.com")]
    mail.mail_admins("Disk full", "It is.")
    mail.send_mail("Hello", "Body", "from@example.com", ["cy@example.com"])
    deliver()
    assert len(esp.bodies) == 2
    admins = next(b for b in esp.bodies if "Disk full" in b["Subject"])
    assert "ann@example.com" in admins["To"] and "bob@example.com" in admins["To"]
    assert {d.status for d in rows().values()} == {Status.SENT}


def test_each_row_settles_from_its_own_recipients_status(esp, settings):
    """Postmark takes the message but not for an inactive address: that row alone fails."""
    settings.OUTBOX = {**settings.OUTBOX, "SUPPRESS_ON_REFUSAL": True}
    esp.plan["bob@example.com"] = ["inactive"]
    message = EmailMessage("Hi", "Body", "from@example.com", ["ann@example.com", "bob@example.com"])
    assert message.send() == 1
    deliver()
    found = rows()
    assert found["ann@example.com"].status == Status.SENT
    bob = found["bob@example.com"]
    assert bob.status == Status.FAILED and "rejected" in bob.last_error
    assert Suppression.objects.filter(address="bob@example.com").exists()

    # The operator requeues Bob's row: the next request is Bob's alone, in his field.
    Suppression.objects.all().delete()
    assert operations.requeue([bob.pk], "tests").changed == [bob.pk]
    deliver()
    assert len(esp.bodies) == 2
    assert esp.bodies[1]["To"] == "bob@example.com"
    assert rows()["bob@example.com"].status == Status.SENT
    assert len(esp.accepted_for("ann@example.com")) == 1


def test_a_request_refused_for_one_recipient_is_retried_for_the_others(esp):
    """Postmark's 422 for an invalid To: "Email not sent"; anymail leaves the Cc unknown."""
    esp.plan["bad@example.com"] = ["422"]
    message = EmailMessage(
        "Hi", "Body", "from@example.com", ["bad@example.com"], cc=["cy@example.com"]
    )
    assert message.send() == 1
    deliver()
    wait_until(lambda: deliver() and rows()["cy@example.com"].status == Status.SENT, 30)
    assert rows()["bad@example.com"].status == Status.FAILED
    retry, sent = rows()["cy@example.com"].attempt_log.order_by("pk")
    assert retry.outcome == Outcome.RETRY
    assert "refused the request for another recipient" in retry.error
    assert sent.outcome == Outcome.SENT
    assert esp.bodies[-1].get("To") is None and esp.bodies[-1]["Cc"] == "cy@example.com"
    assert rows()["cy@example.com"].status == Status.SENT
    assert not esp.accepted_for("bad@example.com")


def test_a_failed_request_settles_every_row_alike(esp):
    esp.plan["ann@example.com"] = ["500"]
    message = EmailMessage("Hi", "Body", "from@example.com", ["ann@example.com", "bob@example.com"])
    assert message.send() == 1
    # Both retried together, at their own backoff, then sent together in one request
    # (by this burst run, if the retry is due before it ends, else by the next).
    deliver()
    wait_until(lambda: deliver() and {d.status for d in rows().values()} == {Status.SENT}, 30)
    assert len(esp.bodies) == 2 and esp.bodies[1]["To"] == esp.bodies[0]["To"]
    for delivery in rows().values():
        assert delivery.status == Status.SENT and delivery.attempts == 2
        assert [a.outcome for a in delivery.attempt_log.order_by("pk")] == [
            Outcome.RETRY,
            Outcome.SENT,
        ]


def test_a_lost_answer_leaves_every_row_in_doubt_and_each_recipients_event_settles_its_own(esp):
    esp.plan["ann@example.com"] = ["slow"]
    message = EmailMessage(
        "Hi", "Body", "from@example.com", ["ann@example.com"], cc=["bob@example.com"]
    )
    assert message.send() == 1
    deliver()
    assert {d.status for d in rows().values()} == {Status.ABANDONED}
    taken = {a.to: a for a in esp.accepted}
    event = postmark_event(taken["bob@example.com"])
    response = Client().post(
        "/anymail/postmark/tracking/", data=json.dumps(event),
        content_type="application/json", HTTP_AUTHORIZATION=basic_auth(),
    )  # fmt: skip
    assert response.status_code == 200
    found = rows()
    assert found["bob@example.com"].status == Status.SENT
    assert found["ann@example.com"].status == Status.ABANDONED


def test_a_companion_not_due_or_held_elsewhere_is_left_out(esp):
    message = EmailMessage("Hi", "Body", "from@example.com", ["ann@example.com", "bob@example.com"])
    assert message.send() == 1
    bob = Delivery.objects.get(recipient="bob@example.com")
    Delivery.objects.filter(pk=bob.pk).update(status=Status.CANCELLED)
    deliver()
    [body] = esp.bodies
    assert body["To"] == "ann@example.com"
    assert Delivery.objects.get(pk=bob.pk).status == Status.CANCELLED


def test_the_staging_valve_sends_each_row_alone_to_its_recipient(esp, settings):
    settings.OUTBOX = {**settings.OUTBOX, "ALLOWED_RECIPIENTS": ["*@example.com"]}
    message = EmailMessage(
        "Hi", "Body", "from@example.com", ["ann@example.com"], cc=["bob@example.com"]
    )
    assert message.send() == 1
    deliver()
    assert sorted((b.get("To", ""), b.get("Cc", "")) for b in esp.bodies) == [
        ("", "bob@example.com"),
        ("ann@example.com", ""),
    ]
    for body in esp.bodies:
        assert custom_headers(body) == set()
    assert {d.status for d in rows().values()} == {Status.SENT}


def test_a_worker_killed_with_companions_marked_leaves_all_of_them_to_the_sweeper(
    esp, worker_process, queue
):
    """The companions are in no processing list: the reap finds them by message and worker."""
    message = EmailMessage("Hi", "Body", "from@example.com", ["ann@example.com", "bob@example.com"])
    assert message.send() == 1
    proc = worker_process(
        "--concurrency",
        "1",
        **worker_env(
            esp,
            TIMEOUT,
            OUTBOX_FAULT_POINT="after_mark_companions",
            OUTBOX_TEST_ABANDONED_POLICY="review",
            **HEARTBEATS,
        ),
    )
    wait_until(lambda: process_state(proc) == "T", timeout=30)
    assert {d.status for d in rows().values()} == {Status.PROCESSING}
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    sweeper = Sweeper(queue=queue, timeout=1.5, policy="review")
    wait_until(lambda: sweeper.run_pass().reaped, timeout=15)
    assert {d.status for d in rows().values()} == {Status.ABANDONED}
    assert not esp.bodies
