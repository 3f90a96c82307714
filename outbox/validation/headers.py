"""Extra headers of a message, and the MIME types of its attachments."""

from __future__ import annotations

import re
from email.utils import formataddr, getaddresses
from typing import Any

from django.utils.translation import gettext as _

from .addresses import normalize_address
from .text import check_text, field_error, require_type

# RFC 5322 field name: printable US-ASCII except colon.
_HEADER_NAME_RE = re.compile(r"^[\x21-\x39\x3b-\x7e]+$")
# Headers the outbox writes itself for each recipient's copy, or that would break MIME.
RESERVED_HEADERS = frozenset(
    {
        "message-id",
        "bcc",
        "content-type",
        "content-transfer-encoding",
        "mime-version",
        # Set from the call's own arguments (subject, from_email, reply_to).
        "subject",
        "from",
        "reply-to",
    }
)
# Display headers that may be given, but must then hold valid addresses.
ADDRESS_HEADERS = frozenset({"to", "cc"})
# RFC 5322 empty group, e.g. "undisclosed-recipients:;" for a message with no To.
_EMPTY_GROUP_RE = re.compile(r"^\s*[\w .-]+:\s*;\s*$")
_MIMETYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$")


def normalize_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
    result: dict[str, str] = {}
    for name, value in headers.items():
        require_type("headers", name, str, "a dict of str to str")
        require_type("headers", value, str, "a dict of str to str")
        if not _HEADER_NAME_RE.match(name):
            raise field_error("headers", _("%(name)r is not a valid header name.") % {"name": name})
        if name.lower() in RESERVED_HEADERS:
            raise field_error(
                "headers", _("The outbox sets the %(name)s header itself.") % {"name": name}
            )
        check_text("headers", value, single_line=True)
        if name.lower() in ADDRESS_HEADERS and not _EMPTY_GROUP_RE.match(value):
            addresses = [a.strip() for a in _split_addresses(value)]
            if not addresses:
                raise field_error("headers", _("The %(name)s header is empty.") % {"name": name})
            for address in addresses:
                normalize_address("headers", address)
        result[name] = value
    return result


def _split_addresses(value: str) -> list[str]:
    """Split an address-list header value at the commas between addresses."""
    return [formataddr(pair) if pair[0] else pair[1] for pair in getaddresses([value])] or [value]


def check_mimetype(field: str, value: str) -> None:
    if not _MIMETYPE_RE.match(value):
        raise field_error(
            field, _("%(value)r is not a MIME type like text/plain.") % {"value": value[:60]}
        )
