"""Hostile addresses for ``enqueue_email``: lists of any size, any text, and addresses too long as sent.

Every call is refused and writes nothing, or writes exactly one delivery per
distinct recipient, compared without case (``tests/faults/hostile.py``); an
address too long as it is sent (RFC 5321, the domain in its IDNA form) is
refused on every way in.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import aenqueue_email, enqueue_email, enqueue_many
from outbox.backends import OutboxBackend
from outbox.exceptions import InvalidEmailError
from outbox.models import Delivery
from tests.addresses import (
    LOCAL_PART_TOO_LONG,
    LONGEST_LEGAL,
    ONE_OCTET_TOO_LONG,
    TOO_LONG_ON_THE_WIRE,
)
from tests.cells import only_in_cells
from tests.faults.hostile import (
    GOOD,
    HYPOTHESIS,
    INJECTED_ADDRESS,
    assert_nothing_written,
    attempt,
    check_written,
    hostile_text,
    skip_encoded_words,
)
from tests.servers import empty_outbox, sample_message

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells(
        "6.1:postgres", why="PostgreSQL enforces the column lengths; Django's newest version"
    ),
]


# -- addresses --------------------------------------------------------------------------

INVALID_ADDRESSES = [
    "",
    "   ",
    "not-an-address",
    "a@b@example.com",
    "@example.com",
    "user@",
    "a@example.com, b@example.com",
    "a@example.com\r\nBcc: " + INJECTED_ADDRESS,
    "a@example.com\nX-Injected: yes",
    "Name\r\n <a@example.com>",
    "a@example.com\x00",
    "Evil <a@example.com>, " + INJECTED_ADDRESS,
    "<a@example.com> " + INJECTED_ADDRESS,
    "a@example.com <" + INJECTED_ADDRESS + ">",
    "x" * 400 + "@example.com",
    "a@exa\u2028mple.com",
]
WRONG_TYPE_ADDRESSES = [None, 42, b"a@example.com", ["a@example.com"], {"a": 1}, 3.5]


def recipient(i: int, rng: random.Random) -> tuple[str, str]:
    """A valid address spelled in one of several ways, and its canonical form."""
    local = f"user{i}"
    spelled = "".join(c.upper() if rng.random() < 0.3 else c for c in local)
    domain = rng.choice(["example.com", "Example.COM", "sub.example.org"])
    address = f"{spelled}@{domain}"
    style = rng.randrange(4)
    if style == 1:
        address = f"User Number {i} <{address}>"
    elif style == 2:
        address = f'"Doe, Jane {i}" <{address}>'
    elif style == 3:
        address = f"  {address}  "
    return address, f"{local}@{domain}".lower()


@settings(max_examples=15, **HYPOTHESIS)
@given(
    count=st.integers(0, 3000),
    distinct=st.integers(1, 400),
    invalid=st.lists(
        st.sampled_from(INVALID_ADDRESSES + WRONG_TYPE_ADDRESSES),
        max_size=3,  # type: ignore[operator]
    ),
    seed=st.integers(0, 2**32),
)
def test_recipient_lists(count, distinct, invalid, seed):
    empty_outbox()
    rng = random.Random(seed)
    recipients: list[Any] = []
    expected: set[str] = set()
    for _ in range(count):
        spelled, canonical = recipient(rng.randrange(distinct), rng)
        recipients.append(spelled)
        expected.add(canonical)
    for bad in invalid:
        recipients.insert(rng.randrange(len(recipients) + 1), bad)
    result = attempt("s", "b", "shop@example.com", recipients)
    if invalid or not recipients:
        assert result is None, "a list with an invalid or no recipient was accepted"
        return
    assert result is not None
    assert len(result) == len(expected)
    check_written(result, expected=expected)


@settings(max_examples=200, **HYPOTHESIS)
@given(
    to=st.lists(
        st.one_of(
            hostile_text,
            st.builds(lambda a, b: f"{a}@{b}", hostile_text, hostile_text),
            st.builds(lambda n, a: f"{n} <{a}@example.com>", hostile_text, hostile_text),
            st.emails().map(str),
        ),
        min_size=1,
        max_size=4,
    ),
    sender=st.none() | hostile_text | st.emails().map(str),
    reply_to=st.none() | st.lists(hostile_text | st.emails().map(str), max_size=2),
)
def test_arbitrary_addresses(to, sender, reply_to):
    skip_encoded_words(to, sender, reply_to)
    empty_outbox()
    result = attempt("s", "b", sender, to, reply_to=reply_to)
    if result is None:
        return
    check_written(result, reply_to=reply_to)


# -- addresses too long as they are sent (RFC 5321, the domain in its IDNA form) -----------

TOO_LONG_AS_SENT = {
    "308 characters, an IDN domain of 783 octets as sent": TOO_LONG_ON_THE_WIRE,
    "one octet past the 256 of a path": ONE_OCTET_TOO_LONG,
    "a local part of 65 octets": LOCAL_PART_TOO_LONG,
}


def _refused_as_too_long(
    call: Any, field: str, error: type[ValidationError] = InvalidEmailError
) -> None:
    with pytest.raises(error) as caught:
        call()
    assert list(caught.value.message_dict) == [field], caught.value.message_dict
    assert "too long as it is sent" in str(caught.value)
    assert_nothing_written()


@pytest.mark.parametrize("address", TOO_LONG_AS_SENT.values(), ids=TOO_LONG_AS_SENT.keys())
@pytest.mark.parametrize("field", ["recipient_list", "from_email", "reply_to"])
def test_an_address_too_long_as_sent_is_refused_by_enqueue_sync_async_and_bulk(field, address):
    empty_outbox()
    kwargs = {**GOOD, field: address if field == "from_email" else [address]}
    _refused_as_too_long(lambda: enqueue_email(**kwargs), field)
    _refused_as_too_long(lambda: async_to_sync(aenqueue_email)(**kwargs), field)
    # enqueue_many names the item (its ValidationError wraps the item's).
    _refused_as_too_long(lambda: enqueue_many([GOOD, kwargs]), f"items[1].{field}", ValidationError)


@pytest.mark.parametrize("address", TOO_LONG_AS_SENT.values(), ids=TOO_LONG_AS_SENT.keys())
@pytest.mark.parametrize("field", ["to", "cc", "bcc", "from_email", "reply_to"])
def test_an_address_too_long_as_sent_is_refused_by_the_drop_in_backend(field, address):
    empty_outbox()
    value = address if field == "from_email" else [address]
    message = sample_message(**{field: value})
    _refused_as_too_long(lambda: OutboxBackend().send_messages([message]), field)


def test_the_longest_address_rfc_5321_allows_is_accepted_on_every_path():
    empty_outbox()
    [row] = enqueue_email(**{**GOOD, "recipient_list": [LONGEST_LEGAL]})
    [[bulk]] = enqueue_many([{**GOOD, "recipient_list": [f"Name <{LONGEST_LEGAL}>"]}])
    assert OutboxBackend().send_messages([sample_message(to=[LONGEST_LEGAL])]) == 1
    assert row.recipient == LONGEST_LEGAL
    # With a display name the domain is stored as sent (formataddr takes ASCII only).
    assert bulk.recipient.endswith(f"@{LONGEST_LEGAL.partition('@')[2].encode('idna').decode()}>")
    assert Delivery.objects.filter(recipient=LONGEST_LEGAL).count() == 2
