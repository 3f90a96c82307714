"""OutboxBackend: Django's mail API into the outbox, and the fan-out of To/Cc/Bcc.

On Django 5.2 the outbox is EMAIL_BACKEND and the worker delivers through
OUTBOX["EMAIL_BACKEND"]; on 6.1 it is the "default" mailer and the worker
delivers through the mailer OUTBOX["MAILER"]. Neither may warn.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from email.message import MIMEPart
from email.mime.application import MIMEApplication
from email.mime.image import MIMEImage

import django
import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail import EmailMessage, EmailMultiAlternatives, mail_admins, send_mail
from django.core.mail.message import BadHeaderError
from django.db import transaction
from django.utils.translation import gettext_lazy

from outbox import enqueue_email
from outbox.backends import OutboxBackend
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Attachment, Delivery, Email
from outbox.queue import RedisQueue
from tests.delivery import OUTBOX_BACKEND, deliver, use_outbox, use_smtp, use_smtp_delivery
from tests.servers import ScriptedSMTP, SMTPRecorder

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("error::DeprecationWarning", "error::PendingDeprecationWarning"),
]

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))

# Django 6.0 takes email.message.MIMEPart attachments and deprecates MIMEBase ones.
MIMEPART_ATTACHMENTS = django.VERSION >= (6, 0)


@pytest.fixture
def outbox(settings) -> None:
    use_outbox(settings)


def ready_ids(queue: RedisQueue) -> list[int]:
    return sorted(int(x) for x in queue.redis.lrange(queue.ready_key("normal"), 0, -1))


def attach_part(message: EmailMessage, filename: str, content: bytes, mimetype: str) -> None:
    """Attach a MIME object the way the running Django version supports without warning."""
    maintype, subtype = mimetype.split("/")
    if MIMEPART_ATTACHMENTS:
        part = MIMEPart()
        part.set_content(content, maintype=maintype, subtype=subtype, filename=filename)
    else:
        part = MIMEApplication(content, _subtype=subtype)
        part.add_header("Content-Disposition", "attachment", filename=filename)
    message.attach(part)


# -- Django's mail API goes into the outbox -----------------------------------------


def test_send_mail_is_queued_not_sent(outbox, outbox_mail, queue):
    sent = send_mail("Hello", "Body", "shop@example.com", ["a@example.com", "b@example.com"])
    assert sent == 1
    assert outbox_mail == []  # nothing delivered yet: it is in the outbox
    email = Email.objects.get()
    assert email.structure["to"] == ["a@example.com", "b@example.com"]
    deliveries = list(Delivery.objects.order_by("recipient"))
    assert [d.recipient for d in deliveries] == ["a@example.com", "b@example.com"]
    assert all(d.status == "queued" and d.priority == "normal" for d in deliveries)
    assert ready_ids(queue) == sorted(d.pk for d in deliveries)

    deliver()
    assert sorted(m.to[0] for m in outbox_mail) == ["a@example.com", "b@example.com"]
    for message in outbox_mail:
        # send_mail's promise: everyone sees all recipients in To.
        assert message.message()["To"] == "a@example.com, b@example.com"
        assert message.recipients() == message.to
    assert {m.extra_headers["Message-ID"] for m in outbox_mail} == {
        d.message_id for d in deliveries
    }
    assert Delivery.objects.filter(status="sent").count() == 2


def test_html_alternative_attachments_and_headers_survive(outbox, outbox_mail):
    message = EmailMultiAlternatives(
        subject="Your invoice",
        body="Plain text",
        from_email="Shop <shop@example.com>",
        to=["a@example.com"],
        cc=["c@example.com"],
        bcc=["d@example.com"],
        reply_to=["help@example.com"],
        headers={"X-Campaign": "spring", "List-Unsubscribe": "<mailto:u@example.com>"},
    )
    message.attach_alternative("<p>HTML</p>", "text/html")
    message.attach("invoice.png", PNG, "image/png")
    message.attach("notes.txt", "héllo", "text/plain")
    attach_part(message, "data.bin", b"\x00\x01binary", "application/octet-stream")
    assert message.send() == 1

    assert Email.objects.count() == 1
    assert Attachment.objects.count() == 3  # stored once for three recipients
    assert Delivery.objects.count() == 3
    deliver()
    assert len(outbox_mail) == 3
    for copy in outbox_mail:
        parsed = copy.message()
        assert parsed["Reply-To"] == "help@example.com"
        assert parsed["X-Campaign"] == "spring"
        assert parsed["List-Unsubscribe"] == "<mailto:u@example.com>"
        assert parsed["From"] == "Shop <shop@example.com>"
        assert copy.body == "Plain text"
        assert [tuple(a) for a in copy.alternatives] == [("<p>HTML</p>", "text/html")]
        *files, part = copy.attachments
        assert [tuple(a) for a in files] == [
            ("invoice.png", PNG, "image/png"),
            ("notes.txt", "héllo", "text/plain"),
        ]
        # A MIME part stays a MIME part, as the sender attached it.
        assert part.get_filename() == "data.bin"
        assert part.get_payload(decode=True) == b"\x00\x01binary"


def test_html_body_is_sent_as_html(outbox, outbox_mail):
    message = EmailMessage("Newsletter", "<h1>News</h1>", None, ["a@example.com"])
    message.content_subtype = "html"
    message.send()
    email = Email.objects.get()
    assert (email.body, email.structure["subtype"]) == ("<h1>News</h1>", "html")
    deliver()
    parsed = outbox_mail[0].message()
    assert parsed.get_content_type() == "text/html"
    assert "<h1>News</h1>" in parsed.get_payload(decode=True).decode()


def test_html_body_with_text_alternative(outbox, outbox_mail):
    message = EmailMultiAlternatives("S", "<p>hi</p>", None, ["a@example.com"])
    message.content_subtype = "html"
    message.attach_alternative("hi", "text/plain")
    message.send()
    email = Email.objects.get()
    assert (email.body, email.structure["alternatives"]) == ("<p>hi</p>", [["hi", "text/plain"]])


def test_lazy_subject_and_default_from(outbox, settings):
    settings.DEFAULT_FROM_EMAIL = "Default <noreply@example.com>"
    EmailMessage(gettext_lazy("Password changed"), "b", to=["a@example.com"]).send()
    email = Email.objects.get()
    assert email.subject == "Password changed"
    assert email.from_email == "Default <noreply@example.com>"


def test_mail_admins(outbox, outbox_mail, settings):
    admins = ["ops@example.com", "dev@example.com"]
    # Django 5.2 wants (name, address) pairs; 6.0 deprecates them for plain addresses.
    settings.ADMINS = admins if django.VERSION >= (6, 0) else [("Admin", a) for a in admins]
    settings.SERVER_EMAIL = "server@example.com"
    settings.EMAIL_SUBJECT_PREFIX = "[site] "
    mail_admins("Disk full", "Clean up", html_message="<p>Clean up</p>")
    email = Email.objects.get()
    assert email.subject == "[site] Disk full"
    assert email.from_email == "server@example.com"
    assert email.html_message == "<p>Clean up</p>"
    assert sorted(Delivery.objects.values_list("recipient", flat=True)) == [
        "dev@example.com",
        "ops@example.com",
    ]
    deliver()
    assert len(outbox_mail) == 2
    assert {m.message()["To"] for m in outbox_mail} == {"ops@example.com, dev@example.com"}


def test_password_reset_flow(outbox, outbox_mail, client):
    User.objects.create_user("alice", "alice@example.com", "old-password-1")
    response = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    assert response.status_code == 302
    assert response["Location"] == "/accounts/password_reset/done/"
    delivery = Delivery.objects.get()
    assert delivery.recipient == "alice@example.com" and delivery.status == "queued"
    assert outbox_mail == []

    deliver()
    [message] = outbox_mail
    assert message.to == ["alice@example.com"]
    link = re.search(r"http://testserver(/accounts/reset/\S+/)", message.body)
    assert link, message.body
    response = client.get(link.group(1))
    assert response.status_code == 302
    new = "a-New-passw0rd-for-alice"
    response = client.post(response["Location"], {"new_password1": new, "new_password2": new})
    assert response.status_code == 302
    assert response["Location"] == "/accounts/reset/done/"
    assert client.login(username="alice", password=new)


def test_enqueue_email_copies_are_still_addressed_to_each_recipient(outbox, outbox_mail):
    enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    deliver()
    for message in outbox_mail:
        assert message.message()["To"] == message.to[0]
        assert message.cc == [] and message.bcc == []


# -- transactions -------------------------------------------------------------------


def test_rollback_around_send_mail_leaves_nothing(outbox, queue, outbox_mail):
    with pytest.raises(RuntimeError), transaction.atomic():
        assert send_mail("s", "b", None, ["a@example.com"]) == 1
        assert Delivery.objects.count() == 1  # the row is in our transaction...
        raise RuntimeError("the order failed")
    assert Delivery.objects.count() == 0 and Email.objects.count() == 0
    assert queue.redis.dbsize() == 0
    deliver()
    assert outbox_mail == []


def test_ids_reach_redis_only_after_commit(outbox, queue):
    with transaction.atomic():
        send_mail("s", "b", None, ["a@example.com"])
        assert ready_ids(queue) == []
    assert ready_ids(queue) == [Delivery.objects.get().pk]


# -- fan-out, checked on what a real SMTP server receives -----------------------------


@pytest.fixture(params=[False, True], ids=["one-at-a-time", "pipelined"])
def either_smtp_server(request) -> Iterator[SMTPRecorder]:
    """An SMTP server on loopback; once offering PIPELINING, as Postfix does."""
    server = SMTPRecorder(pipelining=request.param).start()
    yield server
    server.stop()


def test_fan_out_over_smtp(settings, either_smtp_server):
    smtp_server = either_smtp_server
    use_smtp_delivery(settings, smtp_server)
    message = EmailMultiAlternatives(
        subject="Quarterly report",
        body="See attached.",
        from_email="Reports <reports@example.com>",
        to=["a@example.com", "Bob <b@example.com>"],
        cc=["c@example.com"],
        bcc=["secret-d@example.com", "secret-e@example.com", "A@example.com"],
        reply_to=["Help <help@example.com>"],
        headers={"X-Report": "q3"},
    )
    message.attach_alternative("<p>See attached.</p>", "text/html")
    message.attach("report.pdf", b"%PDF-1.4 data", "application/pdf")
    message.send()

    deliveries = {d.recipient: d for d in Delivery.objects.all()}
    # A@example.com is a@example.com: one delivery, as a To recipient.
    assert sorted(deliveries) == sorted(
        [
            "a@example.com",
            "Bob <b@example.com>",
            "c@example.com",
            "secret-d@example.com",
            "secret-e@example.com",
        ]
    )
    assert Attachment.objects.count() == 1
    deliver()
    assert smtp_server.count() == 5

    by_rcpt = {}
    for received in smtp_server.received:
        assert len(received.rcpt_tos) == 1, received.rcpt_tos
        by_rcpt[received.rcpt_tos[0]] = received
    assert sorted(by_rcpt) == [
        "a@example.com",
        "b@example.com",
        "c@example.com",
        "secret-d@example.com",
        "secret-e@example.com",
    ]
    message_ids = set()
    for received in by_rcpt.values():
        copy = received.message
        assert copy["To"] == "a@example.com, Bob <b@example.com>"
        assert copy["Cc"] == "c@example.com"
        assert copy["Bcc"] is None
        assert copy["Reply-To"] == "Help <help@example.com>"
        assert copy["X-Report"] == "q3"
        assert received.mail_from == "reports@example.com"
        # No Bcc recipient in any header of any copy, their own included.
        assert b"secret-" not in received.raw
        html = copy.get_body(preferencelist=("html",))
        assert "<p>See attached.</p>" in html.get_content()
        [attachment] = list(copy.iter_attachments())
        assert attachment.get_filename() == "report.pdf"
        assert attachment.get_content() == b"%PDF-1.4 data"
        message_ids.add(received.message_id)
    assert message_ids == {d.message_id for d in deliveries.values()}
    assert Delivery.objects.filter(status="sent").count() == 5


def test_bcc_only_message_shows_no_recipient(settings, smtp_server):
    use_smtp_delivery(settings, smtp_server)
    EmailMessage("Hidden", "b", "shop@example.com", bcc=["x@example.com", "y@example.com"]).send()
    assert Email.objects.get().structure["to"] == []
    deliver()
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == ["x@example.com", "y@example.com"]
    for received in smtp_server.received:
        # As Django sends it: no To header at all.
        assert received.message["To"] is None
        assert received.message["Cc"] is None
        assert b"x@example.com" not in received.raw and b"y@example.com" not in received.raw


def test_cc_and_bcc_without_to(settings, smtp_server):
    use_smtp_delivery(settings, smtp_server)
    EmailMessage("s", "b", "shop@example.com", cc=["c@example.com"], bcc=["z@example.com"]).send()
    deliver()
    assert smtp_server.count() == 2
    for received in smtp_server.received:
        assert received.message["To"] is None
        assert received.message["Cc"] == "c@example.com"
        assert b"z@example.com" not in received.raw


def test_to_header_given_by_the_sender_wins(outbox, outbox_mail):
    EmailMessage(
        "s", "b", None, ["a@example.com", "b@example.com"], headers={"To": "team@example.com"}
    ).send()
    deliver()
    assert sorted(m.recipients()[0] for m in outbox_mail) == ["a@example.com", "b@example.com"]
    assert {m.message()["To"] for m in outbox_mail} == {"team@example.com"}


def test_copies_keep_the_recipients_role(outbox, outbox_mail):
    EmailMessage(
        "s", "b", None, to=["Ann <a@example.com>"], cc=["c@example.com"], bcc=["d@example.com"]
    ).send()
    deliver()
    roles = {m.recipients()[0]: (m.to, m.cc, m.bcc) for m in outbox_mail}
    assert roles == {
        "Ann <a@example.com>": (["Ann <a@example.com>"], [], []),
        "c@example.com": ([], ["c@example.com"], []),
        "d@example.com": ([], [], ["d@example.com"]),
    }


# -- invalid messages and fail_silently ------------------------------------------------


def good(n: int = 0) -> EmailMessage:
    return EmailMessage(f"good {n}", "b", "shop@example.com", [f"user{n}@example.com"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"to": ["not an address"]}, "to"),
        ({"cc": ["a@example.com\nBcc: x@evil.example"]}, "cc"),
        ({"bcc": ["a@@example.com"]}, "bcc"),
        ({"from_email": "no body@"}, "from_email"),
        ({"subject": "Hi\r\nBcc: x@evil.example"}, "subject"),
        ({"headers": {"Bcc": "x@evil.example"}}, "headers"),
        ({"headers": {"X-Evil": "a\r\nBcc: x@evil.example"}}, "headers"),
        ({"reply_to": ["bad address"]}, "reply_to"),
    ],
)
def test_invalid_message_raises_and_writes_nothing(outbox, queue, kwargs, field):
    args = {"subject": "s", "body": "b", "from_email": "shop@example.com", "to": ["a@example.com"]}
    args.update(kwargs)
    message = EmailMessage(**args)
    with pytest.raises(ValidationError) as info:
        message.send()
    assert field in info.value.message_dict
    # Code written for Django's own backends catches it as it caught theirs.
    assert isinstance(info.value, ValueError) and isinstance(info.value, BadHeaderError)
    assert Email.objects.count() == 0 and Delivery.objects.count() == 0
    assert queue.redis.dbsize() == 0


def test_one_invalid_message_stops_the_whole_batch():
    bad = EmailMessage("s", "b", "no body@", ["a@example.com"])
    with pytest.raises(ValidationError):
        OutboxBackend().send_messages([good(1), bad, good(2)])
    assert Email.objects.count() == 0


def test_fail_silently_skips_invalid_messages(caplog):
    bad = EmailMessage("s", "b", "no body@", ["a@example.com"])
    backend = OutboxBackend(fail_silently=True)
    assert backend.send_messages([good(1), bad, good(2)]) == 2
    assert sorted(Email.objects.values_list("subject", flat=True)) == ["good 1", "good 2"]
    assert "not queueing an invalid email 's'" in caplog.text


def test_message_without_recipients_is_skipped():
    assert OutboxBackend().send_messages([EmailMessage("s", "b", "shop@example.com")]) == 0
    assert OutboxBackend().send_messages([]) == 0
    assert Email.objects.count() == 0


def test_calendar_invite_and_inline_logo_go_out_as_django_builds_them(outbox, outbox_mail):
    """Two alternatives and an inline part with a Content-ID: Django's own structure."""
    message = EmailMultiAlternatives("Invite", "b", None, ["a@example.com", "b@example.com"])
    message.attach_alternative("<p><img src='cid:logo'></p>", "text/html")
    message.attach_alternative("BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n", "text/calendar")
    if MIMEPART_ATTACHMENTS:
        image = MIMEPart()
        image.set_content(PNG, maintype="image", subtype="png", disposition="inline", cid="<logo>")
    else:
        image = MIMEImage(PNG, "png")
        image.add_header("Content-ID", "<logo>")
    message.attach(image)
    message.send()
    assert Attachment.objects.get().mime_part
    deliver()
    expected = structure_of(message.message())
    assert len(outbox_mail) == 2
    for copy in outbox_mail:
        delivered = copy.message()
        assert structure_of(delivered) == expected
        [logo] = [p for p in delivered.walk() if p["Content-ID"] == "<logo>"]
        assert logo.get_payload(decode=True) == PNG


def structure_of(message) -> list[tuple[str, str | None]]:
    return [(part.get_content_type(), part.get("Content-ID")) for part in message.walk()]


# -- options and configuration -------------------------------------------------------------


def test_options_set_priority_and_attempts(settings):
    if HAS_MAILERS:
        settings.MAILERS = {
            **settings.MAILERS,
            "bulk": {
                "BACKEND": OUTBOX_BACKEND,
                "OPTIONS": {"priority": "low", "max_attempts": 2},
            },
        }
        EmailMessage("s", "b", None, ["a@example.com"]).send(using="bulk")
    else:
        backend = OutboxBackend(priority="low", max_attempts=2)
        EmailMessage("s", "b", None, ["a@example.com"], connection=backend).send()
    delivery = Delivery.objects.get()
    assert (delivery.priority, delivery.max_attempts) == ("low", 2)


@pytest.mark.parametrize("options", [{"priority": "urgent"}, {"max_attempts": 0}])
def test_bad_options_are_refused(options):
    with pytest.raises(ImproperlyConfigured):
        OutboxBackend(**options)


@pytest.mark.skipif(not HAS_MAILERS, reason="MAILERS needs Django 6.1")
def test_unknown_mailer_option_is_refused(settings):
    settings.MAILERS = {"default": {"BACKEND": OUTBOX_BACKEND, "OPTIONS": {"colour": "red"}}}
    with pytest.raises(ImproperlyConfigured, match="colour"):
        mail.mailers["default"]


@pytest.mark.skipif(not HAS_MAILERS, reason="MAILERS needs Django 6.1")
def test_mailer_alias_and_fail_silently_option(settings):
    settings.MAILERS = {"default": {"BACKEND": OUTBOX_BACKEND, "OPTIONS": {"fail_silently": True}}}
    backend = mail.mailers["default"]
    assert backend.alias == "default" and backend.fail_silently is True
    assert backend.send_messages([EmailMessage("s", "b", "no body@", ["a@example.com"])]) == 0


def test_the_doors_reach_a_pipelining_server_pipelined(settings, client):
    """send_mail, mail_admins and the password-reset view, through the drop-in backend and a
    worker, to an SMTP server that offers PIPELINING: each copy arrives, in one write."""
    server = ScriptedSMTP().start()
    try:
        use_smtp(settings, server.port)
        settings.ADMINS = (
            ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]
        )
        settings.SERVER_EMAIL = "server@example.com"
        User.objects.create_user("alice", "alice@example.com", "old-password-1")

        assert send_mail("Receipt", "Thanks", "shop@example.com", ["a@example.com"]) == 1
        mail_admins("Disk full", "Clean up")
        assert (
            client.post("/accounts/password_reset/", {"email": "alice@example.com"}).status_code
            == 302
        )
        deliver()
    finally:
        server.stop()

    arrived = {t.recipients[0]: t for t in server.transactions}
    assert sorted(arrived) == ["a@example.com", "alice@example.com", "ops@example.com"]
    assert all(t.pipelined and t.body for t in arrived.values())
    assert b"/accounts/reset/" in (arrived["alice@example.com"].body or b"")
    assert Delivery.objects.filter(status="sent").count() == 3
