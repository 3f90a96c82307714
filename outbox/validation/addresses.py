"""Addresses: one per string, as Django sends them, within RFC 5321's limits.

Also the one form an address is compared and stored in (:func:`suppression_key`,
:func:`bare_address`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from email import errors
from email.headerregistry import AddressHeader
from email.utils import formataddr, getaddresses, parseaddr
from typing import Any

from django.core.exceptions import ValidationError
from django.core.mail.message import sanitize_address
from django.core.validators import validate_email
from django.utils.functional import Promise
from django.utils.translation import gettext as _

from .text import MODERN_EMAIL_API, check_text, field_error, require_type

MAX_ADDRESS_LENGTH = 320
# RFC 5321, 4.5.3.1: the limits of an address on the wire, in octets. The
# domain counts in its IDNA form (what Django's SMTP backend sends, and what a
# refusal and the suppression list name), the local part in UTF-8 (SMTPUTF8);
# the path is the address in angle brackets.
MAX_LOCAL_PART_OCTETS = 64
MAX_DOMAIN_OCTETS = 255
MAX_PATH_OCTETS = 256


# An address without a display name, quotes or comments: getaddresses() would
# return it unchanged, and validate_email() still checks it.
_BARE_ADDRESS = re.compile(r"[A-Za-z0-9._+-]+@[A-Za-z0-9.-]+\Z")


def _lenient_parse(value: str) -> list[tuple[str, str]]:
    """``getaddresses`` as Python 3.11.9 and older parse: to tell "several" from "none".

    Python 3.13 (and 3.12.6, 3.11.10) parse strictly by default: "a@x.com; b@y.com"
    gives ``[("", "")]``, not its two addresses, and would be called "not an address".
    """
    try:
        return getaddresses([value], strict=False)  # type: ignore[call-arg,unused-ignore]
    except TypeError:  # a Python without the strict parser: getaddresses is lenient
        return getaddresses([value])


def normalize_address(field: str, value: Any) -> tuple[str, str]:
    """Return ``(formatted, bare address)`` for one address, or raise.

    Accepts ``"user@example.com"`` and ``"Name <user@example.com>"``; exactly
    one address per string. The error says which of three things is wrong:
    the string is empty, it holds several addresses, or it is not an address.
    """
    require_type(field, value, str, "a string")
    value = value.strip()
    if not value:
        raise field_error(
            field, _("An address in %(field)s is empty.") % {"field": field}, code="required"
        )
    check_text(field, value, single_line=True)
    if len(value) > MAX_ADDRESS_LENGTH:
        raise _too_long(field, value)
    if _BARE_ADDRESS.match(value):
        # The common case: nothing for getaddresses() to parse (and it is the
        # slowest step when a call has 10,000 recipients).
        name, address = "", value
    else:
        parsed = getaddresses([value])
        if sum(1 for _name, found in _lenient_parse(value) if _LOOKS_LIKE_ADDRESS.match(found)) > 1:
            raise field_error(
                field,
                _("%(field)s takes one address per string, and %(value)r holds several.")
                % {"field": field, "value": value},
                code="multiple",
            )
        if len(parsed) != 1 or not parsed[0][1]:
            raise _not_an_address(field, value)
        name, address = parsed[0]
    try:
        validate_email(address)
    except ValidationError:
        raise _not_an_address(field, value) from None
    if "<" in value and "<" + address + ">" not in value.replace(" ", ""):
        # getaddresses() is lenient; make sure the bracketed part is what it parsed.
        raise _not_an_address(field, value)
    check_wire_form(field, value, address)
    if name and not address.isascii():
        # formataddr() takes only an ASCII address: with a display name, an
        # internationalised domain is written in its IDNA form (as sent).
        local, _at, domain = address.rpartition("@")
        if not local.isascii():
            raise _not_an_address(field, value)
        address = f"{local}@{domain.encode('idna').decode('ascii')}"
    formatted = formataddr((name, address)) if name else address
    if len(formatted) > MAX_ADDRESS_LENGTH:
        raise _too_long(field, value)
    return formatted, address


# A plain ASCII address whose local part and domain are dot-atoms.
_DOT_ATOM_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\Z"
)
# What Django's SMTP backend forgives in an address (``prep_address``): a
# local part alone (ticket #15042), and a non-ASCII local part, which a server
# with SMTPUTF8 takes.
_DJANGO_FORGIVES = frozenset(
    {"addr-spec local part with no domain", "local-part contains non-ASCII characters)"}
)


def check_address_as_django(field: str, value: Any) -> str:
    """One address by Django's own rule; returns it as text, unchanged.

    Django 6's SMTP backend refuses an address whose parse has a defect, or
    that holds other than one mailbox; it allows ``"webmaster"`` (delivered
    locally by the server) and, with SMTPUTF8, ``"jörg@example.com"``. On
    Django 5.2 the address must also pass its ``sanitize_address()``.
    """
    if isinstance(value, Promise):
        value = str(value)
    require_type(field, value, str, "a string")
    check_text(field, value, single_line=True)
    if len(value) > MAX_ADDRESS_LENGTH:
        raise _too_long(field, value)
    if _DOT_ATOM_ADDRESS.match(value):
        check_wire_form(field, value, value)
        return value  # the common case, valid under every rule below (and fast)
    if not MODERN_EMAIL_API:
        # Django 5.2's backends run every address through sanitize_address(),
        # which lets some garbage through ("not an address") that no server
        # takes: the parse below refuses that on 5.2 too.
        try:
            sanitize_address(value, "utf-8")
        except (ValueError, IndexError, AttributeError, TypeError):
            # Some malformed input ('<>', '.x <\x9f@example.com>') makes the email
            # package's parser, or Django's use of it, fail with AttributeError or
            # TypeError instead of ValueError: Django 5.2 could not send it either.
            raise _not_an_address(field, value) from None
    try:
        parsed = AddressHeader.value_parser(value)
    except (errors.HeaderParseError, IndexError):  # Django's parse would fail the same way
        raise _not_an_address(field, value) from None
    defects = {str(defect) for defect in parsed.all_defects} - _DJANGO_FORGIVES
    mailboxes = parsed.all_mailboxes
    if defects or len(mailboxes) != 1 or not mailboxes[0].local_part:
        raise _not_an_address(field, value)
    domain = mailboxes[0].domain
    check_wire_form(field, value, mailboxes[0].local_part + (f"@{domain}" if domain else ""))
    return value


def check_address_list_as_django(field: str, value: Any) -> str:
    """One entry that may hold several addresses (``"A <a@x>, B <b@x>"``), each by Django's rule.

    Django joins a ``reply_to`` entry into its header as written, and
    anymail parses every entry of an address field as such a list. A value
    that is not a list of two or more mailboxes is one address
    (:func:`check_address_as_django`). Returns the value as text, unchanged.
    """
    if isinstance(value, Promise):
        value = str(value)
    require_type(field, value, str, "a string")
    if "," in value:
        try:
            mailboxes = AddressHeader.value_parser(value).all_mailboxes
        except (errors.HeaderParseError, IndexError):
            mailboxes = []
        if len(mailboxes) > 1:
            check_text(field, value, single_line=True)
            for mailbox in mailboxes:
                check_address_as_django(field, str(mailbox).strip())
            return value
    return check_address_as_django(field, value)


def check_wire_form(field: str, value: str, address: str) -> None:
    """Refuse an address longer, as it goes on the wire, than RFC 5321 allows.

    An internationalised domain is sent in its IDNA form, up to about four
    times longer than as written: ``enqueue_email`` and the drop-in backend
    would otherwise take a 308-character address that is 848 octets as sent,
    which no server takes and no suppression entry can hold. A domain IDNA
    cannot encode is not an address. ``address``: the bare address; a local
    part alone (``"webmaster"``, which Django allows) has no domain to check.
    """
    local, at, domain = address.rpartition("@")
    if not at:
        local, domain = address, ""
    try:  # Django IDNA-encodes the domain in the headers and the envelope
        wire_domain = domain.encode("ascii" if domain.isascii() else "idna")
    except UnicodeError:
        raise _not_an_address(field, value) from None
    local_octets = len(local.encode("utf-8", "surrogatepass"))
    path = local_octets + (1 + len(wire_domain) if domain else 0) + 2
    if (
        local_octets > MAX_LOCAL_PART_OCTETS
        or len(wire_domain) > MAX_DOMAIN_OCTETS
        or path > MAX_PATH_OCTETS
    ):
        raise field_error(
            field,
            _(
                "The address %(value)s in %(field)s is too long as it is sent: RFC 5321 "
                "allows %(local)d octets before the @, %(domain)d after it (the domain in "
                "its IDNA form) and %(path)d in all; it has %(has_local)d and %(has_domain)d."
            )
            % {
                "value": value if len(value) <= 60 else value[:60] + "...",
                "field": field,
                "local": MAX_LOCAL_PART_OCTETS,
                "domain": MAX_DOMAIN_OCTETS,
                "path": MAX_PATH_OCTETS - 2,
                "has_local": local_octets,
                "has_domain": len(wire_domain),
            },
            code="max_length",
        )


# Something with one "@" between non-empty parts: counted to tell "several
# addresses in one string" from a single malformed one (such as "bad@@x").
_LOOKS_LIKE_ADDRESS = re.compile(r"[^@\s]+@[^@\s]+\Z")


def _not_an_address(field: str, value: str) -> ValidationError:
    return field_error(
        field,
        _("%(value)r in %(field)s is not a valid email address.")
        % {"field": field, "value": value},
    )


def _too_long(field: str, value: str) -> ValidationError:
    return field_error(
        field,
        _("The address %(value)s in %(field)s is longer than %(limit)d characters.")
        % {
            "field": field,
            "value": value if len(value) <= 60 else value[:60] + "...",
            "limit": MAX_ADDRESS_LENGTH,
        },
        code="max_length",
    )


def suppression_key(address: str) -> str:
    """The one form an address is stored and compared in on the suppression list.

    Lower-cased, with a non-ASCII domain IDNA-encoded (``user@xn--bcher-kva.de``
    for ``user@bücher.de``): Django's SMTP backend sends that form, so it is
    what a server's refusal names, while enqueue sees what the caller wrote.
    The local part stays as given, lower-cased. A domain IDNA cannot encode is
    kept as it is (validation refuses such recipients anyway).
    """
    address = address.strip().lower()
    if address.isascii():
        return address
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    try:
        # The codec Django's own ``punycode()`` uses (IDNA 2003), so the form
        # is the one the SMTP backend put in the envelope.
        return f"{local}@{domain.encode('idna').decode('ascii').lower()}"
    except UnicodeError:
        return address


def bare_address(recipient: str) -> str:
    """A recipient's address (``"Name <a@b>"`` or ``"a@b"``) in :func:`suppression_key` form."""
    if "<" not in recipient:
        return suppression_key(recipient)
    return suppression_key(parseaddr(recipient)[1])


def normalize_address_list(field: str, values: Any) -> list[str]:
    """Addresses in order, duplicates (compared case-insensitively) removed."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(
            f"{field} must be a list or tuple of addresses, not {type(values).__name__}"
        )
    seen: set[str] = set()
    result: list[str] = []
    for value in values:
        formatted, address = normalize_address(field, value)
        key = address.lower()
        if key not in seen:
            seen.add(key)
            result.append(formatted)
    return result
