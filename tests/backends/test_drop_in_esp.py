"""The drop-in backend in front of an ESP: anymail's attributes, the caller's answer, what is taken.

Messages come in by Django's doors (``send_mail``, ``EmailMessage.send()``,
anymail's ``AnymailMessage``) through ``OutboxBackend``; a burst worker in
this process delivers them through anymail's real Postmark backend to the
fake ESP on loopback (tests/esp.py), whose request body shows what anymail
made of the stored message. Until each message goes out in one request of
its own (issue 40, item 1), a copy shown To or Cc carries those as headers,
which Postmark's backend refuses: the end-to-end cases here send Bcc-only.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from anymail.message import AnymailMessage, AnymailStatus
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, send_mail
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from django.utils.translation import gettext_lazy

from outbox.backends import OutboxBackend
from outbox.exceptions import InvalidEmailError
from outbox.mail.esp import DELIVERY_KEY, TOKEN_KEY
from outbox.mail.structure import ANYMAIL_ATTRIBUTES, rebuild
from outbox.models import Delivery, Email
from tests.delivery import deliver, use_outbox
from tests.esp import POSTMARK_BACKEND, FakeESP, anymail_settings

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


@pytest.fixture
def postmark(esp: FakeESP, settings) -> FakeESP:
    """The outbox in front of anymail's Postmark backend, pointed at the fake ESP."""
    esp.reset()
    settings.ANYMAIL = anymail_settings(esp.url, 5.0)
    use_outbox(settings, POSTMARK_BACKEND)
    return esp


# Every attribute of AnymailMessage, as a caller sets it (lazy text, tuples and all).
ATTRIBUTES: dict[str, Any] = {
    "envelope_sender": "bounces@example.com",
    "metadata": {"user": "42", "plan": gettext_lazy("gold")},
    "tags": (gettext_lazy("welcome"),),
    "track_clicks": False,
    "track_opens": True,
    "template_id": 1234,
    "merge_data": {"bob@example.com": {"name": "Bob"}},
    "merge_global_data": {"shop": "Example", "items": [1, 2.5, None]},
    "merge_headers": {"bob@example.com": {"List-Unsubscribe": "<https://example.com/u/bob>"}},
    "merge_metadata": {"bob@example.com": {"order": "7"}},
    "esp_extra": {"MessageStream": "outbound-2", "server_token": "per-message-token"},
}
# ... as anymail reads them back: JSON, lazy text forced.
EXPECTED = {
    **ATTRIBUTES,
    "metadata": {"user": "42", "plan": "gold"},
    "tags": ["welcome"],
    "merge_global_data": {"shop": "Example", "items": [1, 2.5, None]},
}


def test_the_table_names_every_attribute_anymail_reads():
    """A new anymail attribute fails this test until it has its entry."""
    from anymail.backends.base import BasePayload

    read = {name for name, _combiner, _converter in BasePayload.anymail_message_attrs}
    assert set(ANYMAIL_ATTRIBUTES) == read
    assert set(ATTRIBUTES) | {"send_at"} == read


@pytest.mark.parametrize("door", ["AnymailMessage", "EmailMessage attributes"])
def test_every_attribute_is_stored_and_set_again_on_the_rebuilt_message(settings, door):
    use_outbox(settings)
    if door == "AnymailMessage":
        message = AnymailMessage("Hi", "Body", None, ["bob@example.com"], **ATTRIBUTES)
    else:
        message = EmailMessage("Hi", "Body", None, ["bob@example.com"])
        for name, value in ATTRIBUTES.items():
            setattr(message, name, value)
    assert message.send() == 1
    rebuilt = rebuild(Email.objects.get(), [])
    assert {name: getattr(rebuilt, name) for name in EXPECTED} == EXPECTED


def test_attributes_left_unset_stay_unset(settings):
    use_outbox(settings)
    AnymailMessage("Hi", "Body", None, ["bob@example.com"], tags=None).send()
    assert Email.objects.get().structure["anymail"] == {"tags": None}
    rebuilt = rebuild(Email.objects.get(), [])
    assert rebuilt.tags is None
    assert not hasattr(rebuilt, "metadata") and not hasattr(rebuilt, "template_id")


def test_a_set_of_tags_is_stored_as_the_list_anymail_makes_of_it(settings):
    use_outbox(settings)
    message = EmailMessage("Hi", "Body", None, ["bob@example.com"])
    message.tags = frozenset({"welcome"})
    message.send()
    assert rebuild(Email.objects.get(), []).tags == ["welcome"]


def test_anymails_request_carries_what_the_caller_set(postmark):
    message = AnymailMessage(
        "Hi", "Body", "shop@example.com", bcc=["bob@example.com"],
        tags=["welcome"], metadata={"user": "42"}, template_id=1234,
        merge_global_data={"name": "Bob"}, track_opens=True, track_clicks=False,
        esp_extra={"MessageStream": "outbound-2", "server_token": "per-message-token"},
    )  # fmt: skip
    assert message.send() == 1
    deliver()
    [taken] = postmark.accepted
    [row] = Delivery.objects.all()
    assert row.status == Status.SENT, row.last_error
    body = taken.payload
    assert body["Tag"] == "welcome"
    assert body["Metadata"] == {
        "user": "42",
        DELIVERY_KEY: str(row.pk),
        TOKEN_KEY: row.claim_token.hex,
    }
    assert (body["TemplateId"], body["TemplateModel"]) == (1234, {"name": "Bob"})
    assert (body["TrackOpens"], body["TrackLinks"]) == (True, "None")
    assert body["MessageStream"] == "outbound-2"
    assert taken.token == "per-message-token"


def test_attributes_on_a_plain_message_reach_the_esp_too(postmark):
    message = EmailMessage("Hi", "Body", "shop@example.com", bcc=["bob@example.com"])
    message.tags = ["receipt"]
    message.metadata = {"order": "7"}
    message.send()
    deliver()
    [taken] = postmark.accepted
    assert taken.payload["Tag"] == "receipt"
    assert taken.payload["Metadata"]["order"] == "7"
    assert set(taken.payload["Metadata"]) == {"order", DELIVERY_KEY, TOKEN_KEY}


def test_merge_data_for_several_recipients_reaches_anymails_batch_payload(settings):
    """Built, not sent: a To list needs the one request per message of issue 40, item 1."""
    settings.ANYMAIL = anymail_settings("http://127.0.0.1:9/", 1.0)
    use_outbox(settings)
    AnymailMessage(
        "Hi", "Body", "shop@example.com", ["a@example.com", "b@example.com"],
        template_id=1234,
        merge_data={"a@example.com": {"name": "A"}, "b@example.com": {"name": "B"}},
        merge_metadata={"a@example.com": {"n": "1"}, "b@example.com": {"n": "2"}},
    ).send()  # fmt: skip
    backend = import_string(POSTMARK_BACKEND)()
    payload = backend.build_message_payload(rebuild(Email.objects.get(), []), {})
    assert payload.get_api_endpoint() == "email/batchWithTemplates"
    messages = payload.get_request_params(backend.api_url)["data"]
    assert '"TemplateModel": {"name": "A"}' in messages
    assert '"TemplateModel": {"name": "B"}' in messages
    assert '"Metadata": {"n": "2"}' in messages


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("metadata", {"price": Decimal("1.5")}),
        ("esp_extra", {"when": datetime(2030, 1, 1, tzinfo=UTC)}),
        ("merge_data", {"bob@example.com": {1: "int key"}}),
        ("tags", [object()]),
        ("send_at", "tomorrow"),
        ("metadata", {DELIVERY_KEY: "1"}),
        ("merge_metadata", {"bob@example.com": {TOKEN_KEY: "x"}}),
    ],
)
def test_a_value_that_cannot_be_stored_is_refused_naming_the_attribute(settings, name, value):
    use_outbox(settings)
    message = EmailMessage("Hi", "Body", None, ["bob@example.com"])
    setattr(message, name, value)
    with pytest.raises(ValidationError) as info:
        message.send()
    assert name in info.value.message_dict
    assert Email.objects.count() == 0


# -- send_at: the outbox's schedule ---------------------------------------------------


def test_send_at_is_the_rows_schedule_and_is_not_passed_on(postmark):
    later = timezone.now() + timedelta(hours=1)
    soon = AnymailMessage("Later", "Body", None, bcc=["later@example.com"], send_at=later)
    soon.send()
    [row] = Delivery.objects.all()
    assert row.not_before == later
    deliver()  # not due: nothing is sent
    assert not postmark.requests
    assert Delivery.objects.get().status == Status.QUEUED
    # A time already past is due now; Postmark, which has no scheduled
    # sending, would refuse the message if send_at were passed on.
    past = AnymailMessage(
        "Past", "Body", None, bcc=["past@example.com"], send_at=timezone.now() - timedelta(1)
    )
    past.send()
    deliver()
    [taken] = postmark.accepted
    assert taken.payload["Subject"] == "Past"
    assert "SendAt" not in taken.payload
    assert Delivery.objects.get(recipient="past@example.com").status == Status.SENT


@pytest.mark.parametrize("use_tz", [True, False])
def test_send_at_naive_date_and_timestamp_are_read_as_anymail_reads_them(settings, use_tz):
    settings.USE_TZ = use_tz
    settings.TIME_ZONE = "America/Chicago"
    use_outbox(settings)
    chicago = ZoneInfo("America/Chicago")
    cases = [
        (datetime(2030, 1, 2, 3, 4, 5), datetime(2030, 1, 2, 3, 4, 5, tzinfo=chicago)),
        (date(2030, 1, 2), datetime(2030, 1, 2, tzinfo=chicago)),
        (datetime(2030, 1, 2, 3, 4, tzinfo=UTC), datetime(2030, 1, 2, 3, 4, tzinfo=UTC)),
        (1893456000, datetime(2030, 1, 1, tzinfo=UTC)),
    ]
    for send_at, meant in cases:
        message = EmailMessage("s", "b", None, ["bob@example.com"])
        message.send_at = send_at
        message.send()
        row = Delivery.objects.get(pk=message.outbox_deliveries[0])
        expected = meant if use_tz else timezone.make_naive(meant, chicago)
        assert row.not_before == expected, send_at


# -- what the caller learns ----------------------------------------------------------


def test_each_message_names_its_deliveries_and_is_queued_for_anymail(settings):
    use_outbox(settings)
    message = EmailMessage(
        "Hi", "Body", None, ["a@example.com", "Bob <b@example.com>"],
        cc=["c@example.com"], bcc=["d@example.com", "A@example.com"],
    )  # fmt: skip
    assert message.send() == 1  # queued, not sent
    rows = Delivery.objects.in_bulk(message.outbox_deliveries)
    shown = [rows[pk].recipient for pk in message.outbox_deliveries]
    assert shown == ["a@example.com", "Bob <b@example.com>", "c@example.com", "d@example.com"]
    status = message.anymail_status
    assert isinstance(status, AnymailStatus)
    assert status.status == {"queued"} and status.message_id is None
    assert set(status.recipients) == {"a@example.com", "b@example.com", "c@example.com",
                                      "d@example.com"}  # fmt: skip
    assert {(r.status, r.message_id) for r in status.recipients.values()} == {("queued", None)}
    assert status.esp_response == message.outbox_deliveries


def test_an_anymail_message_is_queued_and_keeps_its_status_when_sent(postmark):
    message = AnymailMessage("Hi", "Body", None, bcc=["bob@example.com"])
    assert message.anymail_status.status is None
    message.send()
    assert message.anymail_status.status == {"queued"}
    deliver()
    assert Delivery.objects.get().status == Status.SENT
    assert message.anymail_status.status == {"queued"}  # the worker sent its own copy


def test_send_mail_and_several_messages_are_each_marked(settings):
    use_outbox(settings)
    assert send_mail("s", "b", None, ["a@example.com"]) == 1
    messages = [EmailMessage("s", "b", None, [f"{n}@example.com"]) for n in range(3)]
    assert OutboxBackend().send_messages(messages) == 3
    ids = [m.outbox_deliveries for m in messages]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 3
    assert [Delivery.objects.get(pk=i[0]).recipient for i in ids] == [
        "0@example.com", "1@example.com", "2@example.com"
    ]  # fmt: skip


def test_a_message_skipped_silently_is_not_marked(settings):
    use_outbox(settings)
    bad = EmailMessage("s", "b", None, ["a@example.com"], headers={"Bcc": "x@example.com"})
    good = EmailMessage("s", "b", None, ["b@example.com"])
    assert OutboxBackend(fail_silently=True).send_messages([bad, good]) == 1
    assert not hasattr(bad, "outbox_deliveries") and not hasattr(bad, "anymail_status")
    assert len(good.outbox_deliveries) == 1


# -- what the delivery backend takes is taken -----------------------------------------


def test_a_reply_to_entry_with_several_addresses_is_sent_as_django_writes_it(settings, outbox_mail):
    use_outbox(settings)
    reply_to = ["A <a@example.com>, B <b@example.com>", "c@example.com"]
    message = EmailMessage("s", "b", None, ["bob@example.com"], reply_to=reply_to)
    assert message.send() == 1
    deliver()
    [copy] = outbox_mail
    assert copy.message()["Reply-To"] == message.message()["Reply-To"]
    with pytest.raises(InvalidEmailError) as info:
        EmailMessage(
            "s", "b", None, ["bob@example.com"], reply_to=["a@example.com, b@@example.com"]
        ).send()
    assert "reply_to" in info.value.message_dict


def test_the_strict_rule_checks_each_address_of_a_reply_to_entry(settings):
    use_outbox(settings, STRICT_ADDRESSES=True)
    good = ["A <a@example.com>, B <b@example.com>"]
    assert EmailMessage("s", "b", None, ["bob@example.com"], reply_to=good).send() == 1
    with pytest.raises(InvalidEmailError) as info:
        bad = [
            "A <a@example.com>, webmaster"
        ]  # Django takes a bare local part; the strict rule not
        EmailMessage("s", "b", None, ["bob@example.com"], reply_to=bad).send()
    assert "reply_to" in info.value.message_dict


@pytest.mark.parametrize(("value", "text"), [(5, 5), (Decimal("1.50"), "1.50")])
def test_through_anymail_a_header_value_of_any_type_is_sent(postmark, value, text):
    """Django 6's message() refuses them (TypeError); anymail's backends never call it.

    A number goes as the number anymail sends; a value JSON cannot keep, as its text.
    """
    message = EmailMessage("s", "b", None, bcc=["bob@example.com"], headers={"X-Value": value})
    assert message.send() == 1
    deliver()
    [taken] = postmark.accepted
    assert Delivery.objects.get().status == Status.SENT
    assert {h["Name"]: h["Value"] for h in taken.payload["Headers"]}["X-Value"] == text


def test_through_anymail_a_sender_list_and_a_reply_to_list_are_sent(postmark):
    message = EmailMessage(
        "s", "b", "A <a@example.com>, b@example.com", bcc=["bob@example.com"],
        reply_to=["A <a@example.com>, B <b@example.com>"],
    )  # fmt: skip
    assert message.send() == 1
    deliver()
    [taken] = postmark.accepted
    assert Delivery.objects.get().status == Status.SENT
    assert taken.payload["From"] == "A <a@example.com>, b@example.com"
    assert taken.payload["ReplyTo"] == "A <a@example.com>, B <b@example.com>"


def test_for_djangos_backends_a_header_value_is_taken_as_djangos_message_takes_it(
    settings, outbox_mail
):
    use_outbox(settings)
    message = EmailMessage("s", "b", None, ["bob@example.com"], headers={"X-Count": 5})
    try:
        expected = message.message()["X-Count"]
    except TypeError:  # Django 6
        with pytest.raises(TypeError):
            message.send()
        assert Email.objects.count() == 0
        return
    assert message.send() == 1
    deliver()
    assert outbox_mail[0].message()["X-Count"] == expected == "5"


def test_a_sender_list_is_refused_for_djangos_backends_which_refuse_it_when_sending(settings):
    use_outbox(settings)
    with pytest.raises(InvalidEmailError) as info:
        EmailMessage("s", "b", "a@example.com, b@example.com", ["bob@example.com"]).send()
    assert "from_email" in info.value.message_dict


def test_an_esps_own_refusal_in_the_worker_fails_the_row_and_the_admin_shows_why(
    postmark, admin_client
):
    """Postmark takes one tag: anymail's AnymailUnsupportedFeature, raised while sending."""
    AnymailMessage("s", "b", None, bcc=["bob@example.com"], tags=["one", "two"]).send()
    deliver()
    [row] = Delivery.objects.all()
    assert row.status == Status.FAILED
    assert "Postmark does not support multiple tags" in row.last_error
    assert not postmark.requests
    page = admin_client.get(reverse("admin:outbox_delivery_change", args=[row.pk]))
    assert "Postmark does not support multiple tags" in page.content.decode()
