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

**HTTP delivery backends** (django-anymail's, built on ``requests``; Amazon
SES's on ``botocore``) say what happened in their exceptions, read here by
class name and status code, so neither library is imported
(:func:`http_failure`):

- the request never left (DNS, connection refused, connect timeout, the TLS
  handshake): TRANSIENT;
- the request left and no verdict came back (read timeout, the connection
  reset or closed while waiting, a gateway's 502 or 504, a 2xx whose body
  could not be read): AMBIGUOUS, settled like a cut after DATA;
- 429 and 503: TRANSIENT, and ``Retry-After`` is honoured
  (:attr:`HttpFailure.retry_after`: the row's next attempt is not earlier,
  and the worker holds all sending that long, :meth:`outbox.worker.gate.Gate.on_send_error`);
- a refusal of the message or of every recipient
  (``AnymailRecipientsRefused``; 400/413/422 by the ESP's own codes, table
  :data:`PERMANENT_REFUSALS`): PERMANENT, and the refused addresses go on
  the suppression list (:func:`refused_by_esp`);
- anything else (500, an answer the table does not know): TRANSIENT, as
  before, with the ESP's answer in the attempt's error.

**The mailer's own configuration refused** (:func:`configuration_refused`):
the ESP answered 401 or 403 (its credential is missing, wrong or revoked,
or the account may not send), or refused the account's sending by its own
code (Postmark's 422 with ``ErrorCode`` 400, 401, 405 or 412: a sender
signature missing or unconfirmed, no credits, an account awaiting
approval), or the backend could not be created at all
(``ImproperlyConfigured``: anymail's ``AnymailConfigurationError`` when a
setting such as ``POSTMARK_SERVER_TOKEN`` is missing; not
``UnknownMailerError``, a mailer this host's settings lack). Not this message's
fault, and no message of that mailer can go until someone fixes it: the
worker releases the row (not an attempt) and pauses the mailer
(:meth:`outbox.worker.gate.Gate.pause_mailer`), instead of retrying the row into ``failed``.
"""

from __future__ import annotations

import enum
import re
import smtplib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import AmbiguousDeliveryError, DeliveryError, UnknownMailerError

__all__ = [
    "PERMANENT_REFUSALS",
    "FailureKind",
    "HttpFailure",
    "cause_of",
    "classify",
    "configuration_refused",
    "esp_answer",
    "http_failure",
    "is_ambiguous",
    "is_permanent",
    "refused_by_esp",
    "retry_after",
    "tidy_cause",
]


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
    # Django raises ValueError for an address it cannot encode or parse; a
    # backend's TypeError is a value of the message it cannot send (anymail's
    # AnymailSerializationError): the same message would fail again.
    return isinstance(exc, ValueError | UnicodeError | TypeError)


def classify(exc: BaseException) -> FailureKind:
    """The kind of failure ``exc`` is; ambiguity wins over everything else."""
    if is_ambiguous(exc):
        return FailureKind.AMBIGUOUS
    http = http_failure(exc)
    if http is not None:
        return http.kind
    return FailureKind.PERMANENT if is_permanent(exc) else FailureKind.TRANSIENT


# -- HTTP delivery backends (django-anymail) ----------------------------------------

# Answers about the credential or the account, not the message: 401 (missing or
# wrong: Postmark's ErrorCode 10, "Request does not contain a valid Server
# token"; Mailgun's "Forbidden"; SendGrid's bad API key) and 403 (a key
# without the permission to send, a sender the account may not use).
_CREDENTIAL_REFUSED = frozenset({401, 403})
# An ESP's refusals of the account's sending rather than of one message, as HTTP
# status -> the ESP's own error codes: Postmark's ErrorCode 400 (no sender
# signature for the From address), 401 (the signature not confirmed), 405 (the
# account may not send: out of credits) and 412 (the account awaits approval).
# Like a refused credential, every message of the mailer would meet them until
# someone fixes the account: the mailer is paused, no attempt is spent.
_ACCOUNT_REFUSALS: dict[str, dict[int, frozenset[object]]] = {
    "Postmark": {422: frozenset({400, 401, 405, 412})},
}
# Amazon SES (boto3) names them: an unknown or expired key, a bad signature,
# a key without the permission; and botocore's own when it finds no credential.
_SES_CREDENTIAL_REFUSED = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDeniedException",
        "AccessDenied",
        "ExpiredTokenException",
        "NoCredentialsError",
        "PartialCredentialsError",
    }
)


def configuration_refused(exc: BaseException) -> str | None:
    """Why the mailer itself cannot send now, if ``exc`` says so; else None.

    ``ImproperlyConfigured`` (raised creating or using the backend: a missing
    setting), an ESP's 401/403, or its refusal of the account's sending
    (module docstring). The text names the
    ESP's answer, for the log and the attempt's error.
    """
    chain = list(_chain(exc))
    if any(isinstance(e, UnknownMailerError) for e in chain):
        return None  # this host's settings lack the mailer; another host's may not
    if any(isinstance(e, ImproperlyConfigured) for e in chain):
        return f"its backend cannot be used: {type(exc).__name__}: {exc}"
    names = {name for e in _chain(exc) for name in _class_names(e)}
    if not names & {"AnymailError", "RequestException", "BotoCoreError", "ClientError"}:
        return None
    status = _status(exc)
    esp = next((str(n) for e in _chain(exc) if (n := getattr(e, "esp_name", None))), "the ESP")
    if status in _CREDENTIAL_REFUSED:
        answer = esp_answer(exc) or f"HTTP {status}"
        return f"{esp} refused its credential ({answer})"
    account = _ACCOUNT_REFUSALS.get(esp, {}).get(status) if status is not None else None
    if account is not None and _esp_code(exc) in account:
        answer = esp_answer(exc) or f"HTTP {status}"
        return f"{esp} refused the account's sending ({answer})"
    code = _boto_code(exc)
    refused = (names | ({code} if code else set())) & _SES_CREDENTIAL_REFUSED
    if refused:
        return f"{esp} refused its credential ({', '.join(sorted(refused))})"
    return None


# What each ESP's API answers when it refuses the message itself for good, as
# HTTP status -> the ESP's own error codes (None: any code). From anymail's
# backends and the ESPs' API references; anything not here is transient.
# Postmark answers 422 for every error of a request and tells them apart by
# ``ErrorCode``: 300 (invalid request: an address, a header), 406 (inactive
# recipient: anymail raises AnymailRecipientsRefused), 402/409 (not valid
# JSON) are the message's; 400/401/405/412 (sender signature, account) are the
# account's (:data:`_ACCOUNT_REFUSALS`). Amazon SES (boto3) names errors:
# ``MessageRejected`` (and an invalid parameter) is the message's; throttling
# and a paused account are not.
PERMANENT_REFUSALS: dict[str, dict[int | str, frozenset[int | str] | None]] = {
    "Postmark": {422: frozenset({300, 402, 406, 409})},
    "Mailgun": {400: None, 413: None},
    "SendGrid": {400: None, 413: None},
    "Brevo": {400: None},
    "Amazon SES": {"MessageRejected": None, "InvalidParameterValue": None},
}
# Answers that mean "the request may have been acted on": a gateway that lost
# the ESP's verdict.
_GATEWAY_LOST = frozenset({502, 504})
# Answers that ask the client to come back later.
_COME_BACK = frozenset({429, 503})
# requests' / urllib3's / botocore's errors of a request that never left.
_NEVER_LEFT = frozenset(
    {
        "ConnectTimeout",
        "ConnectTimeoutError",
        "NewConnectionError",
        "NameResolutionError",
        "SSLError",
        "ProxyError",
        "EndpointConnectionError",
        "InvalidURL",
        "MissingSchema",
        "InvalidSchema",
    }
)
# ... and of a request that left, whose answer never came back (whole).
_LEFT_UNANSWERED = frozenset(
    {
        "ReadTimeout",
        "ReadTimeoutError",
        "ProtocolError",
        "RemoteDisconnected",
        "ChunkedEncodingError",
        "ContentDecodingError",
        "ConnectionClosedError",
        "IncompleteRead",
    }
)
# Throttling names in botocore's ClientError codes.
_SES_THROTTLED = frozenset({"Throttling", "ThrottlingException", "TooManyRequestsException"})


@dataclass(frozen=True)
class HttpFailure:
    """What an HTTP delivery backend's error means."""

    kind: FailureKind
    why: str
    status: int | None = None
    retry_after: float | None = None  # seconds the ESP asked us to wait (429, 503)


def http_failure(exc: BaseException) -> HttpFailure | None:
    """The meaning of ``exc`` if an HTTP delivery backend raised it, else None.

    Module docstring, and :data:`PERMANENT_REFUSALS`; None also for an
    error that is not about the request (``AnymailInvalidAddress``). Read from the classes'
    names along the ``__cause__`` chain (anymail's error is raised ``from``
    the ``requests`` one, which wraps urllib3's), so neither library is
    imported here.
    """
    names = {name for e in _chain(exc) for name in _class_names(e)}
    if not names & {"AnymailError", "RequestException", "BotoCoreError", "ClientError"}:
        return None
    if "AnymailRecipientsRefused" in names:
        return HttpFailure(FailureKind.PERMANENT, "the ESP refused every recipient")
    esp = next((str(n) for e in _chain(exc) if (n := getattr(e, "esp_name", None))), "")
    status = _status(exc)
    if status is not None:
        return _by_status(exc, esp, status)
    code = _boto_code(exc)
    if code is not None:
        if code in _SES_THROTTLED:
            return HttpFailure(FailureKind.TRANSIENT, f"throttled ({code})")
        permanent = code in PERMANENT_REFUSALS.get(esp or "Amazon SES", {})
        kind = FailureKind.PERMANENT if permanent else FailureKind.TRANSIENT
        return HttpFailure(kind, f"refused ({code})")
    # No answer: did the request leave? Look at the innermost errors first.
    for e in reversed(list(_chain(exc))):
        for arg in (e, *getattr(e, "args", ())):
            found = set(_class_names(arg)) if isinstance(arg, BaseException) else set()
            reason = getattr(arg, "reason", None)
            if isinstance(reason, BaseException):
                found |= set(_class_names(reason))
            if found & _NEVER_LEFT:
                return HttpFailure(FailureKind.TRANSIENT, "the request never left")
            if found & _LEFT_UNANSWERED:
                return HttpFailure(FailureKind.AMBIGUOUS, "the request left, no answer came back")
    if names & {"Timeout", "ConnectionError"}:
        # A requests error that names neither side: the request may have left.
        return HttpFailure(FailureKind.AMBIGUOUS, "the request may have left, no answer")
    # Not about the request (an address anymail cannot encode, a setting): the
    # general rules below decide, as for any backend.
    return None


def _by_status(exc: BaseException, esp: str, status: int) -> HttpFailure:
    if 200 <= status < 300:
        # Accepted, then the answer could not be read (anymail's "invalid response").
        return HttpFailure(FailureKind.AMBIGUOUS, f"HTTP {status}, answer unreadable", status)
    if status in _GATEWAY_LOST:
        return HttpFailure(FailureKind.AMBIGUOUS, f"HTTP {status} from a gateway", status)
    if status in _COME_BACK:
        return HttpFailure(FailureKind.TRANSIENT, f"HTTP {status}", status, retry_after(exc))
    codes = PERMANENT_REFUSALS.get(esp, {}).get(status, frozenset())
    if codes is None or _esp_code(exc) in codes:
        return HttpFailure(FailureKind.PERMANENT, f"HTTP {status}: refused by {esp}", status)
    return HttpFailure(FailureKind.TRANSIENT, f"HTTP {status}", status)


# The longest wait a Retry-After may ask for; beyond it, a header's mistake is likelier.
MAX_RETRY_AFTER = 3600.0


def retry_after(exc: BaseException) -> float | None:
    """Seconds the ESP's ``Retry-After`` header asks for (a number or an HTTP date), capped."""
    response = next((r for r in _responses(exc)), None)
    value = (getattr(response, "headers", None) or {}).get("Retry-After")
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(MAX_RETRY_AFTER, max(0.0, (when - datetime.now(UTC)).total_seconds()))


def esp_answer(exc: BaseException, limit: int = 500) -> str:
    """The ESP's answer to the request (status and body), for the attempt's error; "" if none."""
    response = next(_responses(exc), None)
    if response is None:
        return ""
    try:
        text = str(response.text)
    except Exception:  # an undecodable body: the status alone says enough
        text = ""
    return f"HTTP {response.status_code}: {text}"[:limit]


def refused_by_esp(exc: BaseException) -> list[str]:
    """Recipients an ESP refused (``AnymailRecipientsRefused``): "invalid" or "rejected"."""
    for e in _chain(exc):
        if "AnymailRecipientsRefused" not in _class_names(e):
            continue
        status = getattr(getattr(e, "email_message", None), "anymail_status", None)
        recipients = getattr(status, "recipients", None) or {}
        return [
            str(address)
            for address, one in recipients.items()
            if getattr(one, "status", None) in ("invalid", "rejected")
        ]
    return []


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _class_names(exc: object) -> Iterator[str]:
    return (klass.__name__ for klass in type(exc).__mro__)


def _responses(exc: BaseException) -> Iterator[Any]:
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if response is not None and hasattr(response, "status_code"):
            yield response


def _status(exc: BaseException) -> int | None:
    for e in _chain(exc):
        status = getattr(e, "status_code", None)
        if isinstance(status, int):
            return status
    response = next(_responses(exc), None)
    return response.status_code if response is not None else None


def _esp_code(exc: BaseException) -> object:
    """The ESP's own error code in its JSON answer (Postmark's ``ErrorCode``), or None."""
    response = next(_responses(exc), None)
    try:
        body = response.json() if response is not None else None
    except ValueError:
        return None
    return body.get("ErrorCode") if isinstance(body, dict) else None


def _boto_code(exc: BaseException) -> str | None:
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            if code:
                return str(code)
    return None


# -- the cause, for the failure alarm (outbox.queue.alarm) ----------------------------

# An address, bare or in angle brackets (an SMTP reply names the sender or the recipient).
_ADDRESS = re.compile(r"<?[^\s<>@'\"(),;]+@[^\s<>'\"(),;]+?>?(?=[\s'\"(),;:]|$)")
# A token of eight or more letters and digits with a digit in it: a queue id, a
# message id, a timestamp; the same failure names a different one each time.
_SERIAL = re.compile(r"\b(?=[\w-]*\d)[\w-]{8,}\b")
CAUSE_LENGTH = 200


def cause_of(exc: BaseException) -> str:
    """What ``exc`` says, in one short line that failures alike share: the alarm's cause.

    The error's class and, for an SMTP reply, its code and text
    (``SMTPSenderRefused 451 4.7.1 <address>: Sender address rejected``); for
    an ESP, its HTTP status and answer; else the error's message. Tidied by
    :func:`tidy_cause`.
    """
    name = type(exc).__name__
    if isinstance(exc, smtplib.SMTPRecipientsRefused) and exc.recipients:
        code, text = next(iter(exc.recipients.values()))
        return tidy_cause(f"{name} {code} {_text(text)}")
    if isinstance(exc, smtplib.SMTPResponseException):
        return tidy_cause(f"{name} {exc.smtp_code} {_text(exc.smtp_error)}")
    answer = esp_answer(exc)
    if answer:
        return tidy_cause(f"{name} {answer}")
    return tidy_cause(f"{name}: {exc}")


def tidy_cause(text: str) -> str:
    """``text`` without addresses or serial numbers, on one line, at most 200 characters."""
    text = _ADDRESS.sub("<address>", text)
    text = _SERIAL.sub("…", text)
    text = " ".join(text.split())
    return text if len(text) <= CAUSE_LENGTH else text[: CAUSE_LENGTH - 1] + "…"


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
