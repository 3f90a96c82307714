"""Drop-in fidelity as a property: whatever Django builds, the outbox delivers (issue 25).

Hypothesis writes random Django messages (``EmailMessage`` and
``EmailMultiAlternatives``): subjects and bodies with non-ASCII text and long
lines (sometimes a header injection in the subject), HTML bodies,
``encoding`` None/UTF-8/Latin-1 (with text that encoding can carry; on 5.2
also a quoted-printable ``Charset``), To/Cc/Bcc/Reply-To in every address
form Django takes (display names, quoted commas, non-ASCII names, IDN domains,
lazy subjects; on Django 6 a bare local part and a non-ASCII local part),
extra headers (custom ``X-*`` ones, one an int, and From, Reply-To, To, Cc,
Date and Message-ID given in ``headers=``, in any case), alternatives (HTML, a
calendar invite, plain, bytes, several) and attachments (text and binary
files, str and bytes, text that is not UTF-8, non-ASCII and long file names,
message/rfc822, and MIME parts with a Content-ID: ``MIMEPart`` on Django 6,
``MIMEImage``/``MIMEText``/``MIMEBase`` on 5.2). Each goes through
``OutboxBackend`` and a burst worker, delivering to locmem; the smaller second
property delivers over SMTP (``SMTPRecorder``) and compares the bytes the
server received with what Django's SMTP backend sends.

What must hold:

- one copy per distinct envelope address (To + Cc + Bcc, compared without
  case), whose ``recipients()`` is that address alone as the sender first
  wrote it, and whose envelope sender is the message's ``from_email`` (over
  SMTP: MAIL FROM and RCPT TO as Django's SMTP backend writes them);
- each copy's ``message()`` is Django's own ``message()`` of the original,
  byte for byte, apart from what differs between two builds by Django itself
  or by design:

  - **Date**, unless the sender gave one in ``headers=``: then it is equal;
  - **Message-ID**: each copy carries its row's (``Delivery.message_id``, what
    reconcilers match). The sender's own ``headers={"Message-ID": ...}`` is
    kept as it is when the message has one recipient; with several, each copy
    gets the documented ``<left.<32 hex>@right>`` form of it, or the outbox's
    own ID when the sender's cannot be extended (see
    ``outbox.mail.message_id.copy_message_ids``); checked here too;
  - **multipart boundaries**, random per build.

- a message Django's ``message()`` refuses is refused by ``send()`` before
  anything is written, with Django's ``ValueError``/``TypeError`` class.

By design, and so not drawn: Django sends one message to all its envelope
recipients (a repeated address twice), the outbox one copy per distinct
address; text with NUL characters or lone surrogates, which the database
cannot store, is refused at ``send()``; over SMTP, a non-ASCII local part,
which Django's SMTP backend refuses without SMTPUTF8 (the outbox's delivery
of it fails permanently), and on 5.2 a header word longer than an SMTP line,
which no server takes from Django either.

The structure (content types in walk order, charsets, transfer encodings,
Content-ID, dispositions, file names, decoded payloads) is compared before the
bytes so that a failure reads as what differs (``tests/backends/fidelity_checks.py``;
the messages are drawn by ``tests/backends/fidelity_messages.py``). What the
property found is fixed, and each finding's minimal example is kept as a test
in ``tests/backends/test_fidelity_cases.py``.

The number of examples: OUTBOX_TEST_FIDELITY_EXAMPLES (default 50) and
OUTBOX_TEST_FIDELITY_SMTP_EXAMPLES (default 15); --hypothesis-show-statistics
shows what the examples covered. Hypothesis examples share one test (and one
database), so each example wipes the outbox tables, Redis and locmem's outbox.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.backends.fidelity_checks import check_locmem, check_smtp
from tests.backends.fidelity_messages import specs
from tests.cells import only_in_cells
from tests.delivery import use_outbox, use_smtp_delivery
from tests.servers import SMTPRecorder

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells("6.1:sqlite", why="Django's message build is what varies; its newest version"),
]

EXAMPLES = int(os.environ.get("OUTBOX_TEST_FIDELITY_EXAMPLES", "50"))
SMTP_EXAMPLES = int(os.environ.get("OUTBOX_TEST_FIDELITY_SMTP_EXAMPLES", "15"))
HYPOTHESIS = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}


@pytest.fixture
def outbox(settings) -> None:
    """Set once per test, not per example (each setting made stacks an override)."""
    use_outbox(settings)


@pytest.fixture
def smtp_outbox(settings, smtp_server) -> SMTPRecorder:
    use_smtp_delivery(settings, smtp_server)
    return smtp_server


@settings(max_examples=EXAMPLES, **HYPOTHESIS)
@given(spec=specs(), second=st.none() | specs())
def test_every_copy_is_the_message_django_builds(outbox, spec, second):
    """``second``: two messages in one ``send_messages()`` call, and in one worker's burst."""
    check_locmem(spec, *([second] if second else []))


@settings(max_examples=SMTP_EXAMPLES, **HYPOTHESIS)
@given(spec=specs("smtp"))
def test_every_copy_goes_out_over_smtp_as_django_sends_it(smtp_outbox, spec):
    check_smtp(spec, smtp_outbox)
