"""Step 4 of the protocol: what one attempt's outcome is, and writing it down.

An attempt ends in one of these, each written by ONE conditional UPDATE that
matches the row's claim token (``status = 'processing' AND claim_token = ...``),
in the same transaction as its Attempt row:

``sent``       the backend accepted the message: the row becomes ``sent``
``retry``      a transient failure: back to ``queued`` with a backoff
``failed``     a permanent failure, or the last attempt: ``failed``
``ambiguous``  the connection broke after the body was handed over, so the
               server may have the message. Under ``ABANDONED_POLICY =
               "review"`` the row becomes ``abandoned`` for a person, exactly
               like a crash inside the send window, and is never resent
               automatically; under ``"requeue"`` it is retried.
``released``   never handed over (the lease ran out first), or refused with
               the mailer's configuration (its ESP answered 401/403, its
               backend cannot be created: ``failures.configuration_refused``;
               the mailer is paused, ``gate.Gate.settled``): back to ``queued``, due at
               once or when the mailer's pause ends, and the attempt does not
               count
``cancelled``  never handed over: the staging valve stopped the copy
               (``outbox.mail.valve.admit``); the attempt does not count

If the UPDATE changes no row, someone else (the sweeper, an operator) settled
the row meanwhile; nothing is overwritten. A success is still written as an
Attempt row then: it is the evidence an operator needs.

When the database fails the write (retried while it is unreachable) or
refuses it for good (settled with the least that can be written),
:class:`~outbox.worker.settling.Settling` takes over.

The suppression list is written best-effort inside the outcome: an address
it cannot hold (an IDNA form longer than its column) is logged as a WARNING
and the outcome is written without it (a savepoint keeps the transaction
usable on PostgreSQL).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, transaction

from .. import transitions
from ..conf import outbox_settings
from ..db import refused_for_good, storable
from ..exceptions import DeliveryError
from ..mail import request
from ..mail.connection import Server
from ..mail.failures import (
    FailureKind,
    cause_of,
    classify,
    configuration_refused,
    esp_answer,
    http_failure,
    refused_by_esp,
)
from ..models import (
    Attempt,
    Delivery,
    as_django_stores,
    epoch,
    instant,
    outbox_alias,
)
from ..operations import esp_evidence
from ..queue.entries import QueueEntry
from ..suppression import add_refused, bare_address, refused_recipients
from .inflight import InFlight
from .sql import mark_sent

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status
Outcome = Attempt.Outcome


@dataclass
class Settlement:
    """The outcome of one attempt, waiting to be written."""

    flight: InFlight  # the delivery in flight it is the outcome of (marked)
    outcome: str  # an Attempt.Outcome: sent, retry, failed, ambiguous, released or cancelled
    # Why; for a success, a note for the attempt log (the staging valve's
    # redirect), which makes the success write an Attempt row too.
    error: str = ""
    retry_at: datetime | None = None
    permanent: bool = False
    # Recipients the server refused for good (5xx at RCPT): suppressed with
    # the outcome when OUTBOX["SUPPRESS_ON_REFUSAL"] is on.
    refused: list[str] = field(default_factory=list)
    # Where the connection handed it over (None: no server reached, or not known).
    server: Server | None = None
    # For a success: where the copy really went when the staging valve
    # redirected it (OUTBOX["REDIRECT_TO"]), for the log line; "" otherwise.
    sent_to: str = ""
    # The database's refusal for good of this outcome's write, once there was one.
    refusal: str = ""
    # For a success through an ESP's API: its own id of the message
    # (``outbox.mail.esp.esp_message_id``), written on the attempt's row.
    esp_message_id: str = ""
    # The outcomes of the companions sent in the same request (``outbox.mail.request``):
    # written with this one, in its transaction; each ``changed`` once written.
    companions: list[Settlement] = field(default_factory=list)
    changed: int = 0
    # For a failure: what it says, shared by failures alike (the failure alarm's
    # cause: ``outbox.mail.failures.cause_of``); "" otherwise.
    cause: str = ""

    @property
    def delivery(self) -> Delivery:
        return self.flight.delivery


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: between half and all of base * 2**(n-1), capped."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def failure(flight: InFlight, exc: BaseException, now: datetime) -> Settlement:
    """The outcome of an attempt that raised ``exc``; ``now`` is Redis time."""
    settlement = _failure(flight, exc, now)
    settlement.cause = cause_of(exc)
    return settlement


def _failure(flight: InFlight, exc: BaseException, now: datetime) -> Settlement:
    delivery = flight.delivery
    error = f"{type(exc).__name__}: {exc}"
    answer = esp_answer(exc)
    if answer and answer not in error:
        error = f"{error} (the ESP's answer: {answer})"
    error = storable(error[:2000])
    kind = classify(exc)
    if kind is not FailureKind.AMBIGUOUS and configuration_refused(exc) is not None:
        # Not this message's fault: no attempt burnt; due when the mailer's
        # pause ends (``gate.Gate.settled``).
        return Settlement(flight, Outcome.RELEASED, f"the mailer is paused: {error}"[:2000])
    if kind is FailureKind.AMBIGUOUS:
        error = f"in doubt: {error}"[:2000]
        if outbox_settings.ABANDONED_POLICY == "review":
            return Settlement(flight, Outcome.AMBIGUOUS, error)
    permanent = kind is FailureKind.PERMANENT
    if permanent or delivery.attempts >= delivery.max_attempts:
        refused: list[str] = []
        if outbox_settings.SUPPRESS_ON_REFUSAL:
            # An SMTP 5xx at RCPT, or an ESP's refusal of the recipient.
            refused = refused_recipients(exc) + [bare_address(a) for a in refused_by_esp(exc)]
        return Settlement(flight, Outcome.FAILED, error, permanent=permanent, refused=refused)
    base, cap = outbox_settings.RETRY_BACKOFF
    delay = backoff_delay(delivery.attempts, base, cap)
    http = http_failure(exc)
    if http is not None and http.retry_after is not None:
        # The ESP said when (429, 503): never earlier, whatever the backoff says.
        delay = max(delay, http.retry_after)
    # Added to the instant: naive arithmetic (USE_TZ = False) drops fold and
    # counts wall-clock time, an hour off the night the clocks change.
    retry_at = as_django_stores(instant(now) + timedelta(seconds=delay))
    return Settlement(flight, Outcome.RETRY, error, retry_at)


def from_answer(flight: InFlight, answer: request.Answer, now: datetime) -> Settlement:
    """The outcome of one row of a request the ESP answered, from its recipient's status.

    Accepted is a success with the ESP's id; refused for good is ``failed``,
    the address suppressed under ``SUPPRESS_ON_REFUSAL``; not named, the
    request's fate (``outbox.mail.request.REFUSED``); anything else is retried
    as a transient failure.
    """
    status = answer.of(flight.delivery.recipient)
    if status is None and not answer.taken:
        why = "the ESP refused the request for another recipient; not sent to this one"
        return failure(flight, DeliveryError(why), now)
    if status is None or status.status in request.ACCEPTED:
        note = (
            "" if status is not None else "accepted by the ESP, with no status for this recipient"
        )
        return Settlement(
            flight, Outcome.SENT, note, esp_message_id=status.message_id if status else ""
        )
    if status.status in request.REFUSED:
        refused = [bare_address(flight.delivery.recipient)]
        return Settlement(
            flight,
            Outcome.FAILED,
            f"the ESP refused this recipient: {status.status}",
            permanent=True,
            refused=refused if outbox_settings.SUPPRESS_ON_REFUSAL else [],
        )
    why = f"the ESP's status for this recipient: {status.status}"
    return failure(flight, DeliveryError(why), now)


# What each outcome other than a success writes (a success: ``sql.mark_sent``).
_WRITES: dict[str, transitions.Transition] = {
    Outcome.FAILED: transitions.FAILED,
    Outcome.AMBIGUOUS: transitions.IN_DOUBT,
    Outcome.CANCELLED: transitions.DROPPED,
    Outcome.RETRY: transitions.RETRY,
    Outcome.RELEASED: transitions.RELEASE,
}


def write_outcome(s: Settlement, now: datetime, push: Callable[[list[QueueEntry]], None]) -> int:
    """Write ``s`` inside the caller's transaction; returns how many rows changed.

    A success is recorded on the row itself (status, ``sent_at``, and the
    worker, token, start time and attempt number it was claimed with): that is
    the evidence, so it writes no Attempt row (unless it carries a note: a copy
    the staging valve redirected says where it went; one sent through an ESP keeps
    the ESP's message id). Any other outcome also writes
    its Attempt row, and a retry or a release pushes the id back to Redis
    (forced: it is in no ready list) once the transaction commits.
    """
    for companion in s.companions:
        companion.changed = write_outcome(companion, now, push)
    if s.outcome in _OVERRIDDEN and not s.permanent:
        settle_from_evidence(s)
    delivery = s.delivery
    if s.outcome == Outcome.SENT:
        changed = mark_sent(delivery.pk, s.flight.token, now)
        if changed and (s.error or s.esp_message_id) and not attempt_logged(s):
            log_attempt(s, now)  # where a redirected copy went; the ESP's id of it
        return changed or sent_but_not_ours(s, now)
    changed = _WRITES[s.outcome].apply(
        delivery.pk,
        s.flight.token,
        now=now,
        error=s.error,
        retry_at=s.retry_at,
        not_before=s.retry_at or now,  # released: due again at once, or after the mailer's pause
    )
    if not changed and attempt_logged(s):
        # A retry after a commit whose reply was lost: nothing to write again.
        changed = 1
    else:
        log_attempt(s, now)
    if s.refused:
        suppress_refused(s)
    if changed and s.outcome in (Outcome.RETRY, Outcome.RELEASED):
        due = s.retry_at or now
        entry = QueueEntry(delivery.pk, delivery.priority, epoch(due))
        transaction.on_commit(lambda: push([entry]), using=outbox_alias())
    return changed


# Outcomes an ESP's event for the attempt overrides: the ESP has the message.
_OVERRIDDEN = frozenset({Outcome.RETRY, Outcome.AMBIGUOUS, Outcome.FAILED})


def settle_from_evidence(s: Settlement) -> None:
    """Make ``s`` a success if the ESP's event for its attempt came first.

    An ESP posts its event within seconds, maybe before its answer (which may
    then be lost, or a 5xx): :func:`outbox.contrib.anymail.record_event` keeps it as the attempt's
    evidence, and a retry would send the message twice. The row is locked
    first (PostgreSQL; SQLite has one writer), and the event's side locks it
    too before it writes: either the evidence is seen here, or the event finds
    the outcome written and settles an in-doubt row itself.
    """
    pk = s.delivery.pk
    Delivery.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True).first()
    found = esp_evidence(pk, s.flight.token)
    if found is None:
        return
    why = f"{s.outcome} ({s.error})" if s.error else s.outcome
    s.error = storable(
        f"sent: the ESP's event for this attempt came first ({found.error}); "
        f"the attempt was to end {why}"[:2000]
    )
    s.outcome, s.permanent, s.refused, s.retry_at = Outcome.SENT, False, [], None
    s.esp_message_id = s.esp_message_id or found.esp_message_id


def suppress_refused(s: Settlement) -> None:
    """Put the refused recipients on the suppression list, best-effort, in the outcome's transaction.

    An address already listed stays as it is. One the list cannot hold is
    logged and left out: the outcome is written anyway (module docstring).
    """
    try:
        with transaction.atomic(
            using=outbox_alias()
        ):  # a savepoint: a refusal leaves the outer transaction usable
            add_refused(s.refused, s.error)
    except DatabaseError as exc:
        if not refused_for_good(exc):
            raise  # the connection's: the whole outcome is retried
        logger.warning(
            "delivery %s: could not put %s on the suppression list (%s: %s); "
            "the outcome is recorded without it",
            s.delivery.pk,
            ", ".join(a[:80] for a in s.refused),
            type(exc).__name__,
            exc,
        )


def sent_but_not_ours(s: Settlement, now: datetime) -> int:
    """The success UPDATE changed nothing: find out why (rare).

    Returns 1 if the row is already ``sent`` under this attempt's token (a
    retry after a commit whose reply was lost). Otherwise someone else (the
    sweeper, an operator) settled the row meanwhile: the server's acceptance
    is then written as an Attempt row, the evidence an operator needs, and 0
    is returned.
    """
    if Delivery.objects.filter(
        pk=s.delivery.pk, status=Status.SENT, claim_token=s.flight.token
    ).exists():
        return 1
    if not attempt_logged(s):
        log_attempt(s, now)
    return 0


def log_attempt(s: Settlement, finished: datetime) -> None:
    delivery = s.delivery
    error = s.error
    if s.outcome == Outcome.AMBIGUOUS:
        error = (
            f"{error}; the server may have accepted Message-ID {delivery.message_id}: "
            "check the mail logs, then mark it sent or requeue it"
        )[:2000]
    server = s.server or Server("")
    Attempt.objects.create(
        server_host=server.host,
        server_address=server.address,
        delivery_id=delivery.pk,
        number=delivery.attempts,
        worker_id=delivery.worker_id,
        claim_token=s.flight.token,
        started_at=delivery.processing_started_at or finished,
        finished_at=finished,
        outcome=s.outcome,
        error=error,
        actor=delivery.worker_id,
        esp_message_id=s.esp_message_id,
    )


def attempt_logged(s: Settlement) -> bool:
    """Whether this attempt's outcome already has its Attempt row.

    True after a retry of a commit whose reply was lost: the Attempt row is
    written in the same transaction as the outcome, so its claim token is the
    proof.
    """
    return Attempt.objects.filter(
        delivery_id=s.delivery.pk, claim_token=s.flight.token, outcome=s.outcome
    ).exists()
