"""The ESP event hook: anymail's tracking signal records bounces and complaints.

A real Mailgun webhook payload (new-style JSON, signed with the test signing
key) is posted to anymail's own tracking view; the only simulated part is the
ESP, which cannot run here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid

import pytest
from django.conf import settings
from django.test import Client

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Suppression
from outbox.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/anymail/mailgun/tracking/"


def webhook(message_id: str, event: str, recipient: str, **extra: object) -> dict:
    """A Mailgun tracking webhook body, as Mailgun signs and sends it."""
    timestamp, token = str(int(time.time())), uuid.uuid4().hex
    key = settings.ANYMAIL["MAILGUN_WEBHOOK_SIGNING_KEY"].encode("ascii")
    signature = hmac.new(key, f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    data = {
        "event": event,
        "timestamp": time.time(),
        "id": uuid.uuid4().hex,
        "recipient": recipient,
        # Mailgun gives the Message-ID header without its angle brackets.
        "message": {"headers": {"message-id": message_id.strip("<>"), "to": recipient}},
        **extra,
    }
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature},
        "event-data": data,
    }


def post(body: dict) -> int:
    auth = base64.b64encode(settings.ANYMAIL["WEBHOOK_SECRET"].encode()).decode()
    response = Client().post(
        URL, data=json.dumps(body), content_type="application/json",
        HTTP_AUTHORIZATION=f"Basic {auth}",
    )  # fmt: skip
    return response.status_code


@pytest.fixture
def sent(outbox_mail) -> Delivery:
    [delivery] = enqueue_email("Hi", "Body", None, ["Alice <Alice@example.com>"])
    Worker(burst=True).run(install_signal_handlers=False)
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.SENT and len(outbox_mail) == 1
    return delivery


def test_a_hard_bounce_is_recorded_and_suppresses_the_address(sent):
    status = {"code": 550, "message": "5.1.1 mailbox unavailable", "description": "no such user"}
    body = webhook(sent.message_id, "failed", "alice@example.com", severity="permanent",
                   reason="bounce", **{"delivery-status": status})  # fmt: skip
    assert post(body) == 200
    [attempt] = sent.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.BOUNCED
    assert attempt.actor == "esp:Mailgun"
    assert "5.1.1 mailbox unavailable" in attempt.error
    [row] = Suppression.objects.all()
    assert (row.address, row.source) == ("alice@example.com", "refusal")
    # The row stays sent: the server did accept it; the bounce is written next to it.
    assert Delivery.objects.get(pk=sent.pk).status == Delivery.Status.SENT
    [later] = enqueue_email("Again", "Body", None, ["alice@example.com"])
    assert later.status == Delivery.Status.CANCELLED


def test_a_complaint_suppresses_and_a_rejection_is_only_recorded(sent):
    assert post(webhook(sent.message_id, "rejected", "alice@example.com",
                        reject={"reason": "on the ESP's own list"})) == 200  # fmt: skip
    assert not Suppression.objects.exists()
    assert post(webhook(sent.message_id, "complained", "alice@example.com")) == 200
    outcomes = list(sent.attempt_log.values_list("outcome", flat=True))
    assert outcomes == [Attempt.Outcome.REJECTED, Attempt.Outcome.COMPLAINED]
    assert Suppression.objects.filter(address="alice@example.com").exists()


def test_other_events_add_evidence_once_and_other_messages_are_ignored(sent):
    for _ in range(2):
        assert post(webhook(sent.message_id, "delivered", "alice@example.com")) == 200
        assert (
            post(webhook(sent.message_id, "failed", "alice@example.com", severity="temporary"))
            == 200
        )
    assert (
        post(webhook("<not-ours@example.com>", "failed", "x@example.com", severity="permanent"))
        == 200
    )
    reported = list(sent.attempt_log.values_list("outcome", "error"))
    assert [outcome for outcome, _ in reported] == [Attempt.Outcome.REPORTED] * 2
    assert reported[0][1].startswith("Mailgun reported delivered")
    assert reported[1][1].startswith("Mailgun reported deferred")
    assert Delivery.objects.get(pk=sent.pk).status == Delivery.Status.SENT
    assert not Suppression.objects.exists()


def test_a_forged_webhook_is_refused_and_records_nothing(sent):
    body = webhook(sent.message_id, "complained", "alice@example.com")
    body["signature"]["signature"] = "0" * 64
    assert post(body) == 400
    assert not Attempt.objects.exists() and not Suppression.objects.exists()
