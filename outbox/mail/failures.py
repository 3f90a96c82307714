"""What a failed send means: retry it, give it up, or ask a person.

The worker calls :func:`classify` on every exception a delivery backend
raises (including one raised by ``backend.open()``):

- :attr:`FailureKind.TRANSIENT`: the server did not get the message, or
  refused it for now (4xx, connection refused or cut before the body was
  complete, a timeout before that, authentication trouble). Retried with
  backoff.
- :attr:`FailureKind.PERMANENT`: the server refused this message for good
  (5xx at MAIL, RCPT or DATA, an address that cannot be encoded). Never
  retried.
- :attr:`FailureKind.AMBIGUOUS`: the whole message was handed over and then
  the connection broke or timed out before the verdict. The server may have
  it. Treated like a worker that died mid-send (``ABANDONED_POLICY``).

A backend declares ambiguity by raising
:class:`~outbox.exceptions.AmbiguousDeliveryError` (anywhere in the
``__cause__`` / ``__context__`` chain). Django's stock SMTP backend gets it
from :func:`outbox.backends.watch_handover`, and
:class:`outbox.backends.SendmailBackend` raises it itself.
"""

from __future__ import annotations

import enum
import smtplib

from ..exceptions import AmbiguousDeliveryError, DeliveryError

__all__ = ["FailureKind", "classify", "is_ambiguous", "is_permanent"]


class FailureKind(enum.Enum):
    """How the worker settles an attempt that raised."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    AMBIGUOUS = "ambiguous"


def is_ambiguous(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, an :class:`AmbiguousDeliveryError`.

    Both ``__cause__`` and ``__context__`` are followed: an error raised while
    handling an ambiguous one (closing the broken connection, say) does not
    make the message any less in doubt.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:  # chains can be cyclic
            continue
        seen.add(id(current))
        if isinstance(current, AmbiguousDeliveryError):
            return True
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def is_permanent(exc: BaseException) -> bool:
    """Whether a send error means "never retry" (a 5xx refusal, an invalid address).

    Connection-level 5xx answers (authentication, greeting) are configuration
    problems, not this message's fault, so they stay transient. Ambiguity is
    not considered here: use :func:`classify`.
    """
    if isinstance(exc, DeliveryError):
        return exc.permanent
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _msg in exc.recipients.values()]
        return bool(codes) and all(500 <= code < 600 for code in codes)
    if isinstance(exc, (smtplib.SMTPSenderRefused, smtplib.SMTPDataError)):
        return 500 <= exc.smtp_code < 600
    if isinstance(exc, smtplib.SMTPException | OSError):
        return False
    # Django raises ValueError for an address it cannot encode or parse.
    return isinstance(exc, ValueError | UnicodeError)


def classify(exc: BaseException) -> FailureKind:
    """The kind of failure ``exc`` is; ambiguity wins over everything else."""
    if is_ambiguous(exc):
        return FailureKind.AMBIGUOUS
    return FailureKind.PERMANENT if is_permanent(exc) else FailureKind.TRANSIENT
