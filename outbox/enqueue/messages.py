"""A Django ``EmailMessage`` into a :class:`~outbox.enqueue.prepare.Prepared` email.

This is the drop-in backend's write path. A message is accepted when the
backend its mailer delivers through would send it: its addresses pass
Django's own rule (or the outbox's stricter one with
``OUTBOX["STRICT_ADDRESSES"]``), and Django's ``message()`` builds it without
an error. What Django raised becomes an
:class:`~outbox.exceptions.InvalidEmailError`, which is still a ``ValueError``
(a ``TypeError`` stays one). A ``reply_to`` entry may hold several addresses,
as Django's header takes them. Through a django-anymail backend, which reads
the message's fields and never builds Django's ``message()``, ``from_email``
may hold several addresses too (whether the ESP takes them is anymail's
check, in the worker) and a header's value may be of any type (stored as its
text). What is stored is described in :mod:`outbox.mail.structure`;
anymail's ``send_at`` is the rows' schedule. A message with
``outbox_sensitive = True`` set on it (or one linking to a page named in
``OUTBOX["SENSITIVE_LINKS"]``) is sensitive: :mod:`outbox.enqueue.sensitive`.
"""

from __future__ import annotations

import copy
from datetime import datetime
from email.utils import getaddresses, parseaddr
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail import EmailMessage
from django.utils.translation import gettext as _

from ..compat.anymail import check_message
from ..conf import outbox_settings
from ..mail.mailers import delivers_through_anymail, get_connection
from ..mail.structure import describe, schedule, text
from ..validation import (
    MAX_ADDRESS_LENGTH,
    check_address_as_django,
    check_address_list_as_django,
    check_text,
    field_error,
    normalize_address,
    require_type,
)
from .prepare import Prepared, check_mailer, check_max_attempts, check_priority, stored_moment
from .sensitive import links_sensitive


def prepare_message(
    message: EmailMessage,
    *,
    priority: str = "normal",
    max_attempts: int | None = None,
    mailer: str | None = None,
) -> Prepared:
    """Validate a Django ``EmailMessage`` for :func:`~outbox.enqueue.api.write_prepared`.

    Every envelope recipient (``to + cc + bcc``, the same address once)
    becomes one delivery, whose copy is the message Django would build (see
    :mod:`outbox.mail.message`). Raises ``InvalidEmailError`` (or ``TypeError``).
    """
    mailer = check_mailer(mailer)
    anymail = delivers_through_anymail(mailer)
    try:
        return _prepare(message, priority, max_attempts, mailer, anymail)
    except (ValidationError, TypeError):
        if anymail:
            _check_as_anymail(message, mailer)  # anymail's own words, when it refuses too
        raise


def _prepare(
    message: EmailMessage, priority: str, max_attempts: int | None, mailer: str, anymail: bool
) -> Prepared:
    to = _addresses("to", message.to)
    cc = _addresses("cc", message.cc)
    bcc = _addresses("bcc", message.bcc)
    if anymail:
        sender = _address_list("from_email", message.from_email)
        if len(sender) > MAX_ADDRESS_LENGTH:  # the column's length
            raise field_error(
                "from_email",
                _("from_email is longer than %(limit)d characters.")
                % {"limit": MAX_ADDRESS_LENGTH},
            )
    else:
        sender = _address("from_email", message.from_email)
    subject, body = text(message.subject), text(message.body) or ""
    require_type("subject", subject, str, "a string")
    require_type("body", body, str, "a string")
    check_text("subject", subject, single_line=True)
    check_text("body", body, single_line=False)
    if not anymail:  # anymail parses reply_to by its own rule, in the worker's build
        for value in message.reply_to or ():
            _address_list("reply_to", value)
    _check_headers(message.extra_headers)
    _build_as_django(message, anymail)
    described = describe(message, to, cc)
    for content, _mimetype in described.structure.get("alternatives", ()):
        if isinstance(content, str):
            check_text("alternatives", content, single_line=False)
    check_text("alternatives", described.html_message, single_line=False)
    check_priority(priority)
    if max_attempts is None:
        max_attempts = outbox_settings.MAX_ATTEMPTS
    check_max_attempts(max_attempts)
    sensitive = getattr(message, "outbox_sensitive", False)
    require_type("outbox_sensitive", sensitive, bool, "True or False")
    texts = [c for c, _m in described.structure.get("alternatives", ()) if isinstance(c, str)]
    return Prepared(
        subject=subject,
        body=body,
        from_email=sender,
        recipients=_unique([*to, *cc, *bcc]),
        html_message=described.html_message,
        reply_to=list(described.structure["reply_to"]),
        attachments=described.files,
        priority=priority,
        max_attempts=max_attempts,
        mailer=mailer,
        structure=described.structure,
        message_id=_message_id(message.extra_headers),
        send_at=stored_moment(schedule(described.structure)),
        sensitive=sensitive or links_sensitive(body, described.html_message, *texts),
    )


def _check_as_anymail(message: EmailMessage, mailer: str) -> None:
    """Refuse ``message`` as anymail would, if anymail refuses it too.

    When the outbox cannot take a message whose mailer is anymail's (a value
    its JSON cannot store, say), anymail's own build of the request is asked
    (:mod:`outbox.compat.anymail`): if it refuses the message as well, its
    exception is raised (``AnymailSerializationError``, ...), as anymail alone
    would raise it at ``send()``. The build runs on this path only: anymail's
    other checks of a message run in the worker, where the row ends ``failed``
    with anymail's words. A backend this host cannot create (its credential
    is only on the workers' hosts) checks nothing.
    """
    try:
        backend = get_connection(mailer)
    except ImproperlyConfigured:
        return
    check_message(backend, message)


def _address(field: str, value: Any) -> str:
    if outbox_settings.STRICT_ADDRESSES:
        normalize_address(field, text(value))
    return check_address_as_django(field, value)


def _address_list(field: str, value: Any) -> str:
    """An entry that may hold several addresses: Django's rule for each (and the strict one)."""
    checked = check_address_list_as_django(field, value)
    if outbox_settings.STRICT_ADDRESSES:
        addresses = getaddresses([checked])
        for item in [checked] if len(addresses) < 2 else [a for _name, a in addresses]:
            normalize_address(field, item)
    return checked


def _addresses(field: str, values: Any) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{field} must be a list or tuple of addresses, not a string")
    return [_address(field, value) for value in values or () if value]


def _unique(recipients: list[str]) -> list[str]:
    """One recipient per address (compared without case), the first as written."""
    seen: set[str] = set()
    result = []
    for recipient in recipients:
        key = (parseaddr(recipient)[1] or recipient).lower()
        if key not in seen:
            seen.add(key)
            result.append(recipient)
    return result


def _check_headers(headers: Any) -> None:
    """What the database cannot hold, and Bcc, which no copy may show (Django 6 refuses it too)."""
    if not headers:
        return
    if not isinstance(headers, dict):
        raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
    for name, value in headers.items():
        require_type("headers", name, str, "a dict with str keys")
        check_text("headers", name, single_line=True)
        if name.lower() == "bcc":
            raise field_error(
                "headers",
                _(
                    'Bcc is not a valid email header. Use the "bcc" argument to specify'
                    " blind carbon copy recipients."
                ),
            )
        if isinstance(value, str):
            check_text("headers", value, single_line=True)


def _build_as_django(message: EmailMessage, anymail: bool) -> None:
    """Django's own checks, which its backends run when they send: build the message once.

    Without the To and Cc lists, whose addresses are checked one by one
    already: joined into headers, 10,000 of them would cost Django's header
    parser more than everything else an enqueue does. For an anymail
    backend, header values as the text they are stored as (Django 6 refuses
    an ``int`` in ``message()``, which anymail never calls).
    """
    probe = copy.copy(message)
    probe.to, probe.cc, probe.bcc = [], [], []
    if anymail and probe.extra_headers:
        probe.extra_headers = {
            name: value if isinstance(value, (str, datetime)) else str(value)
            for name, value in probe.extra_headers.items()
        }
    try:
        probe.message()
    except ValueError as exc:  # BadHeaderError and UnicodeError are ValueErrors too
        raise field_error("message", str(exc)) from exc


def _message_id(headers: Any) -> str | None:
    for name, value in (headers or {}).items():
        if name.lower() == "message-id":
            return str(value).strip() or None
    return None
