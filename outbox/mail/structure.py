"""A Django ``EmailMessage`` as stored by the drop-in backend, and rebuilt for sending.

The backend keeps what Django's ``message()`` reads, so that the worker can
build the message Django itself would have built: the texts in the ``Email``
columns, files and MIME parts as ``Attachment`` rows in order, and the rest in
``Email.structure`` (a JSON object, version ``v``):

====================  ===========================================================
``from``, ``to``,     the addresses as written (``str()`` of each), which Django
``cc``, ``reply_to``  joins into the headers; Bcc addresses are only in the rows
``headers``           ``[[name, value], ...]`` in the caller's order; a datetime
                      value as ``{"datetime": ISO 8601}``
``subtype``           ``content_subtype`` when not ``"plain"``
``encoding``          ``EmailMessage.encoding`` when set (a 5.2 ``Charset`` as
                      its name and encodings)
``alternatives``      ``[[content, mimetype], ...]``; content ``{"column":
                      "html_message"}`` for the first HTML one (stored once), or
                      ``{"base64": ...}`` for bytes
``mixed_subtype``,    Django 5.2's subtypes, when not the default
``alternative_...``
``blank_names``       positions of attachments whose file name was ``""``
====================  ===========================================================

Rebuilding makes Django objects again (a MIME part is parsed back from its
bytes), so the worker sends what ``message()`` makes of them under the Django
it runs.
"""

from __future__ import annotations

import base64
import email
import email.policy
from collections.abc import Sequence
from datetime import datetime
from email.charset import Charset
from email.message import Message
from email.mime.base import MIMEBase
from email.utils import parseaddr
from typing import Any, NamedTuple

from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.utils.functional import Promise

from ..models import Attachment, Email
from ..validation import MODERN_EMAIL_API

STRUCTURE_VERSION = 1


class File(NamedTuple):
    """One entry of ``EmailMessage.attachments`` as an ``Attachment`` row stores it."""

    name: str
    content: bytes
    mimetype: str
    mime_part: bool = False


class Described(NamedTuple):
    """What the backend stores of one message, besides subject, body and sender."""

    html_message: str
    structure: dict[str, Any]
    files: list[File]


def text(value: Any) -> Any:
    """A lazy translation as ``str`` (as Django writes it); anything else as it is."""
    return str(value) if isinstance(value, Promise) else value


def describe(message: EmailMessage, to: list[str], cc: list[str]) -> Described:
    """The columns and structure of ``message`` (``to``/``cc`` as already turned to text)."""
    structure: dict[str, Any] = {
        "v": STRUCTURE_VERSION,
        "from": text(message.from_email),
        "to": to,
        "cc": cc,
        "reply_to": [text(a) for a in message.reply_to or ()],
        "headers": [[text(k), _header_value(v)] for k, v in (message.extra_headers or {}).items()],
    }
    if message.content_subtype != "plain":
        structure["subtype"] = message.content_subtype
    if isinstance(message.encoding, Charset):  # Django 5.2 takes one, with its encodings
        structure["encoding"] = {
            "charset": message.encoding.input_charset,
            "header": message.encoding.header_encoding,
            "body": message.encoding.body_encoding,
        }
    elif message.encoding:
        structure["encoding"] = str(message.encoding)
    for name, default in (("mixed_subtype", "mixed"), ("alternative_subtype", "alternative")):
        value = message.__dict__.get(name)  # Django 5.2 only, when set on the instance
        if value is not None and value != default:
            structure[name] = value
    html, alternatives = _alternatives(getattr(message, "alternatives", None) or ())
    if alternatives:
        structure["alternatives"] = alternatives
    # A file name given as "" (not None): Django 6 writes "filename" bare.
    blank = [
        i
        for i, item in enumerate(message.attachments)
        if not isinstance(item, Message) and text(item[0]) == ""
    ]
    if blank:
        structure["blank_names"] = blank
    return Described(html, structure, [_file(item) for item in message.attachments])


def _header_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"datetime": value.isoformat()}
    return value if isinstance(value, str) else str(value)


def _alternatives(items: Sequence[Any]) -> tuple[str, list[list[Any]]]:
    html = ""
    stored: list[list[Any]] = []
    for content, mimetype in items:
        content = text(content)
        if not html and mimetype == "text/html" and isinstance(content, str) and content:
            html = content
            stored.append([{"column": "html_message"}, mimetype])
        elif isinstance(content, (bytes, bytearray, memoryview)):
            stored.append([{"base64": base64.b64encode(bytes(content)).decode()}, mimetype])
        else:
            stored.append([content, mimetype])
    return html, stored


def _file(item: Any) -> File:
    """An ``attachments`` entry: a MIME part as its bytes, else ``(name, bytes, mimetype)``."""
    if isinstance(item, Message):  # MIMEPart (6.1), MIMEBase (5.2 and 6.1)
        name = item.get_filename() or ""
        return File(name, item.as_bytes(), item.get_content_type(), mime_part=True)
    name, content, mimetype = item
    if isinstance(content, EmailMessage):  # a message/rfc822 attachment
        content = content.message().as_bytes()
    elif isinstance(content, Message):
        content = content.as_bytes()
    elif isinstance(content, str):
        # Django decodes a text/* attachment's bytes as UTF-8 again, and
        # encodes any other str as UTF-8: the same content either way. Django
        # 5.2 hands a non-text str to MIMEBase, whose base64 step encodes it
        # as Python's email package does (raw-unicode-escape beyond ASCII).
        legacy = not MODERN_EMAIL_API and mimetype.split("/")[0] not in ("text", "message")
        content = content.encode("raw-unicode-escape" if legacy else "utf-8", "surrogateescape")
    return File(text(name) or "", bytes(content), mimetype)


def address_set(values: Sequence[str]) -> frozenset[str]:
    """The addresses of ``values``, lower-cased, to look a recipient up in."""
    return frozenset((parseaddr(v)[1] or v).lower() for v in values)


def placement(recipient: str, to: frozenset[str], cc: frozenset[str]) -> str:
    """``"to"``, ``"cc"`` or ``"bcc"``: where the sender put ``recipient``."""
    address = (parseaddr(recipient)[1] or recipient).lower()
    if address in to:
        return "to"
    return "cc" if address in cc else "bcc"


def rebuild(
    email_row: Email,
    attachments: Sequence[Attachment],
    *,
    cls: type[EmailMultiAlternatives] = EmailMultiAlternatives,
    to: Sequence[str] | None = None,
    cc: Sequence[str] | None = None,
    bcc: Sequence[str] = (),
    headers: dict[str, Any] | None = None,
) -> EmailMultiAlternatives:
    """The message as the sender wrote it (without Bcc), or with the given envelope.

    ``to``/``cc``/``bcc`` default to the stored To and Cc. ``headers`` are
    added to the caller's own (the copy's To, Cc and Message-ID).
    """
    s = email_row.structure or {}
    extra = {name: _restored(value) for name, value in s.get("headers", ())}
    extra.update(headers or {})
    message = cls(
        subject=email_row.subject,
        body=email_row.body,
        from_email=s.get("from", email_row.from_email),
        to=list(s.get("to", ()) if to is None else to),
        cc=list(s.get("cc", ()) if cc is None else cc),
        bcc=list(bcc),
        reply_to=list(s.get("reply_to", ())),
        headers=extra,
    )
    if "subtype" in s:
        message.content_subtype = s["subtype"]
    if "encoding" in s:
        message.encoding = _encoding(s["encoding"])
    for name in ("mixed_subtype", "alternative_subtype"):
        if name in s:
            setattr(message, name, s[name])
    for content, mimetype in s.get("alternatives", ()):
        message.attach_alternative(_content(content, email_row), mimetype)
    blank = set(s.get("blank_names", ()))
    for i, attachment in enumerate(attachments):
        if attachment.mime_part:
            message.attach(_part(bytes(attachment.content)))
        else:
            filename: str | None = "" if i in blank else attachment.name or None
            message.attach(filename, bytes(attachment.content), attachment.mimetype)
    return message


def _encoding(stored: Any) -> Any:
    if not isinstance(stored, dict):
        return stored
    charset = Charset(stored["charset"])
    charset.header_encoding = stored["header"]
    charset.body_encoding = stored["body"]
    return charset


def _restored(value: Any) -> Any:
    if isinstance(value, dict) and "datetime" in value:
        return datetime.fromisoformat(value["datetime"])
    return value


def _content(content: Any, email_row: Email) -> Any:
    if isinstance(content, dict):
        if content.get("column") == "html_message":
            return email_row.html_message
        return base64.b64decode(content["base64"])
    return content


def _part(data: bytes) -> Any:
    """A stored MIME part, parsed back into the class Django's ``attach()`` takes."""
    if MODERN_EMAIL_API:
        return email.message_from_bytes(data, policy=email.policy.default)
    # Django 5.2 takes MIMEBase instances: the parser makes one.
    return email.message_from_bytes(data, _class=ParsedMIMEPart)


class ParsedMIMEPart(MIMEBase):
    """A MIME part the parser fills in: a ``MIMEBase`` that sets no headers of its own.

    ``MIMEBase.__init__`` adds Content-Type and MIME-Version; the parser
    gives every header itself, so only ``Message.__init__`` runs.
    """

    def __init__(self, *, policy: Any = None) -> None:
        Message.__init__(self, **({} if policy is None else {"policy": policy}))
