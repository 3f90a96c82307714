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
``anymail``           django-anymail's message attributes the sender set (on an
                      ``AnymailMessage`` or any ``EmailMessage``), by name, as
                      :data:`ANYMAIL_ATTRIBUTES` stores each (version 2 on)
====================  ===========================================================

Once the sweeper has cleared an email's content (:func:`outbox.sweeper.retention.clear_content`) its
structure is :data:`CLEARED`, whoever wrote it, and nothing can be built from
it: :func:`refuse_cleared` fails the row for good instead of sending an empty
message (only a requeue racing the clearing can bring such a row back).

anymail's attributes are read by name (anymail is optional and not imported):
one left at anymail's ``UNSET``, or never set, is not stored, and the rebuilt
message lacks it, as the sender's did. Each is stored as JSON (a lazy
translation as text, a tuple or a set as a list) or refused at ``send()`` with a
``ValidationError`` naming it; ``send_at`` is the rows' schedule (see
:func:`schedule`) and is not set again on the rebuilt message. A new anymail
attribute is one entry in :data:`ANYMAIL_ATTRIBUTES`.

Rebuilding makes Django objects again (a MIME part is parsed back from its
bytes), so the worker sends what ``message()`` makes of them under the Django
it runs.
"""

from __future__ import annotations

import base64
import email
import email.policy
import math
import reprlib
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from email.charset import Charset
from email.message import Message
from email.mime.base import MIMEBase
from email.utils import parseaddr
from typing import Any, NamedTuple

from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _

from ..exceptions import DeliveryError
from ..models import Attachment, Email
from ..validation import MODERN_EMAIL_API, field_error
from .esp import DELIVERY_KEY, TOKEN_KEY

# 2: the "anymail" key (rows of version 1 have none).
STRUCTURE_VERSION = 2

# An email's structure once its content was cleared (module docstring).
CLEARED: dict[str, Any] = {"cleared": True}


def refuse_cleared(email_row: Email) -> None:
    """Raise a permanent :class:`DeliveryError` if ``email_row``'s content was cleared."""
    if isinstance(email_row.structure, dict) and email_row.structure.get("cleared"):
        raise DeliveryError(
            "its content was cleared after its retention (OUTBOX['CONTENT_RETENTION'] "
            "or sensitive): nothing to send; enqueue the email again",
            permanent=True,
        )


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
    anymail = _anymail_attributes(message)
    if anymail:
        structure["anymail"] = anymail
    return Described(html, structure, [_file(item) for item in message.attachments])


def _header_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # JSON keeps it: anymail sends a number as a number
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
    for name, stored in s.get("anymail", {}).items():
        codec = ANYMAIL_ATTRIBUTES.get(name)
        if codec is not None and codec.passed_on:  # a name this host does not know: left out
            setattr(message, name, codec.restore(stored))
    blank = set(s.get("blank_names", ()))
    for i, attachment in enumerate(attachments):
        if attachment.mime_part:
            message.attach(_part(bytes(attachment.content)))
        else:
            filename: str | None = "" if i in blank else attachment.name or None
            message.attach(filename, bytes(attachment.content), attachment.mimetype)
    return message


class Codec(NamedTuple):
    """How one anymail attribute is stored: ``store(name, value)`` and ``restore(stored)``."""

    store: Callable[[str, Any], Any]
    restore: Callable[[Any], Any]
    passed_on: bool = True  # set on the rebuilt message for anymail's backend


def _store_json(name: str, value: Any) -> Any:
    """``value`` as JSON, as anymail's converters see it (lazy text forced); else refused."""
    if isinstance(value, Promise):
        return str(value)
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, (list, tuple, set, frozenset)):  # anymail makes lists of them
        return [_store_json(name, item) for item in value]
    elif isinstance(value, dict):
        stored = {}
        for key, item in value.items():
            key = str(key) if isinstance(key, Promise) else key
            if not isinstance(key, str):
                raise _not_json(name, key)
            stored[key] = _store_json(name, item)
        return stored
    raise _not_json(name, value)


def _not_json(name: str, value: Any) -> Exception:
    return field_error(
        name,
        _("%(field)s holds %(value)s (%(type)s), which cannot be stored as JSON.")
        % {"field": name, "value": reprlib.repr(value), "type": type(value).__name__},
    )


def _store_metadata(name: str, value: Any) -> Any:
    """As JSON, without the outbox's own keys (:func:`.esp.identify` adds them per row)."""
    stored = _store_json(name, value)
    records = (
        [stored] if name == "metadata" else stored.values() if isinstance(stored, dict) else ()
    )
    for record in records:
        taken = sorted({DELIVERY_KEY, TOKEN_KEY} & set(record if isinstance(record, dict) else ()))
        if taken:
            raise field_error(
                name,
                _("%(field)s may not use the key %(key)r: the outbox's identity of a delivery.")
                % {"field": name, "key": taken[0]},
            )
    return stored


def _store_moment(name: str, value: Any) -> Any:
    """A datetime, a date or a POSIX timestamp: the values anymail makes a time of."""
    if value is None:  # anymail's "not scheduled"
        return None
    if isinstance(value, datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, date):
        return {"date": value.isoformat()}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return {"timestamp": value}
    raise field_error(
        name,
        _("%(field)s must be a datetime, a date or a POSIX timestamp, not %(type)s.")
        % {"field": name, "type": type(value).__name__},
    )


def _restore_moment(stored: dict[str, Any] | None) -> Any:
    if stored is None:
        return None
    if "datetime" in stored:
        return datetime.fromisoformat(stored["datetime"])
    if "date" in stored:
        return date.fromisoformat(stored["date"])
    return stored["timestamp"]


def _same(stored: Any) -> Any:
    return stored


JSON = Codec(_store_json, _same)

# Every attribute anymail's backends read from a message (anymail's
# AnymailMessage and BasePayload.anymail_message_attrs), and how it is stored.
ANYMAIL_ATTRIBUTES: dict[str, Codec] = {
    "envelope_sender": JSON,
    "metadata": Codec(_store_metadata, _same),
    # The outbox's schedule (the rows' not_before), not passed on: README, "Sending through an ESP".
    "send_at": Codec(_store_moment, _restore_moment, passed_on=False),
    "tags": JSON,
    "track_clicks": JSON,
    "track_opens": JSON,
    "template_id": JSON,
    "merge_data": JSON,
    "merge_global_data": JSON,
    "merge_headers": JSON,
    "merge_metadata": Codec(_store_metadata, _same),
    "esp_extra": JSON,
}


def _is_unset(value: Any) -> bool:
    """anymail's ``UNSET`` marker (a class of that name), known without importing anymail."""
    return isinstance(value, type) and value.__name__ == "UNSET" and "anymail" in value.__module__


def _anymail_attributes(message: EmailMessage) -> dict[str, Any]:
    stored = {}
    for name, codec in ANYMAIL_ATTRIBUTES.items():
        if not hasattr(message, name):
            continue
        value = getattr(message, name)
        if not _is_unset(value):
            stored[name] = codec.store(name, value)
    return stored


def schedule(structure: dict[str, Any]) -> datetime | None:
    """The aware time ``send_at`` names, read as anymail reads it; None without one.

    A naive datetime, or a date (at midnight), is in Django's current time
    zone; a number is a POSIX timestamp.
    """
    stored = structure.get("anymail", {}).get("send_at")
    if stored is None:
        return None
    value = _restore_moment(stored)
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    else:
        return datetime.fromtimestamp(value, UTC)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    return moment


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
