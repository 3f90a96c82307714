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
bytes so that a failure reads as what differs. What the property found is
fixed, and each finding's minimal example is kept as a test at the end.

The number of examples: OUTBOX_TEST_FIDELITY_EXAMPLES (default 50) and
OUTBOX_TEST_FIDELITY_SMTP_EXAMPLES (default 15); --hypothesis-show-statistics
shows what the examples covered. Hypothesis examples share one test (and one
database), so each example wipes the outbox tables, Redis and locmem's outbox.
"""

from __future__ import annotations

import difflib
import email
import email.policy
import hashlib
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from email import encoders
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.image import MIMEImage
from email.mime.text import MIMEText
from email.utils import parseaddr
from itertools import zip_longest
from typing import Any

import django
import pytest
from django.core import mail
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.utils.translation import gettext_lazy
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from outbox.models import Delivery, Email
from outbox.queue import RedisQueue
from outbox.worker import Worker
from tests.cells import only_in_cells
from tests.delivery import use_outbox, use_smtp_delivery
from tests.servers import SMTPRecorder, empty_outbox

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells("6.1:sqlite", why="Django's message build is what varies; its newest version"),
]

MODERN = django.VERSION >= (6, 0)
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

# --- Text -------------------------------------------------------------------

ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'-()[]<>@\"=_/&%#*+"
LATIN_1 = "éüßÇñ£°½\xa0"
WIDE = "€łŒ日本語😀"
LATIN_1_ENCODING = "iso-8859-1"


# Django 5.2 also takes an email.charset.Charset (its documented way to send
# quoted-printable UTF-8): in the spec by this name.
QP_CHARSET = "Charset('utf-8', body_encoding=QP)"


def qp_charset() -> Any:
    from email.charset import QP, Charset

    charset = Charset("utf-8")
    charset.body_encoding = QP
    return charset


def alphabet(encoding: str | None) -> str:
    """The characters a message in ``encoding`` can carry."""
    return ASCII + LATIN_1 + ("" if encoding == LATIN_1_ENCODING else WIDE)


def words(chars: str, max_size: int = 30, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(chars), min_size=min_size, max_size=max_size)


def long_line(chars: str, longest: int = 1200) -> st.SearchStrategy[str]:
    """A line past 78 characters: one repeated character (a word up to ``longest``), or words."""
    return st.one_of(
        st.builds(lambda c, n: c * n, st.sampled_from(chars), st.integers(79, longest)),
        st.builds(lambda w, n: " ".join([w] * n), words(chars, 12, 1), st.integers(10, 120)),
    )


def line(chars: str, longest: int = 1200) -> st.SearchStrategy[str]:
    """Single-line text (a subject, a header value), sometimes long."""
    return st.one_of(words(chars), long_line(chars, longest))


def multiline(chars: str) -> st.SearchStrategy[str]:
    """A body: empty, short, or with line breaks, long lines and lines SMTP treats specially."""
    pieces = st.one_of(
        words(chars),
        long_line(chars),
        st.sampled_from(["\n", "\r\n", "\n\n", "From here\n", "\n.\n", "  \n", "\t", "\n-- \n"]),
    )
    return st.lists(pieces, max_size=8).map("".join)


# --- Addresses --------------------------------------------------------------

LOCAL_PARTS = ["ann", "bob", "Bob", "c.d", "e+tag"]
DOMAINS = ["example.com", "example.org", "bücher.de"]


@st.composite
def addresses(draw: Any, chars: str, envelope: str = "locmem") -> str:
    """One address as a sender may write it (an SMTP ``envelope`` one without SMTPUTF8)."""
    forms = ["plain", "name", "quoted comma", "non-ASCII name"]
    if MODERN:
        forms.append("local part")
    if MODERN and envelope != "smtp":  # Django's SMTP backend refuses it without SMTPUTF8
        forms.append("non-ASCII local part")
    form = draw(st.sampled_from(forms))
    if form == "local part":  # Django ticket #15042; Django 5.2 refuses it
        return draw(st.sampled_from(["webmaster", "postmaster"]))
    if form == "non-ASCII local part":  # Django 6 takes it (for SMTPUTF8)
        return "jörg@example.com"
    address = f"{draw(st.sampled_from(LOCAL_PARTS))}@{draw(st.sampled_from(DOMAINS))}"
    if form == "plain":
        return address
    if form == "name":
        return f"Ann Smith <{address}>"
    if form == "quoted comma":
        return f'"Smith, Ann" <{address}>'
    names = ["Jörg Müller", "Zoë"] + (["山田 太郎", "Łukasz"] if WIDE[0] in chars else [])
    return f"{draw(st.sampled_from(names))} <{address}>"


def address_lists(chars: str, envelope: str = "locmem") -> st.SearchStrategy[list[str]]:
    return st.lists(addresses(chars, envelope), max_size=3)


# --- Headers ----------------------------------------------------------------

MESSAGE_IDS = [
    "<order-42@shop.example>",
    "<a.b.c-1@mail.example.org>",
    "order-7@shop.example",  # no angle brackets
    "<no-at-sign>",  # cannot be extended: several copies get the outbox's own
    "<" + "x" * 230 + "@example.com>",  # too long to extend
]
DATES: list[Any] = [
    datetime(2001, 11, 9, 1, 8, 47, tzinfo=UTC),
    datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt_timezone(timedelta(hours=2))),
    datetime(2030, 1, 1, 12, 0, 0),  # naive
    "Fri, 09 Nov 2001 01:08:47 -0000",
]


@st.composite
def extra_headers(draw: Any, chars: str, longest: int) -> dict[str, Any]:
    items: list[tuple[str, Any]] = []
    optional = {
        "X-Tag": line(chars, longest),
        "X-Mailer-Ref": st.sampled_from(
            ["42", "campaign/2024-05", "ü-ref", "  padded  ", "=?utf-8?q?caf=C3=A9?=", 42]
        ),
        ("Message-ID", "Message-Id", "message-id"): st.sampled_from(MESSAGE_IDS),
        ("Date", "date"): st.sampled_from(DATES),
        "From": addresses(chars),
        "Reply-To": address_lists(chars).filter(bool).map(", ".join),
        "To": address_lists(chars).filter(bool).map(", ".join),
        "Cc": address_lists(chars).filter(bool).map(", ".join),
    }
    for names, values in optional.items():
        # Each in about a quarter of the messages; shrinks to none.
        if draw(st.integers(0, 3)) == 3:
            name = draw(st.sampled_from(names)) if isinstance(names, tuple) else names
            items.append((name, draw(values)))
    return dict(draw(st.permutations(items)))


# --- Alternatives and attachments ------------------------------------------

ICS = (
    "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nMETHOD:REQUEST\r\nBEGIN:VEVENT\r\n"
    "UID:42@example.com\r\nSUMMARY:Réunion\r\nDTSTART:20240501T090000Z\r\n"
    "END:VEVENT\r\nEND:VCALENDAR\r\n"
)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
RFC822 = (
    b"From: a@example.com\nTo: b@example.com\nSubject: inner\n"
    b"Date: Fri, 09 Nov 2001 01:08:47 -0000\nMessage-ID: <inner@example.com>\n\ninner body\n"
)


@st.composite
def alternatives(draw: Any, chars: str) -> list[tuple[Any, str]]:
    kinds = ["html", "calendar", "plain", "json bytes", "html bytes"]
    result = []
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=3)):
        if kind == "html":
            result.append((f"<p>{draw(multiline(chars))}</p>", "text/html"))
        elif kind == "html bytes":  # Django 6 decodes them as UTF-8; 5.2 fails (AttributeError)
            result.append((f"<p>{draw(words(chars))}</p>".encode(), "text/html"))
        elif kind == "calendar":
            result.append((ICS, "text/calendar"))
        elif kind == "plain":
            result.append((draw(multiline(chars)), "text/plain"))
        else:
            result.append((b'{"a": 1}', "application/json"))
    return result


FILE_NAMES = [None, "", "notes.txt", "report.pdf", "Grüße.txt", "日本語.csv", "x" * 90 + ".txt"]


@dataclass(frozen=True)
class Part:
    """A MIME part to attach (built fresh for every message, as a caller would)."""

    kind: str  # "inline image", "text", "pdf"
    filename: str | None
    cid: str | None

    def build(self) -> Message:
        return self._modern() if MODERN else self._legacy()

    def _modern(self) -> Message:
        from email.message import MIMEPart

        part = MIMEPart()
        if self.kind == "inline image":
            part.set_content(
                PNG,
                maintype="image",
                subtype="png",
                disposition="inline",
                filename=self.filename,
                cid=self.cid,
            )
        elif self.kind == "text":
            part.set_content("Grüße, text part", filename=self.filename, cid=self.cid)
        else:
            part.set_content(
                b"%PDF-1.4 binary\x00\xff",
                maintype="application",
                subtype="pdf",
                filename=self.filename,
                cid=self.cid,
            )
        return part

    def _legacy(self) -> Message:
        part: Message
        if self.kind == "inline image":
            part = MIMEImage(PNG, "png")
            disposition = "inline"
        elif self.kind == "text":
            part = MIMEText("Grüße, text part", "plain", "utf-8")
            disposition = "attachment"
        else:
            part = MIMEBase("application", "pdf")
            part.set_payload(b"%PDF-1.4 binary\x00\xff")
            encoders.encode_base64(part)
            disposition = "attachment"
        if self.cid:
            part.add_header("Content-ID", self.cid)
        if self.filename:
            part.add_header("Content-Disposition", disposition, filename=self.filename)
        return part


@dataclass(frozen=True)
class Inner:
    """A Django ``EmailMessage`` attached as message/rfc822 (built fresh for every message)."""

    body: str
    with_file: bool

    def build(self) -> EmailMessage:
        inner = EmailMessage(
            "Fwd: inner",
            self.body,
            "a@example.com",
            ["b@example.com"],
            headers={"Date": DATES[0], "Message-ID": "<inner@example.com>"},
        )
        if self.with_file:
            inner.attach("inner.bin", b"\x00\x01", "application/octet-stream")
        return inner


@st.composite
def attachments(draw: Any, chars: str) -> list[Any]:
    result: list[Any] = []
    kinds = ["text", "text bytes", "text not UTF-8", "binary", "str binary", "rfc822", "guessed"]
    kinds += ["part", "attached message"]
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=3)):
        name = draw(st.sampled_from(FILE_NAMES))
        if kind == "part":
            result.append(
                Part(
                    draw(st.sampled_from(["inline image", "text", "pdf"])),
                    draw(st.sampled_from([None, "logo.png", "Grüße.png"])),
                    draw(st.sampled_from([None, "<logo@example.com>", "<part.1@example.org>"])),
                )
            )
        elif kind == "text":
            mimetype = draw(st.sampled_from(["text/plain", "text/csv", "text/html"]))
            result.append((name, draw(multiline(chars)), mimetype))
        elif kind == "text bytes":
            result.append((name, draw(multiline(chars)).encode(), "text/plain"))
        elif kind == "text not UTF-8":  # Django sends it as application/octet-stream
            result.append((name, b"caf\xe9 \xff\xfe", "text/plain"))
        elif kind == "binary":
            mimetype = draw(
                st.sampled_from(["application/pdf", "image/png", "application/octet-stream"])
            )
            result.append((name, draw(st.binary(max_size=300)), mimetype))
        elif kind == "str binary":  # a str for a non-text type: Django encodes it
            result.append((name, draw(words(chars)), "application/json"))
        elif kind == "rfc822":
            result.append((name, RFC822, "message/rfc822"))
        elif kind == "attached message":  # a Django message, with the headers that vary fixed
            result.append((name, Inner(draw(words(chars)), draw(st.booleans())), "message/rfc822"))
        else:  # attach() guesses the type from the name
            result.append(
                (draw(st.sampled_from(["a.txt", "b.pdf", "c.png", "noext"])), b"data", None)
            )
    return result


# --- Messages ---------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What a message is made of; ``build()`` makes the Django message (printed on failure)."""

    multi: bool
    subject: str
    lazy_subject: bool
    body: str
    from_email: str | None
    to: tuple[str, ...]
    cc: tuple[str, ...]
    bcc: tuple[str, ...]
    reply_to: tuple[str, ...]
    headers: tuple[tuple[str, Any], ...]
    content_subtype: str
    encoding: str | None
    alternatives: tuple[tuple[Any, str], ...]
    attachments: tuple[Any, ...]
    mixed_subtype: str | None  # Django 5.2 only

    def build(self) -> EmailMessage:
        cls = EmailMultiAlternatives if self.multi else EmailMessage
        message = cls(
            gettext_lazy(self.subject) if self.lazy_subject else self.subject,
            self.body,
            self.from_email,
            list(self.to),
            cc=list(self.cc),
            bcc=list(self.bcc),
            reply_to=list(self.reply_to),
            headers=dict(self.headers),
        )
        message.content_subtype = self.content_subtype
        if self.encoding == QP_CHARSET:
            message.encoding = qp_charset()
        elif self.encoding:
            message.encoding = self.encoding
        if self.mixed_subtype:
            message.mixed_subtype = self.mixed_subtype
        for content, mimetype in self.alternatives:
            message.attach_alternative(content, mimetype)  # type: ignore[attr-defined]
        for item in self.attachments:
            if isinstance(item, Part):
                message.attach(item.build())
            elif isinstance(item[1], Inner):
                message.attach(item[0], item[1].build(), item[2])
            else:
                message.attach(*item)
        return message


@st.composite
def specs(draw: Any, envelope: str = "locmem") -> Spec:
    encoding = draw(
        st.sampled_from([None, "utf-8", LATIN_1_ENCODING] + ([] if MODERN else [QP_CHARSET]))
    )
    chars = alphabet(encoding)
    # Django 5.2 cannot fold a header's word longer than an SMTP line (998):
    # Django's own SMTP delivery of it fails as the outbox's does.
    longest = 1200 if envelope == "locmem" else 900
    to, cc, bcc = (draw(address_lists(chars, envelope)) for _ in range(3))
    if not (to or cc or bcc):
        to = [draw(addresses(chars, envelope))]
    multi = draw(st.booleans())
    return Spec(
        multi=multi,
        # Sometimes a header injection, which Django refuses and so must the outbox.
        subject=draw(line(chars, longest))
        + ("\nBcc: x@example.com" if draw(st.integers(0, 9)) == 9 else ""),
        lazy_subject=draw(st.integers(0, 5)) == 5,
        body=draw(multiline(chars)),
        from_email=draw(st.one_of(st.none(), addresses(chars, envelope))),
        to=tuple(to),
        cc=tuple(cc),
        bcc=tuple(bcc),
        reply_to=tuple(draw(address_lists(chars))),
        headers=tuple(draw(extra_headers(chars, longest)).items()),
        content_subtype=draw(st.sampled_from(["plain", "html"])),
        encoding=encoding,
        alternatives=tuple(draw(alternatives(chars))) if multi else (),
        attachments=tuple(draw(attachments(chars))),
        mixed_subtype=None if MODERN else draw(st.sampled_from([None, None, "related"])),
    )


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


@settings(max_examples=SMTP_EXAMPLES, **HYPOTHESIS)
@given(spec=specs("smtp"))
def test_every_copy_goes_out_over_smtp_as_django_sends_it(smtp_outbox, spec):
    check_smtp(spec, smtp_outbox)


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
