"""Values of the wrong type, and values the database columns cannot hold, given to ``enqueue_email``.

A value of the wrong type is a TypeError (or a ValidationError) and writes
nothing (``tests/faults/hostile.py``). A number too large for its column is a
ValidationError; a long display name, or a long sender domain in the
Message-ID, is refused or fits its column.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import enqueue_email
from outbox.models import Delivery, Email
from tests.cells import only_in_cells
from tests.faults.hostile import (
    GOOD,
    HYPOTHESIS,
    assert_nothing_written,
)
from tests.servers import empty_outbox

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells(
        "6.1:postgres", why="PostgreSQL enforces the column lengths; Django's newest version"
    ),
]


# -- wrong types --------------------------------------------------------------------------

WRONG_TYPES: dict[str, list[Any]] = {
    "subject": [None, 1, b"s", ["s"], {"s": 1}, 1.5],
    "message": [None, 1, b"b", ["b"], {"b": 1}],
    "from_email": [1, b"a@example.com", ["a@example.com"], {"a@example.com": 1}],
    "recipient_list": [
        None,
        1,
        "to@example.com",
        b"to@example.com",
        [None],
        [1],
        [b"to@example.com"],
        ["to@example.com", None],
        [["to@example.com"]],
        ["to@example.com", {"a": 1}],
    ],
    "html_message": [1, b"<p>", ["<p>"], {"a": 1}],
    "reply_to": ["to@example.com", b"x", 1, [None], [1]],
    "headers": [["X-A", "1"], "X-A: 1", 1, {"X-A": 1}, {"X-A": None}, {1: "a"}, {b"X": "a"}],
    "attachments": [
        "file.txt",
        b"data",
        1,
        [None],
        [("a.txt", 1, None)],
        [("a.txt", None, None)],
        [("a.txt", b"x")],
        [["a.txt", b"x", None]],
        [(1, b"x", None)],
        [("a.txt", b"x", 1)],
        {"a.txt": b"x"},
    ],
    "send_at": ["2030-01-01", 1, 1.5, datetime(2030, 1, 1)],
    "priority": [None, 1, b"high", ["high"], "urgent", ""],
    "idempotency_key": [1, b"k", ["k"], "", "k" * 256, "a\nb", "a\x00b"],
    "max_attempts": ["3", 2.5, True, 0, -1, [3]],
}


@settings(max_examples=150, **HYPOTHESIS)
@given(
    bad=st.sampled_from(sorted(WRONG_TYPES)).flatmap(
        lambda field: st.tuples(st.just(field), st.sampled_from(WRONG_TYPES[field]))
    )
)
def test_wrong_types_are_refused_and_write_nothing(bad):
    empty_outbox()
    field, value = bad
    kwargs = {**GOOD, field: value}
    with pytest.raises((TypeError, ValidationError)):
        enqueue_email(**kwargs)
    assert_nothing_written()


@pytest.mark.parametrize("field", ["recipient_list", "reply_to"])
def test_a_dict_is_not_a_list_of_addresses(field):
    empty_outbox()
    kwargs = {**GOOD, field: {"to@example.com": "Alice"}}
    with pytest.raises(TypeError):
        enqueue_email(**kwargs)


# -- values the database columns cannot hold ------------------------------------------


@pytest.mark.parametrize("value", [2**31, 2**64])
def test_max_attempts_beyond_the_column_is_a_validation_error(value):
    empty_outbox()
    with pytest.raises(ValidationError):
        enqueue_email("s", "b", None, ["to@example.com"], max_attempts=value)
    assert_nothing_written()


@pytest.mark.parametrize("field", ["recipient_list", "from_email"])
def test_long_non_ascii_display_name_fits_the_column(field):
    empty_outbox()
    address = "é" * 290 + " <to@example.com>"
    assert len(address) <= 320
    kwargs = {**GOOD, field: [address] if field == "recipient_list" else address}
    try:
        enqueue_email(**kwargs)
    except ValidationError:
        assert_nothing_written()
        return
    assert all(len(d.recipient) <= 320 for d in Delivery.objects.all())
    assert all(len(e.from_email) <= 320 for e in Email.objects.all())


def test_long_sender_domain_gives_a_message_id_that_fits_the_column():
    empty_outbox()
    domain = ".".join(["d" * 60] * 4) + ".com"  # 248 characters, a valid domain
    sender = f"a@{domain}"
    try:
        enqueue_email("s", "b", sender, ["to@example.com"])
    except ValidationError:
        assert_nothing_written()
        return
    assert all(len(d.message_id) <= 255 for d in Delivery.objects.all())
