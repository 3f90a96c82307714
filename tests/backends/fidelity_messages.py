"""Random Django messages for the fidelity property (``tests/backends/test_fidelity_property.py``).

Hypothesis strategies, by part of a message: text (non-ASCII, long lines, each
``encoding``'s alphabet), addresses in every form Django takes, extra headers
(the sender's own Message-IDs among them), alternatives and attachments; then
``specs``, a whole message as a ``Spec`` that builds it (``Spec.build``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from email import encoders
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.image import MIMEImage
from email.mime.text import MIMEText
from typing import Any

import django
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.utils.translation import gettext_lazy
from hypothesis import strategies as st

MODERN = django.VERSION >= (6, 0)

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
