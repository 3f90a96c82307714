"""enqueue_email's input: a bad value is a ValidationError naming its field, and nothing is written."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.core.exceptions import ValidationError

from outbox import enqueue_email
from outbox.models import Delivery, Email

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"recipient_list": []}, "recipient_list"),
        ({"recipient_list": [""]}, "recipient_list"),
        ({"recipient_list": ["not-an-address"]}, "recipient_list"),
        (
            {"recipient_list": ["a@example.com", "b@example.com\r\nBcc: x@evil.com"]},
            "recipient_list",
        ),
        ({"recipient_list": ["a@example.com, b@example.com"]}, "recipient_list"),
        ({"from_email": "nobody"}, "from_email"),
        ({"from_email": "a@example.com\nBcc: x@evil.com"}, "from_email"),
        ({"subject": "Hello\r\nBcc: x@evil.com"}, "subject"),
        ({"subject": "Hello\nthere"}, "subject"),
        ({"subject": "Hello\u2028there"}, "subject"),
        ({"message": "body with NUL \x00"}, "message"),
        ({"headers": {"X-Evil\r\nBcc": "x"}}, "headers"),
        ({"headers": {"X-Ok": "value\r\nBcc: x@evil.com"}}, "headers"),
        ({"headers": {"Message-ID": "<mine@example.com>"}}, "headers"),
        ({"reply_to": ["bad address"]}, "reply_to"),
        ({"priority": "urgent"}, "priority"),
        ({"send_at": datetime(2030, 1, 1)}, "send_at"),  # naive
        ({"max_attempts": 0}, "max_attempts"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"attachments": [("a\r\nb.txt", b"x", "text/plain")]}, "attachments"),
    ],
)
def test_bad_input_raises_validation_error_and_writes_nothing(kwargs, field, queue):
    args = {
        "subject": "s",
        "message": "b",
        "from_email": "shop@example.com",
        "recipient_list": ["a@example.com"],
    }
    args.update(kwargs)
    with pytest.raises(ValidationError) as info:
        enqueue_email(**args)
    assert field in info.value.message_dict
    assert Email.objects.count() == 0 and Delivery.objects.count() == 0
    assert queue.redis.dbsize() == 0


@pytest.mark.parametrize(
    ("field", "value", "code", "message"),
    [
        ("recipient_list", "bad@@x", "invalid", "'bad@@x' in recipient_list is not a valid"),
        ("recipient_list", "not-an-address", "invalid", "is not a valid email address"),
        ("recipient_list", "Bob <b@example.com", "invalid", "is not a valid email address"),
        ("recipient_list", "   ", "required", "An address in recipient_list is empty."),
        (
            "recipient_list",
            "a@example.com, b@example.com",
            "multiple",
            "recipient_list takes one address per string, "
            "and 'a@example.com, b@example.com' holds several.",
        ),
        ("recipient_list", "a@x.com; b@y.com", "multiple", "holds several"),
        ("recipient_list", "A <a@x.com>, B <b@y.com>", "multiple", "holds several"),
        ("from_email", "a@example.com, b@example.com", "multiple", "from_email takes one"),
        ("from_email", "bad@@x", "invalid", "'bad@@x' in from_email is not a valid"),
        ("from_email", "", "required", "An address in from_email is empty."),
        ("reply_to", "x@" + "a" * 320 + ".com", "max_length", "longer than 320 characters"),
        ("recipient_list", [], "required", "recipient_list is empty: at least one recipient"),
    ],
)
def test_each_bad_address_gets_its_own_message(field, value, code, message, queue):
    args = {
        "subject": "s",
        "message": "b",
        "from_email": "shop@example.com",
        "recipient_list": ["a@example.com"],
    }
    args[field] = value if field == "from_email" or isinstance(value, list) else [value]
    with pytest.raises(ValidationError) as info:
        enqueue_email(**args)
    [error] = info.value.error_dict[field]
    assert error.code == code
    assert message in error.messages[0]
    assert Email.objects.count() == 0 and Delivery.objects.count() == 0
    assert queue.redis.dbsize() == 0


@pytest.mark.parametrize(
    ("value", "translated"),
    [
        ("bad@@x", "%(value)r in %(field)s is not a valid email address."),
        (
            "a@x.com, b@x.com",
            "%(field)s takes one address per string, and %(value)r holds several.",
        ),
        ("", "An address in %(field)s is empty."),
    ],
)
def test_address_messages_go_through_gettext(value, translated, monkeypatch):
    from outbox.validation import addresses

    seen: list[str] = []
    monkeypatch.setattr(addresses, "_", lambda text: seen.append(text) or f"[{text}]")
    with pytest.raises(ValidationError) as info:
        addresses.normalize_address("reply_to", value)
    assert seen == [translated]
    message = info.value.message_dict["reply_to"][0]
    assert message.startswith("[") and message.endswith("]") and "reply_to" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"recipient_list": "a@example.com"},  # a string, not a list
        {"recipient_list": [42]},
        {"subject": None},
        {"message": b"bytes"},
        {"headers": ["X-A", "b"]},
        {"send_at": "tomorrow"},
        {"max_attempts": "3"},
        {"max_attempts": True},
        {"attachments": ["file.txt"]},
    ],
)
def test_wrong_types_raise_type_error(kwargs):
    args = {"subject": "s", "message": "b", "from_email": None, "recipient_list": ["a@example.com"]}
    args.update(kwargs)
    with pytest.raises(TypeError):
        enqueue_email(**args)
    assert Delivery.objects.count() == 0
