"""Text that becomes a header or a column: the checks every other one builds on.

Every function raises :class:`~outbox.exceptions.InvalidEmailError` (a
``ValidationError`` naming the field, and a ``ValueError``), or
:class:`TypeError` for a value of the wrong type.
"""

from __future__ import annotations

import re
from email.header import decode_header
from typing import Any

import django
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

from ..exceptions import InvalidEmailError

# Characters that end a line somewhere (str.splitlines and the email package):
# any of them in a header is a header-injection attempt.
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_RE = re.compile(f"[{LINE_BREAKS}\x00]")
# Django's own words for a line break in a header (5.2 and 6), so that code
# and tests that look for them find them.
HEADER_INJECTION = (
    "Header values may not contain linefeed or carriage return characters (%(field)s)."
    if django.VERSION >= (6, 0)
    else "Header values can't contain newlines (%(field)s)."
)
# Django 6.0 moved EmailMessage to Python's modern email API.
MODERN_EMAIL_API = django.VERSION >= (6, 0)


def field_error(field: str, message: str, code: str = "invalid") -> InvalidEmailError:
    return InvalidEmailError({field: [ValidationError(message, code=code)]})


def require_type(field: str, value: Any, types: type | tuple[type, ...], what: str) -> None:
    allowed = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass; True is not a valid max_attempts.
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise TypeError(f"{field} must be {what}, not {type(value).__name__}")


def check_text(field: str, value: str, *, single_line: bool) -> None:
    """Reject text the database or a mail header cannot carry safely."""
    if "\x00" in value:
        raise field_error(field, _("NUL characters are not allowed."))
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise field_error(field, _("Text must be valid Unicode (no lone surrogates).")) from None
    if single_line and (_LINE_BREAK_RE.search(value) or _LINE_BREAK_RE.search(_decoded(value))):
        raise field_error(field, _(HEADER_INJECTION) % {"field": field}, code="header_injection")


def _decoded(value: str) -> str:
    """The text of any RFC 2047 encoded words in ``value`` (which could hide a CR/LF)."""
    if "=?" not in value:
        return ""
    try:
        parts = decode_header(value)
    except Exception:  # malformed encoded words are left as the literal text they are
        return ""
    return "".join(
        part.decode(charset or "ascii", "replace") if isinstance(part, bytes) else part
        for part, charset in parts
    )
