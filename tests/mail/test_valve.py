"""The staging valve: OUTBOX["ALLOWED_RECIPIENTS"] and OUTBOX["REDIRECT_TO"].

Every way into the outbox (enqueue_email, the drop-in backend, templates,
enqueue_many, async enqueue, an operator's requeue) and rows written before
the valve was switched on, delivered by a burst worker to locmem or to a real
SMTP server on loopback; the system checks; and outbox_status, the dashboard
and the metrics saying that the valve is on.
"""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core import mail
from django.core.mail import EmailMessage, EmailMultiAlternatives, send_mail
from django.core.management import call_command

from outbox import aenqueue_email, enqueue_email, enqueue_many, enqueue_template, operations
from outbox.mail import valve
from outbox.models import Attempt, Delivery, EmailTemplate
from outbox.worker import Worker
from tests.checking import outbox_checks
from tests.delivery import use_outbox, use_smtp_delivery
from tests.servers import SMTPRecorder

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
QA = "qa@shop.test"
HEADER = "X-Outbox-Original-Recipient"


def set_valve(settings, allowed, redirect=None) -> None:
    """Switch the valve, keeping the rest of OUTBOX (the delivery target included)."""
    settings.OUTBOX = {**settings.OUTBOX, "ALLOWED_RECIPIENTS": allowed, "REDIRECT_TO": redirect}


def deliver() -> None:
    assert Worker(burst=True).run(install_signal_handlers=False) == 0


def stored(rows) -> dict[str, Delivery]:
    return {d.recipient: Delivery.objects.get(pk=d.pk) for d in rows}


@pytest.fixture
def locmem(settings):
    use_outbox(settings)
    mail.outbox = []
    return mail.outbox


@pytest.fixture
def smtp(settings):
    server = SMTPRecorder().start()
    use_smtp_delivery(settings, server)
    yield server
    server.stop()


# -- matching ---------------------------------------------------------------------------


def test_patterns_match_the_bare_address_ignoring_case(settings):
    set_valve(settings, ["*@Example.com", "qa@shop.test", "*@bücher.de"])
    assert valve.allows("a@example.com") and valve.allows("Ann <ANN@EXAMPLE.COM>")
    assert valve.allows("QA@Shop.Test") and not valve.allows("qa2@shop.test")
    assert not valve.allows("a@sub.example.com") and not valve.allows("a@example.com.evil")
    # Both forms of an internationalised domain, as the suppression list compares them.
    assert valve.allows("jö <user@Bücher.de>") and valve.allows("user@xn--bcher-kva.de")


def test_none_lets_everyone_through_and_an_empty_list_nobody(settings):
    assert valve.allows("anyone@anywhere.test") and valve.state()["on"] is False
    set_valve(settings, [])
    assert not valve.allows("anyone@example.com") and valve.state()["on"] is True
    # A string by mistake is one pattern, never its characters ("*" would match all).
    set_valve(settings, "*@example.com")
    assert valve.allows("a@example.com") and not valve.allows("a@other.test")


def test_admit_looks_at_every_envelope_address(settings):
    """The guarantee is on the copy as built, not on what the row says."""
    set_valve(settings, ["*@example.com"])
    message = EmailMessage("s", "b", "shop@example.com", ["a@example.com"], bcc=["x@other.test"])
    with pytest.raises(valve.NotAllowedRecipient, match=r"not an allowed recipient: x@other\.test"):
        valve.admit(message, "a@example.com")
    set_valve(settings, ["*@example.com"], QA)
    redirected, note = valve.admit(message, "a@example.com")
    assert redirected.recipients() == [QA] and redirected.extra_headers[HEADER] == "a@example.com"
    assert message.recipients() == ["a@example.com", "x@other.test"]  # the original is untouched
    assert QA in note
    allowed, note = valve.admit(EmailMessage("s", "b", None, ["b@example.com"]), "b@example.com")
    assert note == "" and allowed.recipients() == ["b@example.com"]


# -- without REDIRECT_TO: cancelled at enqueue, on every path ---------------------------------


def assert_cancelled_by_the_valve(row: Delivery) -> None:
    row = Delivery.objects.get(pk=row.pk)
    assert row.status == Status.CANCELLED, row
    assert row.last_error.startswith("not an allowed recipient: ")


def test_enqueue_email_cancels_who_is_not_allowed_and_sends_the_rest(settings, locmem, queue):
    set_valve(settings, ["*@example.com"])
    rows = enqueue_email("Hi", "Body", None, ["a@example.com", "Bob <bob@customer.test>"])
    [one] = enqueue_email(
        "Hi", "Body", None, ["carol@customer.test"]
    )  # one recipient: its own path
    by = stored(rows)
    assert_cancelled_by_the_valve(by["Bob <bob@customer.test>"])
    assert "bob@customer.test" in by["Bob <bob@customer.test>"].last_error
    assert_cancelled_by_the_valve(one)
    # What the call returned says so too, and only the allowed row reached Redis.
    assert [d.status for d in rows] == [Status.QUEUED, Status.CANCELLED]
    assert queue.waiting_ids() == {by["a@example.com"].pk}
    deliver()
    assert [m.to for m in locmem] == [["a@example.com"]]
    assert Delivery.objects.get(pk=by["a@example.com"].pk).status == Status.SENT


def test_every_enqueue_path_cancels(settings, locmem, queue):
    set_valve(settings, ["*@example.com"])
    EmailTemplate.objects.create(name="t", subject="s", text="t")
    rows = [
        *enqueue_template("t", {}, None, ["x@customer.test"]),
        *enqueue_email("s", "b", None, ["x@customer.test"], idempotency_key="k1"),
        *enqueue_email("s", "b", None, ["x@customer.test"], attachments=[("a.txt", "hi", None)]),
        *async_to_sync(aenqueue_email)("s", "b", None, ["x@customer.test"]),
    ]
    for created in enqueue_many(
        [
            {"template": "t", "recipient_list": ["x@customer.test", "ok@example.com"]},
            {"subject": "s", "message": "b", "recipient_list": ["y@customer.test"]},
            {
                "subject": "s",
                "message": "b",
                "recipient_list": ["z@customer.test"],
                "idempotency_key": "k2",
            },
        ]
    ):
        rows += created
    # The drop-in backend: send_mail(), and a message with To, Cc and Bcc.
    send_mail("s", "b", None, ["w@customer.test"])
    EmailMessage(
        "s", "b", None, ["to@customer.test"], cc=["cc@example.com"], bcc=["bcc@x.test"]
    ).send()
    backend_rows = list(
        Delivery.objects.filter(email__subject="s").exclude(pk__in=[d.pk for d in rows])
    )
    everything = rows + backend_rows
    allowed = [d for d in everything if d.recipient.endswith("@example.com")]
    assert sorted(d.recipient for d in allowed) == ["cc@example.com", "ok@example.com"]
    for row in everything:
        if row not in allowed:
            assert_cancelled_by_the_valve(row)
    assert queue.waiting_ids() == {d.pk for d in allowed}
    deliver()
    assert sorted(r for m in locmem for r in m.recipients()) == ["cc@example.com", "ok@example.com"]


# -- rows written before the valve was switched on: the worker's guarantee -------------------


def test_old_rows_are_cancelled_by_the_worker(settings, locmem):
    """Production data copied to staging, then workers started there."""
    rows = enqueue_email("Old", "Body", None, ["customer@real.test", "qa@example.com"])
    assert {d.status for d in rows} == {Status.QUEUED}
    set_valve(settings, ["*@example.com"])
    deliver()
    by = stored(rows)
    assert_cancelled_by_the_valve(by["customer@real.test"])
    assert by["customer@real.test"].attempts == 0  # never handed over: not an attempt
    [attempt] = Attempt.objects.filter(delivery=by["customer@real.test"])
    assert (
        attempt.outcome == Attempt.Outcome.CANCELLED and "not an allowed recipient" in attempt.error
    )
    assert attempt.actor == by["customer@real.test"].worker_id != ""
    assert by["qa@example.com"].status == Status.SENT
    assert [m.to for m in locmem] == [["qa@example.com"]]


def test_old_rows_are_redirected_by_the_worker(settings, smtp):
    rows = enqueue_email(
        "Old",
        "Body",
        "shop@example.com",
        ["Customer <customer@real.test>", "qa@example.com"],
        headers={"X-Order": "7"},
    )
    set_valve(settings, ["*@example.com"], QA)
    deliver()
    by = stored(rows)
    assert {d.status for d in by.values()} == {Status.SENT}
    received = {tuple(r.rcpt_tos): r.message for r in smtp.received}
    assert set(received) == {(QA,), ("qa@example.com",)}
    redirected = received[(QA,)]
    assert redirected["To"] == QA and redirected["Cc"] is None
    assert redirected[HEADER] == "Customer <customer@real.test>"
    assert redirected["X-Order"] == "7"
    assert redirected["Message-ID"] == by["Customer <customer@real.test>"].message_id
    assert received[("qa@example.com",)][HEADER] is None
    # The row keeps its recipient; the attempt log says where the copy went.
    [note] = Attempt.objects.filter(delivery=by["Customer <customer@real.test>"])
    assert note.outcome == Attempt.Outcome.SENT
    assert note.error == f"staging valve: sent to {QA} instead of Customer <customer@real.test>"
    assert not Attempt.objects.filter(delivery=by["qa@example.com"]).exists()


def test_the_worker_log_names_where_a_redirected_copy_went(settings, locmem, caplog):
    rows = enqueue_email("Old", "Body", None, ["Zed <zed@customer.test>", "qa@example.com"])
    set_valve(settings, ["*@example.com"], QA)
    caplog.set_level(logging.DEBUG, logger="outbox.worker")
    deliver()
    by = stored(rows)
    zed, own = by["Zed <zed@customer.test>"].pk, by["qa@example.com"].pk
    sent = sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("sent "))
    assert sent == sorted(
        [
            f"sent delivery {zed} to {QA} (redirected from Zed <zed@customer.test>)",
            f"sent delivery {own} to qa@example.com",  # allowed: its own address, as before
        ]
    )
    assert sorted(m.to[0] for m in locmem) == sorted([QA, "qa@example.com"])


def test_a_drop_in_message_is_redirected_copy_by_copy(settings, smtp):
    set_valve(settings, ["*@example.com"], QA)
    message = EmailMultiAlternatives(
        "Invite",
        "Text",
        "shop@example.com",
        ["Ann <ann@customer.test>", "ok@example.com"],
        cc=["cc@customer.test"],
        bcc=["hidden@customer.test"],
        headers={"X-Kind": "invite"},
    )
    message.attach_alternative("<p>Hi</p>", "text/html")
    assert message.send() == 1
    rows = list(Delivery.objects.all())
    assert {d.status for d in rows} == {Status.QUEUED}  # redirected, not cancelled
    deliver()
    assert {d.status for d in Delivery.objects.all()} == {Status.SENT}
    copies = {}
    for r in smtp.received:
        copies.setdefault(tuple(r.rcpt_tos), []).append(r.message)
    assert len(copies[(QA,)]) == 3 and len(copies[("ok@example.com",)]) == 1
    originals = sorted(m[HEADER] for m in copies[(QA,)])
    assert originals == ["Ann <ann@customer.test>", "cc@customer.test", "hidden@customer.test"]
    for m in copies[(QA,)]:
        assert m["To"] == QA and m["Cc"] is None and m["X-Kind"] == "invite"
        assert m.get_body(("html",)).get_content().strip() == "<p>Hi</p>"
    # The allowed copy is Django's message as written, To and Cc and all.
    [allowed] = copies[("ok@example.com",)]
    assert allowed["To"] == "Ann <ann@customer.test>, ok@example.com"
    assert allowed["Cc"] == "cc@customer.test" and allowed[HEADER] is None


def test_a_redirected_row_is_found_by_its_original_address_in_the_admin(settings, admin_client):
    use_outbox(settings)
    set_valve(settings, ["*@example.com"], QA)
    [row] = enqueue_email("Hi", "Body", None, ["bob@customer.test"])
    assert row.status == Status.QUEUED and row.recipient == "bob@customer.test"
    page = admin_client.get("/admin/outbox/delivery/", {"q": "bob@customer.test"}).content.decode()
    assert "bob@customer.test \u2192 qa@shop.test" in page
    detail = admin_client.get(f"/admin/outbox/delivery/{row.pk}/change/").content.decode()
    assert "staging valve" in detail.lower() and "a copy goes to qa@shop.test instead" in detail
    set_valve(settings, None)
    detail = admin_client.get(f"/admin/outbox/delivery/{row.pk}/change/").content.decode()
    assert "a copy goes to" not in detail


# -- requeues --------------------------------------------------------------------------------


def test_an_operator_requeue_is_stopped_again_while_the_valve_is_on(settings, locmem):
    set_valve(settings, ["*@example.com"])
    [row] = enqueue_email("Hi", "Body", None, ["bob@customer.test"])
    assert_cancelled_by_the_valve(row)
    assert operations.requeue([row.pk], "admin:ops").changed == [row.pk]
    deliver()
    assert_cancelled_by_the_valve(row)
    assert locmem == []
    # With the valve off, the same requeue sends it to its recipient.
    set_valve(settings, None)
    operations.requeue([row.pk], "admin:ops")
    deliver()
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT
    assert [m.to for m in locmem] == [["bob@customer.test"]]


def test_a_requeue_with_a_redirect_goes_to_the_redirect(settings, smtp):
    [row] = enqueue_email("Hi", "Body", None, ["bob@customer.test"])
    operations.cancel([row.pk], "admin:ops")
    set_valve(settings, ["*@example.com"], QA)
    operations.requeue([row.pk], "admin:ops")
    deliver()
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT
    [received] = smtp.received
    assert received.rcpt_tos == [QA] and received.message[HEADER] == "bob@customer.test"


# -- the system checks -----------------------------------------------------------------------


def ids(deploy: bool = False) -> list[str]:
    return [m.id for m in outbox_checks(deploy=deploy)]


def test_a_valid_valve_passes_and_warns_only_on_deploy(settings):
    set_valve(settings, ["*@example.com", "qa@shop.test"], "QA <qa@shop.test>")
    assert ids() == []
    [warning] = [m for m in outbox_checks(deploy=True) if m.id == "outbox.W012"]
    assert "redirected to 'QA <qa@shop.test>'" in warning.msg
    set_valve(settings, None)
    assert "outbox.W012" not in ids(deploy=True)


@pytest.mark.parametrize(
    "allowed",
    ["*@example.com", ["example.com"], ["Name <a@example.com>"], ["a @example.com"], [""], [3]],
)
def test_e023_bad_patterns(settings, allowed):
    set_valve(settings, allowed)
    assert ids() == ["outbox.E023"]


@pytest.mark.parametrize("redirect", ["not an address", "a@example.com, b@example.com", 7])
def test_e024_a_redirect_that_is_not_one_address(settings, redirect):
    set_valve(settings, ["*@example.com"], redirect)
    assert ids() == ["outbox.E024"]


def test_e024_a_redirect_without_the_valve(settings):
    set_valve(settings, None, QA)
    [error] = outbox_checks()
    assert error.id == "outbox.E024" and "valve is off" in error.msg


# -- outbox_status, the dashboard and the metrics say that it is on --------------------------


def test_outbox_status_shows_the_valve(settings):
    out = StringIO()
    call_command("outbox_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["valve"] == {
        "on": False,
        "allowed_recipients": None,
        "redirect_to": None,
    }
    call_command("outbox_status", stdout=(text := StringIO()))
    assert "STAGING VALVE" not in text.getvalue()
    set_valve(settings, ["*@example.com"], QA)
    call_command("outbox_status", "--json", stdout=(out := StringIO()))
    assert json.loads(out.getvalue())["valve"] == {
        "on": True,
        "allowed_recipients": ["*@example.com"],
        "redirect_to": QA,
    }
    call_command("outbox_status", stdout=(text := StringIO()))
    first = text.getvalue().splitlines()[2]
    assert first.startswith("STAGING VALVE ON: only *@example.com get mail")
    assert "goes to qa@shop.test" in first
    set_valve(settings, [])
    call_command("outbox_status", stdout=(text := StringIO()))
    assert "only (none) get mail; mail to anyone else is cancelled" in text.getvalue()


def test_the_dashboard_shows_the_valve(settings, admin_client):
    url = "/admin/outbox/dashboard/"
    assert 'id="outbox-valve"' not in admin_client.get(url).content.decode()
    set_valve(settings, ["*@example.com", "qa@shop.test"])
    page = admin_client.get(url).content.decode()
    assert 'id="outbox-valve"' in page and "Staging valve on." in page
    assert "*@example.com, qa@shop.test" in page and "mail to anyone else is cancelled" in page


def test_the_metrics_show_the_valve(settings, client):
    def gauge() -> str:
        response = client.get("/outbox/metrics", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200
        [line] = [
            line
            for line in response.content.decode().splitlines()
            if line.startswith("outbox_staging_valve ")
        ]
        return line

    token = settings.OUTBOX["METRICS_TOKEN"]
    assert gauge() == "outbox_staging_valve 0"
    set_valve(settings, ["*@example.com"])
    assert gauge() == "outbox_staging_valve 1"
