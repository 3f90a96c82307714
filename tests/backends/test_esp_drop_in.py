"""Django's own mail API through the drop-in backend to an ESP over real HTTP (issue 40, item 6).

A site that sends through django-anymail adopts the outbox with
``EMAIL_BACKEND = "outbox.backends.OutboxBackend"`` (Django 6.1: the default
mailer) and anymail's backend as the worker's target. Here that target is
anymail's real Postmark backend, and Postmark is tests/esp.py's FakeESP, a
real HTTP server on loopback; an in-process worker delivers. What the fake
received must be what anymail alone would have sent for the message the
caller wrote: one request per message, To, Cc and Bcc as written, the
caller's subject and body, and no header the caller did not write. Each
recipient's row ends ``sent``, with the ESP's message id on its attempt.

Covered: ``send_mail``, ``EmailMessage.send()`` with To, Cc and Bcc, the
password-reset view through Django's test client, and ``mail_admins``.
"""

from __future__ import annotations

import re
from typing import Any

import django
import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage, mail_admins, send_mail

from outbox.models import Attempt, Delivery
from tests.cells import EACH_DJANGO_AND_DATABASE, only_in_cells
from tests.delivery import deliver, use_outbox
from tests.esp import POSTMARK_BACKEND, FakeESP, anymail_settings

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells(
        *EACH_DJANGO_AND_DATABASE,
        why="an in-process worker and a fake ESP; one cell per Django and database",
    ),
]

# Headers only the outbox could have added: the caller's message has none of them.
NOT_THE_CALLERS = {"message-id", "to", "cc", "bcc"}


@pytest.fixture(autouse=True)
def through_postmark(esp: FakeESP, settings) -> None:
    """The project's mail goes into the outbox; the worker delivers through anymail's Postmark."""
    esp.reset()
    use_outbox(settings, POSTMARK_BACKEND)
    settings.ANYMAIL = anymail_settings(esp.url, 5.0)


def requests_received(esp: FakeESP) -> list[dict[str, Any]]:
    with esp.lock:
        return list(esp.bodies)


def header_names(request: dict[str, Any]) -> set[str]:
    return {header["Name"].lower() for header in request.get("Headers", [])}


def assert_sent_with_esp_id(recipients: list[str], esp_id: str) -> None:
    """Each recipient's row is ``sent`` and its attempt carries the ESP's id of the one request."""
    rows = {d.recipient: d for d in Delivery.objects.all()}
    assert sorted(rows) == sorted(recipients)
    for recipient, row in rows.items():
        assert row.status == Delivery.Status.SENT, (recipient, row.status, row.last_error)
        ids = set(Attempt.objects.filter(delivery=row).values_list("esp_message_id", flat=True))
        assert ids == {esp_id}, (recipient, ids)


def the_esp_id(esp: FakeESP) -> str:
    """The ESP's one message id for the one request (each recipient is kept with it)."""
    with esp.lock:
        [esp_id] = {accepted.esp_id for accepted in esp.accepted}
    return esp_id


def the_one_request(esp: FakeESP) -> dict[str, Any]:
    received = requests_received(esp)
    assert len(received) == 1, [r.get("To") for r in received]
    return received[0]


def test_send_mail_is_one_request_to_every_recipient(esp: FakeESP) -> None:
    assert send_mail(
        "Order shipped", "Your order is on its way.", "shop@example.com",
        ["Ann <ann@example.com>", "bob@example.com"],
    ) == 1  # fmt: skip
    deliver()

    request = the_one_request(esp)
    assert request["To"] == "Ann <ann@example.com>, bob@example.com"
    assert "Cc" not in request and "Bcc" not in request
    assert request["From"] == "shop@example.com"
    assert request["Subject"] == "Order shipped"
    assert request["TextBody"] == "Your order is on its way."
    assert not header_names(request) & NOT_THE_CALLERS, request.get("Headers")
    assert_sent_with_esp_id(["Ann <ann@example.com>", "bob@example.com"], the_esp_id(esp))


def test_to_cc_and_bcc_as_written_in_one_request(esp: FakeESP) -> None:
    message = EmailMessage(
        "Minutes", "The minutes of Monday.", "Board <board@example.com>",
        to=["ann@example.com", "Bob <bob@example.com>"],
        cc=["carol@example.com"],
        bcc=["dave@example.com", "erin@example.com"],
        headers={"X-Meeting": "monday"},
    )  # fmt: skip
    assert message.send() == 1
    deliver()

    request = the_one_request(esp)
    assert request["To"] == "ann@example.com, Bob <bob@example.com>"
    assert request["Cc"] == "carol@example.com"
    assert request["Bcc"] == "dave@example.com, erin@example.com"
    assert request["From"] == "Board <board@example.com>"
    assert request["Subject"] == "Minutes"
    assert request["TextBody"] == "The minutes of Monday."
    # The caller's own header, and none of the outbox's.
    assert {h["Name"]: h["Value"] for h in request.get("Headers", [])} == {"X-Meeting": "monday"}
    assert_sent_with_esp_id(
        ["ann@example.com", "Bob <bob@example.com>", "carol@example.com",
         "dave@example.com", "erin@example.com"],
        the_esp_id(esp),
    )  # fmt: skip


def test_password_reset_view(esp: FakeESP, client) -> None:
    User.objects.create_user("alice", "alice@example.com", "old-password-1")
    response = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    assert response.status_code == 302
    deliver()

    request = the_one_request(esp)
    assert request["To"] == "alice@example.com"
    assert request["Subject"] == "Password reset on testserver"
    assert re.search(r"http://testserver/accounts/reset/\S+/", request["TextBody"])
    assert not header_names(request) & NOT_THE_CALLERS, request.get("Headers")
    assert_sent_with_esp_id(["alice@example.com"], the_esp_id(esp))


def test_mail_admins_to_two_admins(esp: FakeESP, settings) -> None:
    # Django 6.0 takes addresses and deprecates the (name, address) tuples.
    if django.VERSION >= (6, 0):
        settings.ADMINS = ["Ops <ops@example.com>", "dev@example.com"]
        admins = ["Ops <ops@example.com>", "dev@example.com"]
    else:
        settings.ADMINS = [("Ops", "ops@example.com"), ("Dev", "dev@example.com")]
        admins = ["ops@example.com", "dev@example.com"]  # Django 5.2 drops the names
    settings.SERVER_EMAIL = "server@example.com"
    mail_admins("Disk full", "The disk is full.")
    deliver()

    request = the_one_request(esp)
    assert request["To"] == ", ".join(admins)
    assert request["From"] == "server@example.com"
    assert request["Subject"] == "[Django] Disk full"
    assert request["TextBody"] == "The disk is full."
    assert not header_names(request) & NOT_THE_CALLERS, request.get("Headers")
    assert_sent_with_esp_id(admins, the_esp_id(esp))
