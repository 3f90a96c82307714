"""Whether the outbox delivered what Django builds: the checks of the fidelity property.

``check_locmem`` and ``check_smtp`` send messages through ``OutboxBackend`` and
a burst worker, then compare each copy delivered with Django's own build of
the original (``tests/backends/test_fidelity_property.py`` says what must
hold): the structure first, so that a failure reads as what differs, then the
bytes, apart from what two builds by Django differ in or the outbox changes
by design.
"""

from __future__ import annotations

import difflib
import email
import email.policy
import hashlib
import re
from email.utils import parseaddr
from itertools import zip_longest
from typing import Any

import pytest
from django.core import mail
from django.core.mail import EmailMessage
from hypothesis import event
from hypothesis.control import currently_in_test_context

from outbox.models import Delivery, Email
from outbox.queue import RedisQueue
from outbox.worker import Worker
from tests.backends.fidelity_messages import MODERN, Spec
from tests.servers import SMTPRecorder, empty_outbox

# --- Comparing --------------------------------------------------------------


def count(what: str) -> None:
    """A hypothesis event (shown by --hypothesis-show-statistics); nothing outside the property."""
    if currently_in_test_context():
        event(what)


def deliver() -> None:
    assert Worker(burst=True).run(install_signal_handlers=False) == 0


def envelope(message: EmailMessage) -> list[str]:
    """The copies' recipients: each distinct address (without case) once, the first as written."""
    seen: set[str] = set()
    result = []
    for recipient in message.recipients():
        recipient = str(recipient)
        key = (parseaddr(recipient)[1] or recipient).lower()
        if key not in seen:
            seen.add(key)
            result.append(recipient)
    return result


def senders_header(message: EmailMessage, name: str) -> Any:
    for key, value in message.extra_headers.items():
        if key.lower() == name:
            return value
    return None


HEADER = re.compile(rb"(?m)^([A-Za-z0-9-]+):[^\n]*(?:\n[ \t][^\n]*)*")


def boundaries(data: bytes) -> list[str]:
    parsed = email.message_from_bytes(data, policy=email.policy.compat32)
    return [b for part in parsed.walk() if (b := part.get_boundary()) is not None]


def comparable(data: bytes, normalised: set[str]) -> bytes:
    """``data`` with the top-level ``normalised`` headers' values and every boundary replaced."""
    linesep = b"\r\n" if b"\r\n" in data.partition(b"\n")[0] + b"\n" else b"\n"
    head, sep, body = data.partition(linesep * 2)

    def header(match: re.Match[bytes]) -> bytes:
        name = match.group(1)
        return name + b": (varies)" if name.decode().lower() in normalised else match.group(0)

    data = HEADER.sub(header, head.replace(b"\r\n", b"\n")).replace(b"\n", linesep) + sep + body
    # In walk order, so that the same part's boundary gets the same name in both.
    for i, boundary in enumerate(dict.fromkeys(boundaries(data))):
        data = data.replace(boundary.encode(), f"BOUNDARY-{i}".encode())
    return data


def payload_summary(payload: bytes | None) -> Any:
    if payload is None or len(payload) <= 120:
        return payload
    return (payload[:60], len(payload), hashlib.sha256(payload).hexdigest()[:16])


def structure(data: bytes) -> dict[str, Any]:
    """What ``data`` is made of, readable in an assertion's diff."""
    parsed = email.message_from_bytes(data, policy=email.policy.compat32)
    headers = [(k, str(v)) for k, v in parsed.items()]
    parts = []
    for part in parsed.walk():
        parts.append(
            {
                "type": part.get_content_type(),
                "charset": part.get_content_charset(),
                "cte": part.get("Content-Transfer-Encoding"),
                "disposition": part.get("Content-Disposition"),
                "cid": part.get("Content-ID"),
                "filename": part.get_filename(),
                "payload": None
                if part.is_multipart()
                else payload_summary(part.get_payload(decode=True)),
            }
        )
    return {"headers": headers, "parts": parts}


def check_message_ids(message: EmailMessage, ids: dict[str, str], taken: Any = ()) -> bool:
    """The copies' Message-IDs; True when they must equal Django's (the sender's, unchanged).

    ``taken``: the Message-IDs rows had before (of a message sent earlier).
    """
    assert len(set(ids.values())) == len(ids), ids
    given = senders_header(message, "message-id")
    callers = str(given).strip() if given is not None else None
    if callers and len(ids) == 1 and callers not in taken:
        count("the sender's Message-ID, one copy")
        assert list(ids.values()) == [callers]
        return True
    own = re.compile(r"<[0-9a-f]{32}@[A-Za-z0-9.-]+>")
    expected = own
    if callers and not any(c.isspace() for c in callers) and len(callers) + 33 <= 255:
        left, at, right = callers.removeprefix("<").removesuffix(">").rpartition("@")
        if at and left and right:
            expected = re.compile(rf"<{re.escape(left)}\.[0-9a-f]{{32}}@{re.escape(right)}>")
    if callers:
        count(
            f"the sender's Message-ID, several copies: {'ours' if expected is own else 'extended'}"
        )
    for message_id in ids.values():
        assert expected.fullmatch(message_id), (callers, message_id)
    return False


def differences(delivered: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs between two ``structure()``s, one line per header or part."""
    found = []
    if delivered["headers"] != expected["headers"]:
        for a, b in zip_longest(delivered["headers"], expected["headers"]):
            if a != b:
                found.append(f"header: delivered {a!r}, Django {b!r}")
    for i, (a, b) in enumerate(zip_longest(delivered["parts"], expected["parts"])):
        if a != b:
            found.append(f"part {i}: delivered {a!r},\n        Django {b!r}")
    return found


def assert_same_message(delivered: bytes, expected: bytes, normalised: set[str], what: str) -> None:
    """The structure first (a readable diff), then the bytes."""
    delivered, expected = comparable(delivered, normalised), comparable(expected, normalised)
    found = differences(structure(delivered), structure(expected))
    assert not found, f"the copy to {what} differs from Django's message:\n" + "\n".join(found)
    if delivered != expected:
        diff = difflib.unified_diff(
            expected.decode("utf-8", "replace").splitlines(),
            delivered.decode("utf-8", "replace").splitlines(),
            "Django",
            "delivered",
            lineterm="",
        )
        raise AssertionError(f"the copy to {what} differs in its bytes:\n" + "\n".join(diff))


def send_through_outbox(messages: list[EmailMessage]) -> Exception | None:
    """Send them (one with ``send()``, several in one ``send_messages()`` call) and deliver.

    Returns what Django's ``message()`` raised for the first message it
    refuses: then the outbox refuses the call before anything is written. A
    ``ValueError`` (``BadHeaderError``) or ``TypeError`` of Django's is the
    outbox's too, so that ``except`` clauses written for Django still catch it;
    Django 5.2's own crashes (an ``AttributeError`` for a text alternative
    given as bytes) may come second to another problem the outbox finds first.
    """
    for message in messages:
        try:
            message.message()
        except Exception as exc:
            count(f"refused by Django: {type(exc).__name__}")
            expected = type(exc) if isinstance(exc, (ValueError, TypeError)) else Exception
            with pytest.raises(expected):
                send(messages)
            assert Email.objects.count() == 0
            assert RedisQueue().redis.dbsize() == 0
            return exc
    assert send(messages) == len(messages)
    deliver()
    return None


def send(messages: list[EmailMessage]) -> int:
    if len(messages) == 1:
        return messages[0].send()
    backend = mail.mailers["default"] if MODERN else mail.get_connection()
    return backend.send_messages(messages)


def normalised_headers(message: EmailMessage, ids_equal: bool) -> set[str]:
    names = set()
    if senders_header(message, "date") is None:
        names.add("date")
    if not ids_equal:
        names.add("message-id")
    return names


def check_locmem(*specs: Spec) -> None:
    check_locmem_messages([spec.build() for spec in specs])


def check_locmem_message(message: EmailMessage) -> None:
    check_locmem_messages([message])


def check_locmem_messages(messages: list[EmailMessage]) -> None:
    """Send ``messages`` through the outbox to locmem; each copy must be Django's message."""
    empty_outbox()
    if send_through_outbox(messages) is not None:
        return
    deliveries = list(Delivery.objects.values_list("email_id", "recipient", "message_id"))
    # One Email row per message, in the order sent.
    emails = sorted({email_id for email_id, _, _ in deliveries})
    assert len(emails) == len(messages)
    email_of = {message_id: email_id for email_id, _, message_id in deliveries}
    copies = list(mail.outbox)
    count(f"messages: {len(messages)}, copies: {len(copies)}")
    taken: set[str] = set()
    for message, email_id in zip(messages, emails, strict=True):
        rows = {r: message_id for e, r, message_id in deliveries if e == email_id}
        mine = [c for c in copies if email_of[str(c.message()["Message-ID"])] == email_id]
        wanted = envelope(message)
        assert sorted(c.recipients()[0] for c in mine) == sorted(wanted)
        assert all(len(c.recipients()) == 1 for c in mine)
        assert sorted(rows) == sorted(wanted)
        ids_equal = check_message_ids(message, rows, taken)
        taken.update(rows.values())
        normalised = normalised_headers(message, ids_equal)
        expected = message.message().as_bytes()
        for copy in mine:
            [recipient] = copy.recipients()
            assert copy.from_email == str(message.from_email)
            delivered = copy.message()
            assert str(delivered["Message-ID"]) == rows[recipient]
            assert_same_message(delivered.as_bytes(), expected, normalised, recipient)


# --- Over SMTP --------------------------------------------------------------


def smtp_bytes(message: EmailMessage) -> bytes:
    """What Django's SMTP backend hands to smtplib for ``message``, as the server receives it."""
    if MODERN:
        data = message.message(policy=email.policy.SMTP).as_bytes()
    else:
        data = message.message().as_bytes(linesep="\r\n")
    # smtplib sends bytes as they are, ending them with a line break.
    return data if data.endswith(b"\r\n") else data + b"\r\n"


def envelope_address(address: str, message: EmailMessage) -> str:
    """An envelope address as Django's SMTP backend writes it."""
    if MODERN:
        return mail.mailers["delivery"].prep_address(address)  # the SMTP mailer of use_outbox()
    from django.core.mail.message import sanitize_address

    # smtplib then takes the address out of "Name <address>".
    return parseaddr(sanitize_address(address, message.encoding or "utf-8"))[1]


def check_smtp(spec: Spec, server: SMTPRecorder) -> None:
    empty_outbox()
    server.received.clear()
    message = spec.build()
    if send_through_outbox([message]) is not None:
        return
    rows = dict(Delivery.objects.values_list("recipient", "message_id"))
    wanted = envelope(message)
    assert len(server.received) == len(wanted)
    ids_equal = check_message_ids(message, rows)
    normalised = normalised_headers(message, ids_equal)
    expected = smtp_bytes(message)
    by_id = {message_id: recipient for recipient, message_id in rows.items()}
    # A long Message-ID is folded onto a line of its own: strip() unfolds it.
    assert sorted(by_id[r.message_id.strip()] for r in server.received) == sorted(wanted)
    for received in server.received:
        recipient = by_id[received.message_id.strip()]
        assert received.rcpt_tos == [envelope_address(recipient, message)]
        assert received.mail_from == envelope_address(message.from_email, message)
        assert_same_message(received.raw, expected, normalised, recipient)
