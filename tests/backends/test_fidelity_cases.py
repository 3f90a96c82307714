"""Drop-in fidelity, case by case: the sender's Message-ID, and what the property found.

The property of ``tests/backends/test_fidelity_property.py`` draws the
sender's Message-ID from a fixed list: each is checked here, for one and
three recipients. Each of the property's finds is fixed, and its minimal
example kept below. Every case is checked as the property checks its examples
(``tests/backends/fidelity_checks.py``).
"""

from __future__ import annotations

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives

from tests.backends.fidelity_checks import check_locmem_message, check_locmem_messages
from tests.backends.fidelity_messages import MESSAGE_IDS, RFC822
from tests.cells import only_in_cells
from tests.delivery import use_outbox

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells("6.1:sqlite", why="Django's message build is what varies; its newest version"),
]


@pytest.fixture
def outbox(settings) -> None:
    """Set once per test, not per example (each setting made stacks an override)."""
    use_outbox(settings)


@pytest.mark.parametrize("message_id", MESSAGE_IDS)
@pytest.mark.parametrize("recipients", [1, 3])
def test_the_senders_message_id(outbox, message_id, recipients):
    """The rule of ``copy_message_ids``, for every Message-ID the property draws from."""
    to = [f"u{i}@example.com" for i in range(recipients)]
    check_locmem_message(EmailMessage("s", "b", None, to, headers={"Message-ID": message_id}))


def test_the_senders_message_id_once_taken(outbox):
    """Two one-recipient messages with one Message-ID in one call: the second is extended."""
    headers = {"Message-ID": MESSAGE_IDS[0]}
    check_locmem_messages(
        [EmailMessage("s", "b", None, [to], headers=headers) for to in ("a@x.com", "b@x.com")]
    )


# --- What the property found (each fixed since, kept as its minimal example) ----


def test_an_alternative_given_as_bytes(outbox):
    """Once delivered as ``str(b'...')`` (the property's first find; fixed in 8ae0521)."""
    message = EmailMultiAlternatives("s", "b", None, ["a@example.com"])
    message.attach_alternative(b'{"a": 1}', "application/json")
    check_locmem_message(message)


def test_an_attachment_with_an_empty_file_name(outbox):
    """Django 6 writes ``Content-Disposition: attachment; filename``: "" is not None."""
    message = EmailMessage("s", "b", None, ["a@example.com"])
    message.attach("", b"data", "application/octet-stream")
    check_locmem_message(message)


def test_a_non_text_attachment_given_as_non_ascii_str(outbox):
    """Django 5.2 encodes it as MIMEBase does (raw-unicode-escape), 6 as UTF-8."""
    message = EmailMessage("s", "b", None, ["a@example.com"])
    message.attach("data.json", '{"price": "5 €", "café": 1}', "application/json")
    check_locmem_message(message)


def test_an_attached_message(outbox):
    """``_set_boundaries`` once gave a message/rfc822 part a boundary parameter.

    ``is_multipart()`` is true for it (its payload is the attached message).
    """
    message = EmailMessage("s", "b", None, ["a@example.com"])
    message.attach(None, RFC822, "message/rfc822")
    check_locmem_message(message)
