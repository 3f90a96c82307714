"""The drop-in backend delivers what Django would have sent (issue: drop-in fidelity).

Each case sends a Django message through ``OutboxBackend`` and a burst worker,
and compares the delivered copy with Django's own ``message()`` of the same
message. Django's own mail tests run the same way in tests/upstream/test_django_mail.py;
random messages in tests/backends/test_fidelity_property.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.mime.base import MIMEBase
from typing import Any

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.core.mail.message import BadHeaderError
from django.utils.translation import gettext_lazy

from outbox import enqueue_email
from outbox.backends import OutboxBackend
from outbox.exceptions import InvalidEmailError
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Delivery, Email
from tests.delivery import deliver, use_outbox, use_smtp_delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def outbox(settings) -> None:
    use_outbox(settings)


def comparable(data: bytes) -> bytes:
    """A serialised message without what differs per build: Message-ID, Date, boundaries."""
    data = re.sub(rb"(?m)^(Message-ID|Date): .*\r?\n", b"", data)
    return re.sub(rb"=+_?[0-9]+==", b"BOUNDARY", data)


def django_bytes(message: EmailMessage) -> bytes:
    return message.message().as_bytes()


def test_idn_addresses_with_display_names_go_out_idna_encoded(settings, smtp_server):
    """Once a crash that escaped fail_silently: an IDN domain with a display name."""
    use_smtp_delivery(settings, smtp_server)
    message = EmailMessage("Grüße", "b", "Shop <shop@bücher.de>", ["Jörg <j@bücher.de>"])
    assert message.send() == 1
    deliver()
    [received] = smtp_server.received
    assert received.mail_from == "shop@xn--bcher-kva.de"
    assert received.rcpt_tos == ["j@xn--bcher-kva.de"]
    assert "xn--bcher-kva.de" in received.message["To"]
    assert "xn--bcher-kva.de" in received.message["From"]


def test_headers_given_by_the_sender_are_honoured_as_in_django(outbox, outbox_mail):
    when = datetime(2001, 11, 9, 1, 8, 47, tzinfo=UTC)
    message = EmailMessage(
        "s",
        "b",
        "envelope@example.com",
        ["a@example.com"],
        headers={
            "From": "Shown <shown@example.com>",
            "To": "list@example.com",
            "Reply-To": "reply@example.com",
            "Date": when,
            "Message-ID": "<mine@example.com>",
        },
    )
    message.send()
    deliver()
    [copy] = outbox_mail
    delivered = copy.message()
    expected = message.message()
    for name in ("From", "To", "Reply-To", "Date", "Message-ID"):
        assert delivered[name] == expected[name], name
    # The envelope stays as given.
    assert copy.from_email == "envelope@example.com"
    assert copy.recipients() == ["a@example.com"]
    # One recipient: the sender's Message-ID is the row's, for reconcilers too.
    assert Delivery.objects.get().message_id == "<mine@example.com>"
    assert comparable(delivered.as_bytes()) == comparable(expected.as_bytes())


def test_a_senders_message_id_with_several_recipients_stays_unique_and_traceable(
    outbox, outbox_mail
):
    headers = {"Message-ID": "<order-42@shop.example>"}
    EmailMessage("s", "b", None, ["a@example.com", "b@example.com"], headers=headers).send()
    EmailMessage("s", "b", None, ["c@example.com"], headers=headers).send()
    ids = list(Delivery.objects.order_by("pk").values_list("message_id", flat=True))
    assert len(set(ids)) == 3
    for message_id in ids[:2]:
        assert re.fullmatch(r"<order-42\.[0-9a-f]{32}@shop\.example>", message_id)
    # One recipient, and no row has the sender's ID yet: it is kept as it is.
    assert ids[2] == "<order-42@shop.example>"
    deliver()
    assert {m.message()["Message-ID"] for m in outbox_mail} == set(ids)


def test_a_reused_message_id_gets_a_unique_one(outbox):
    """A row has the sender's ID already: the second message gets a traceable one."""
    headers = {"Message-ID": "<once@shop.example>"}
    EmailMessage("s", "b", None, ["a@example.com"], headers=headers).send()
    EmailMessage("s", "b", None, ["a@example.com"], headers=headers).send()
    first, second = Delivery.objects.order_by("pk").values_list("message_id", flat=True)
    assert first == "<once@shop.example>"
    assert re.fullmatch(r"<once\.[0-9a-f]{32}@shop\.example>", second)


def test_latin_1_message_keeps_its_encoding(outbox, outbox_mail):
    message = EmailMultiAlternatives("Café", "Prix: 5 francs. Ça va, déjà?", None, ["a@x.com"])
    message.encoding = "iso-8859-1"
    message.attach_alternative("<p>Ça va</p>", "text/html")
    message.send()
    deliver()
    delivered = outbox_mail[0].message()
    assert "iso-8859-1" in delivered.get_payload()[0]["Content-Type"]
    assert comparable(delivered.as_bytes()) == comparable(django_bytes(message))


# The test's own attach() of a MIMEBase is what Django 6.0 deprecates.
@pytest.mark.filterwarnings("ignore:MIMEBase attachments are deprecated")
@pytest.mark.parametrize("shape", ["html only", "bcc only", "mimebase", "cc only"])
def test_mime_structure_is_djangos(outbox, outbox_mail, shape):
    message = EmailMultiAlternatives("s", "<p>b</p>", "shop@example.com", ["a@example.com"])
    if shape == "html only":
        message.content_subtype = "html"
    elif shape == "bcc only":
        message.to, message.bcc = [], ["hidden@example.com"]
    elif shape == "cc only":
        message.to, message.cc = [], ["c@example.com"]
    else:
        part = MIMEBase("application", "pdf")
        part.set_payload(b"%PDF-1.4")
        part.add_header("Content-Disposition", "attachment", filename="r.pdf")
        message.attach(part)
    message.send()
    deliver()
    [copy] = outbox_mail
    delivered = copy.message()
    assert comparable(delivered.as_bytes()) == comparable(django_bytes(message))
    if shape == "bcc only":
        assert delivered["To"] is None and copy.recipients() == ["hidden@example.com"]


def test_every_copy_shares_one_build(outbox, outbox_mail, monkeypatch):
    """Django builds an email's message once; the copies differ only in their headers."""
    message = EmailMultiAlternatives("s", "b", None, [f"u{i}@example.com" for i in range(5)])
    message.attach("big.bin", bytes(range(256)) * 64, "application/octet-stream")
    message.send()
    builds = []
    django_message = EmailMultiAlternatives.message

    def counted(self, **kwargs):
        builds.append(self)
        return django_message(self, **kwargs)

    monkeypatch.setattr(EmailMultiAlternatives, "message", counted)
    deliver()
    assert len(outbox_mail) == 5 and len(builds) == 1
    delivered = [m.message() for m in outbox_mail]
    assert len({m["Message-ID"] for m in delivered}) == 5
    assert len({comparable(m.as_bytes()) for m in delivered}) == 1


def test_input_errors_are_djangos_too(outbox):
    """InvalidEmailError: a ValidationError naming the field, and Django's ValueError."""
    injection = EmailMessage("s", "b", None, ["a@example.com"], headers={"X-A": "1\nBcc: e@x"})
    with pytest.raises(BadHeaderError) as info:
        injection.send()
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidEmailError)
    assert "headers" in info.value.message_dict
    with pytest.raises(ValueError):
        EmailMessage("s", "b", None, ["a@@example.com"]).send()
    assert Email.objects.count() == 0


@pytest.mark.parametrize("address", ["<>", ".vä <\x9f@example.com>"])
@pytest.mark.parametrize("field", ["to", "from_email", "reply_to"])
def test_addresses_the_email_parser_trips_on_are_refused_as_invalid(outbox, field, address):
    """Found by fuzzing: on Django 5.2 these made sanitize_address() raise TypeError and
    AttributeError from inside the email package, not a validation error."""
    fields: dict[str, Any] = {"to": ["a@example.com"], "from_email": None, "reply_to": None}
    fields[field] = address if field == "from_email" else [address]
    with pytest.raises(InvalidEmailError) as info:
        EmailMessage("s", "b", **fields).send()
    assert field in info.value.message_dict
    assert Email.objects.count() == 0


@pytest.mark.skipif(not HAS_MAILERS, reason="Django 5.2 refuses a bare local part itself")
def test_addresses_django_accepts_are_accepted(outbox, outbox_mail, settings):
    message = EmailMessage(
        gettext_lazy("Hello"), "b", "webmaster", [gettext_lazy("to1"), "jörg@example.com"]
    )
    assert message.send() == 1
    deliver()
    assert sorted(m.recipients()[0] for m in outbox_mail) == ["jörg@example.com", "to1"]
    # The stricter check, as an opt-in.
    settings.OUTBOX = {**settings.OUTBOX, "STRICT_ADDRESSES": True}
    with pytest.raises(InvalidEmailError) as info:
        EmailMessage("s", "b", "webmaster", ["a@example.com"]).send()
    assert "from_email" in info.value.message_dict


def test_fail_silently_catches_what_django_would_refuse(settings):
    use_outbox(settings)
    bad = EmailMessage("s", "b", None, ["a@example.com"], headers={"Bcc": "x@example.com"})
    assert OutboxBackend(fail_silently=True).send_messages([bad]) == 0


def test_rows_written_before_the_structure_are_still_delivered(outbox, outbox_mail):
    """A backend row of the previous release: To/Cc in Email.headers, no structure."""
    EmailMessage("s", "b", None, ["a@example.com", "b@example.com"]).send()
    Email.objects.update(structure=None, headers={"To": "a@example.com, b@example.com"})
    deliver()
    assert {m.message()["To"] for m in outbox_mail} == {"a@example.com, b@example.com"}
    assert sorted(m.recipients()[0] for m in outbox_mail) == ["a@example.com", "b@example.com"]


def test_enqueue_email_copies_are_each_addressed_to_their_recipient(outbox, outbox_mail):
    recipients = ["a@example.com", "Bob <b@example.com>", "Jörg <j@bücher.de>"]
    enqueue_email("s", "b", "shop@example.com", recipients)
    deliver()
    shown = {m.recipients()[0]: m.message()["To"] for m in outbox_mail}
    assert shown["a@example.com"] == "a@example.com"
    assert shown["Bob <b@example.com>"] == "Bob <b@example.com>"
    assert "xn--bcher-kva.de" in next(v for k, v in shown.items() if "j@" in k)
