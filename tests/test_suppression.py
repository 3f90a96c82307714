"""The suppression list: at enqueue (one query, cancelled rows, nothing pushed) and after a refusal.

The refusal tests run the real worker against aiosmtpd servers on loopback: one
answers 550 to RCPT for one address, one answers 554 to DATA.
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage
from django.db import connection
from django.test.utils import CaptureQueriesContext

from outbox import enqueue_email, enqueue_many, enqueue_template, suppress, unsuppress
from outbox.backends import OutboxBackend
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Delivery, EmailTemplate, Suppression
from outbox.suppression import add_refused
from outbox.worker import Worker
from tests.delivery import SMTP, use_smtp
from tests.servers import SMTPRecorder

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def test_suppress_and_unsuppress_compare_case_insensitively():
    assert suppress("  Bob@Example.COM ", "asked us to stop") is True
    assert suppress("bob@example.com") is False
    row = Suppression.objects.get()
    assert (row.address, row.reason, row.source) == ("bob@example.com", "asked us to stop", "api")
    assert unsuppress("BOB@example.com") is True
    assert unsuppress("bob@example.com") is False
    assert not Suppression.objects.exists()


def test_admin_form_rejects_a_case_variant_of_a_listed_address():
    suppress("a@example.com")
    with pytest.raises(ValidationError):
        Suppression(address="A@Example.com").full_clean()


def test_a_suppressed_recipient_gets_a_cancelled_row_and_no_push(queue):
    suppress("Blocked@example.com", "hard bounce last week")
    rows = enqueue_email(
        "Hi", "Body", None, ["ok@example.com", "Someone <BLOCKED@example.com>", "b@example.com"]
    )
    by = {d.recipient: d for d in rows}
    blocked = by["Someone <BLOCKED@example.com>"]
    assert blocked.status == Status.CANCELLED
    assert "blocked@example.com" in blocked.last_error
    assert "hard bounce last week" in blocked.last_error
    stored = Delivery.objects.get(pk=blocked.pk)
    assert (stored.status, stored.last_error) == (blocked.status, blocked.last_error)
    assert {d.status for r, d in by.items() if r != blocked.recipient} == {Status.QUEUED}
    assert queue.waiting_ids() == {by["ok@example.com"].pk, by["b@example.com"].pk}


def test_suppression_also_holds_for_templates_bulk_idempotent_calls_and_the_backend(queue):
    suppress("x@example.com")
    EmailTemplate.objects.create(name="t", subject="s", text="t")
    via_template = enqueue_template("t", {}, None, ["x@example.com"])
    via_key = enqueue_email("s", "b", None, ["x@example.com"], idempotency_key="k1")
    [via_bulk] = enqueue_many([{"template": "t", "recipient_list": ["x@example.com"]}])
    backend = OutboxBackend()
    assert backend.send_messages([EmailMessage("s", "b", None, ["x@example.com"])]) == 1
    rows = [*via_template, *via_key, *via_bulk]
    assert {d.status for d in rows} == {Status.CANCELLED}
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    assert Delivery.objects.count() == 4
    assert queue.waiting_ids() == set()


def test_one_query_for_the_suppression_list_per_call():
    suppress("z@example.com")
    recipients = [f"u{i}@example.com" for i in range(300)] + ["z@example.com"]
    with CaptureQueriesContext(connection) as queries:
        rows = enqueue_email("s", "b", None, recipients)
    # On PostgreSQL the look-up is inside the insert (outbox_enqueue() by default).
    looked_up = [
        q["sql"]
        for q in queries.captured_queries
        if "outbox_suppression" in q["sql"] or "outbox_enqueue(" in q["sql"]
    ]
    assert len(looked_up) == 1
    assert [d.status for d in rows].count(Status.CANCELLED) == 1


def run_worker() -> None:
    Worker(burst=True).run(install_signal_handlers=False)


def test_a_550_at_rcpt_suppresses_that_recipient_only(settings):
    server = SMTPRecorder(refuse={"gone@example.com": "550 5.1.1 no such user"}).start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0)
        rows = enqueue_email(
            "Hi", "Body", "shop@example.com", ["gone@example.com", "ok@example.com"]
        )
        run_worker()
    finally:
        server.stop()
    status = {d.recipient: Delivery.objects.get(pk=d.pk).status for d in rows}
    assert status == {"gone@example.com": Status.FAILED, "ok@example.com": Status.SENT}
    [row] = Suppression.objects.all()
    assert (row.address, row.source) == ("gone@example.com", Suppression.Source.REFUSAL)
    assert "550" in row.reason
    # The next email to that address is cancelled at enqueue.
    [later] = enqueue_email("Again", "Body", None, ["Gone@Example.com"])
    assert later.status == Status.CANCELLED


def test_a_refusal_does_not_suppress_when_the_setting_is_off(settings):
    server = SMTPRecorder(refuse={"gone@example.com": "550 5.1.1 no such user"}).start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0, SUPPRESS_ON_REFUSAL=False)
        [row] = enqueue_email("Hi", "Body", None, ["gone@example.com"])
        run_worker()
    finally:
        server.stop()
    assert Delivery.objects.get(pk=row.pk).status == Status.FAILED
    assert not Suppression.objects.exists()


def test_a_554_at_data_fails_the_row_but_suppresses_nobody(settings):
    server = SMTPRecorder(data_reply="554 5.7.1 message rejected as spam").start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0)
        [row] = enqueue_email("Hi", "Body", None, ["someone@example.com"])
        run_worker()
    finally:
        server.stop()
    row.refresh_from_db()
    assert row.status == Status.FAILED and "554" in row.last_error
    assert not Suppression.objects.exists()


def test_a_451_at_rcpt_is_retried_and_suppresses_nobody(settings):
    server = SMTPRecorder(refuse={"later@example.com": "451 4.3.0 try later"}).start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0, RETRY_BACKOFF=(60.0, 60.0))
        [row] = enqueue_email("Hi", "Body", None, ["later@example.com"])
        run_worker()
    finally:
        server.stop()
    assert Delivery.objects.get(pk=row.pk).status == Status.QUEUED
    assert not Suppression.objects.exists()


# -- internationalised domains: one form everywhere -------------------------------------

UNICODE = "user@bücher.de"
PUNYCODE = "user@xn--bcher-kva.de"  # what Django's SMTP backend puts in RCPT TO


def test_suppress_stores_the_idna_form_and_matches_either_form():
    assert suppress("User@BÜCHER.de", "asked us to stop") is True
    assert Suppression.objects.get().address == PUNYCODE
    assert suppress(PUNYCODE) is False
    assert unsuppress(UNICODE) is True
    assert not Suppression.objects.exists()


def test_admin_form_stores_the_idna_form_and_rejects_the_other_form():
    Suppression(address=UNICODE).save()
    assert Suppression.objects.get().address == PUNYCODE
    with pytest.raises(ValidationError):
        Suppression(address=PUNYCODE.upper()).full_clean()
    with pytest.raises(ValidationError):
        Suppression(address="USER@Bücher.de").full_clean()


def test_admin_search_finds_an_idna_address_by_its_unicode_form(admin_client):
    suppress(PUNYCODE)
    response = admin_client.get("/admin/outbox/suppression/", {"q": "bücher.de"})
    assert response.status_code == 200
    assert PUNYCODE in response.content.decode()


def test_a_refusal_stored_in_idna_form_stops_every_enqueue_path(queue):
    add_refused([PUNYCODE], "550 5.1.1 no such user")
    EmailTemplate.objects.create(name="t", subject="s", text="t")
    rows = [
        *enqueue_email("s", "b", None, ["Jö <User@Bücher.de>"]),
        *enqueue_email("s", "b", None, [UNICODE, "ok@example.com"]),
        *enqueue_email("s", "b", None, [UNICODE], idempotency_key="k1"),
        *enqueue_template("t", {}, None, [UNICODE]),
    ]
    for created in enqueue_many(
        [
            {"template": "t", "recipient_list": [UNICODE]},
            {"subject": "s", "message": "b", "recipient_list": [UNICODE]},
        ]
    ):
        rows += created
    assert OutboxBackend().send_messages([EmailMessage("s", "b", None, [UNICODE])]) == 1
    by_status = {d.recipient: d.status for d in rows if d.recipient == "ok@example.com"}
    assert by_status == {"ok@example.com": Status.QUEUED}
    stopped = [d for d in rows if d.recipient != "ok@example.com"]
    assert {d.status for d in stopped} == {Status.CANCELLED}
    assert all(PUNYCODE in d.last_error for d in stopped)
    assert (
        Delivery.objects.exclude(recipient="ok@example.com")
        .exclude(status=Status.CANCELLED)
        .count()
        == 0
    )
    assert queue.waiting_ids() == {d.pk for d in rows if d.recipient == "ok@example.com"}


def test_a_550_to_an_idn_address_suppresses_the_address_as_written(settings):
    server = SMTPRecorder(refuse={PUNYCODE: "550 5.1.1 no such user"}).start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=5.0)
        [row] = enqueue_email("Hi", "Body", "shop@example.com", [UNICODE])
        run_worker()
    finally:
        server.stop()
    assert Delivery.objects.get(pk=row.pk).status == Status.FAILED
    assert list(Suppression.objects.values_list("address", flat=True)) == [PUNYCODE]
    [later] = enqueue_email("Again", "Body", None, ["User@Bücher.DE"])
    assert later.status == Status.CANCELLED


def test_the_migration_rewrites_unicode_rows_and_drops_duplicates():
    from django.apps import apps

    migration = import_module("outbox.migrations.0010_suppression_idna_addresses")
    suppress(PUNYCODE, "refused")
    suppress("other@example.com")
    # Rows written before the change: stored as given, lower-cased (bypassing save()).
    Suppression.objects.bulk_create(
        [Suppression(address=UNICODE, reason="dup"), Suppression(address="a@straße.de")]
    )
    migration.encode_domains(apps, SimpleNamespace(connection=connection))
    rows = dict(Suppression.objects.values_list("address", "reason"))
    assert rows == {PUNYCODE: "refused", "other@example.com": "", "a@strasse.de": ""}


# -- a delivery backend configured with fail_silently -----------------------------------


@pytest.mark.parametrize("via", ["worker's mailer", "email's mailer"])
def test_a_silent_delivery_backend_still_fails_and_suppresses_a_550(settings, via):
    if via == "worker's mailer" and not HAS_MAILERS:
        pytest.skip("Django 5.2 creates OUTBOX['EMAIL_BACKEND'] without options")
    server = SMTPRecorder(refuse={"gone@example.com": "550 5.1.1 no such user"}).start()
    try:
        # A retry would be an hour away: a swallowed refusal would leave the row queued.
        use_smtp(settings, server.port, 5.0, SEND_TIMEOUT=5.0, RETRY_BACKOFF=(3600.0, 3600.0))
        silent = {
            "BACKEND": SMTP,
            "OPTIONS": {"host": "127.0.0.1", "port": server.port, "fail_silently": True},
        }
        mailer = None
        if via == "worker's mailer":
            settings.MAILERS = {**settings.MAILERS, "delivery": silent}
        elif HAS_MAILERS:
            settings.MAILERS = {**settings.MAILERS, "quiet": silent}
            mailer = "quiet"
        else:
            settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {"quiet": silent}}
            mailer = "quiet"
        [row] = enqueue_email("Hi", "Body", None, ["gone@example.com"], mailer=mailer)
        run_worker()
    finally:
        server.stop()
    row.refresh_from_db()
    assert row.status == Status.FAILED and "550" in row.last_error
    assert list(Suppression.objects.values_list("address", "source")) == [
        ("gone@example.com", Suppression.Source.REFUSAL)
    ]
