"""Ambiguous outcomes with smtplib: the SMTP hand-over watcher.

:func:`watch_handover` instruments one ``smtplib.SMTP`` connection so that a
failure after the whole message was handed over (after SMTP's final ``.``,
before the server's reply) is raised as
:class:`~outbox.exceptions.AmbiguousDeliveryError`: the server may have the
message, and resending it could deliver it twice. The worker calls it after
every successful ``backend.open()``; it is re-exported as
``outbox.backends.watch_handover``, its documented home.
"""

from __future__ import annotations

import email.parser
import email.policy
import smtplib
from collections.abc import Callable

from django.core.mail.backends.base import BaseEmailBackend

from .exceptions import AmbiguousDeliveryError

# What smtplib.SMTP.data() writes last: the body ends in CRLF, then "." CRLF.
_END_OF_DATA = b"\r\n.\r\n"
# Marks an smtplib connection that watch_handover() already instrumented.
_WATCHED = "_outbox_watch_handover"

_Send = Callable[[bytes | str], None]
_Data = Callable[[bytes | str], tuple[int, bytes]]


class _Handover:
    """Per-connection state of :func:`watch_handover`: where ``data()`` is."""

    in_data: bool = False
    handed_over: bool = False


def watch_handover(backend: BaseEmailBackend) -> None:
    """Make a failure after SMTP's final ``.`` raise :class:`AmbiguousDeliveryError`.

    The worker calls this right after every successful ``backend.open()``.
    When ``backend.connection`` is an :class:`smtplib.SMTP` (Django's stock
    SMTP backend, ``SMTP_SSL`` included), that one instance (not the class)
    is instrumented: its ``send`` notes when the end of the message
    (``CRLF . CRLF``) was written during ``data()``, and its ``data``
    re-raises any error after that point as ``AmbiguousDeliveryError``
    ``from`` the original: the connection cut (``SMTPServerDisconnected``),
    the reply timed out (smtplib turns that into ``SMTPServerDisconnected``
    too), or an unreadable reply (``SMTPResponseException``). A reply that is
    not a clear answer (anything but 250 or a 4xx/5xx code) is in doubt as
    well. A 4xx or 5xx reply to the final dot is a clear refusal and stays
    what it is, as does every failure before the body was complete: a
    connection refused, the greeting, authentication, MAIL, RCPT, the DATA
    command, or a write that did not finish.

    The state is reset for each message. The error passes through Django's
    backend even with ``fail_silently`` (which swallows only
    ``smtplib.SMTPException``): an ambiguous send must not look unsent.
    Calling it again on the same connection does nothing; a backend without
    an smtplib connection is left alone.
    """
    connection = getattr(backend, "connection", None)
    if not isinstance(connection, smtplib.SMTP) or getattr(connection, _WATCHED, None):
        return
    state = _Handover()
    # Instance attributes shadow the class's methods for this connection only;
    # smtplib calls them as self.send / self.data.
    setattr(connection, "send", _watching_send(connection.send, state))  # noqa: B010
    setattr(connection, "data", _watching_data(connection.data, state))  # noqa: B010
    setattr(connection, _WATCHED, state)


def _watching_send(original_send: _Send, state: _Handover) -> _Send:
    """``send`` that notes in ``state`` when the end of the message was written."""

    def send(s: bytes | str) -> None:
        original_send(s)
        # Only once send() returned did the kernel take every byte: a write
        # that failed part-way cannot have delivered the final dot.
        if state.in_data:
            tail = s[-5:].encode("ascii", "replace") if isinstance(s, str) else bytes(s[-5:])
            if tail == _END_OF_DATA:
                state.handed_over = True

    return send


def _watching_data(original_data: _Data, state: _Handover) -> _Data:
    """``data`` that raises AmbiguousDeliveryError for a failure after the hand-over."""

    def data(msg: bytes | str) -> tuple[int, bytes]:
        state.in_data, state.handed_over = True, False
        try:
            code, reply = original_data(msg)
        except Exception as exc:
            if state.handed_over:
                raise AmbiguousDeliveryError(
                    f"no reply after the message was handed over: {type(exc).__name__}: {exc}",
                    message_id=_message_id(msg),
                ) from exc
            raise
        finally:
            state.in_data = False
        if state.handed_over and code != 250 and not 400 <= code < 600:
            raise AmbiguousDeliveryError(
                f"unclear reply after the message was handed over: {code} {reply!r}",
                message_id=_message_id(msg),
            )
        return code, reply

    return data


def _message_id(msg: bytes | str) -> str | None:
    """The Message-ID header of a raw message, for the attempt log."""
    try:
        raw = msg.encode("utf-8", "replace") if isinstance(msg, str) else msg
        headers = email.parser.BytesParser(policy=email.policy.default).parsebytes(
            raw, headersonly=True
        )
        value = headers.get("Message-ID")
    except Exception:  # a header we cannot parse must not hide the real error
        return None
    return str(value).strip() if value else None
