"""Input checks for everything that will become a header or an address.

Every function raises :class:`~outbox.exceptions.InvalidEmailError` (a
``ValidationError`` naming the field, and a ``ValueError``), or
:class:`TypeError` for a value of the wrong type, before anything is written.

One module per concern, each importing only those above it in this list:

- :mod:`outbox.validation.text`: text a header or a column can carry (line breaks, NULs, types);
- :mod:`outbox.validation.addresses`: one address, a list of them, and the form they
  are compared in;
- :mod:`outbox.validation.headers`: extra headers and MIME types;
- :mod:`outbox.validation.templates`: email templates' engine and syntax errors.

Import from ``outbox.validation``: the modules beneath it may move.
"""

from .addresses import (
    MAX_ADDRESS_LENGTH,
    MAX_DOMAIN_OCTETS,
    MAX_LOCAL_PART_OCTETS,
    MAX_PATH_OCTETS,
    bare_address,
    check_address_as_django,
    check_address_list_as_django,
    check_wire_form,
    normalize_address,
    normalize_address_list,
    suppression_key,
)
from .headers import ADDRESS_HEADERS, RESERVED_HEADERS, check_mimetype, normalize_headers
from .templates import check_template_syntax, describe_template_error, template_engine
from .text import (
    HEADER_INJECTION,
    LINE_BREAKS,
    MODERN_EMAIL_API,
    check_text,
    field_error,
    require_type,
)

__all__ = [
    "ADDRESS_HEADERS",
    "HEADER_INJECTION",
    "LINE_BREAKS",
    "MAX_ADDRESS_LENGTH",
    "MAX_DOMAIN_OCTETS",
    "MAX_LOCAL_PART_OCTETS",
    "MAX_PATH_OCTETS",
    "MODERN_EMAIL_API",
    "RESERVED_HEADERS",
    "bare_address",
    "check_address_as_django",
    "check_address_list_as_django",
    "check_mimetype",
    "check_template_syntax",
    "check_text",
    "check_wire_form",
    "describe_template_error",
    "field_error",
    "normalize_address",
    "normalize_address_list",
    "normalize_headers",
    "require_type",
    "suppression_key",
    "template_engine",
]
