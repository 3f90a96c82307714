"""Delivery events from an ESP, through django-anymail's ``tracking`` signal (optional).

When django-anymail is installed, :meth:`outbox.apps.OutboxConfig.ready`
connects :func:`record_event`. An event is matched to a delivery by, in
order: the delivery's identity in the event's metadata (id and claim token,
which every copy sent through an anymail backend carries: :func:`outbox.mail.esp.identify`;
for a message sent in one request, the event's recipient picks its row among
those of the same attempt),
the ESP's own message id recorded on an attempt, or the RFC Message-ID. Then:

- a row **in doubt** (``abandoned``: the request's answer was lost, or the
  worker died mid-send) is settled ``sent`` by any event about the message
  (queued, sent, delivered, deferred, bounced, opened, ...): the ESP has it.
  The write is the operator's and the reconcilers' (``operations.mark_sent``,
  ``WHERE status='abandoned'``), actor ``esp:<name>``, the event as evidence;
- a ``bounced``, ``rejected`` or ``complained`` event writes an
  :class:`~outbox.models.Attempt` of that outcome; a bounce or a complaint
  also puts the recipient on the suppression list (source ``refusal``). The
  status is not changed otherwise: the ESP did accept the message;
- any other event about a ``sent`` row adds its evidence (outcome
  ``reported``), once per event type;
- an event that names, by metadata, an attempt whose outcome is not settled
  (the row still ``processing``: the ESP's word came before its answer, or
  instead of it) is written at once as that attempt's evidence (``reported``,
  under the attempt's claim token); whoever then decides the attempt's
  outcome (the worker: in doubt, a lost answer, a 5xx after the ESP took
  it; the sweeper: a worker that died) settles it ``sent`` from it, never a
  retry. An event about an older attempt is evidence about that one only.

An event that arrives twice, late, or about a message the outbox did not send
changes nothing: the settling write is conditional, and evidence already
written is not written again. Events about a row in another state (queued,
failed) change nothing either; one naming an attempt by metadata is kept and
logged as a WARNING, since the ESP has a message the outbox does not count
as sent. Inbound and unknown events are ignored.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .. import operations
from ..mail.esp import identity_of
from ..models import Attempt, Delivery, outbox_alias
from ..suppression import add_refused, bare_address

logger = logging.getLogger("outbox.esp")

Outcome = Attempt.Outcome
Status = Delivery.Status

# anymail's event types the outbox records, and the outcome each is written as.
RECORDED = {
    "bounced": Outcome.BOUNCED,
    "rejected": Outcome.REJECTED,
    "complained": Outcome.COMPLAINED,
}
# Events that mean "never send to this address again".
SUPPRESSING = frozenset({"bounced", "complained"})
# Events that are not about a message the outbox sent.
IGNORED = frozenset({"inbound", "inbound_failed", "unknown", ""})


def connect() -> bool:
    """Connect :func:`record_event` to anymail's ``tracking`` signal, if anymail is installed."""
    if importlib.util.find_spec("anymail") is None:
        return False
    from anymail.signals import tracking

    tracking.connect(record_event, dispatch_uid="outbox.contrib.anymail")
    return True


def record_event(sender: Any, event: Any, esp_name: str, **kwargs: Any) -> None:
    """The ``tracking`` receiver: see the module docstring."""
    event_type = str(getattr(event, "event_type", None) or "")
    if event_type in IGNORED:
        return
    delivery, exact = find_delivery(event)
    if delivery is None:
        return
    actor = f"{operations.ESP_ACTOR}{esp_name}"
    evidence = _describe(event, esp_name)
    if exact and delivery.status not in (Status.ABANDONED, Status.SENT):
        identity = identity_of(getattr(event, "metadata", None))
        assert identity is not None  # exact: named by its metadata
        if _keep_for_the_attempt(delivery, identity[1], event, event_type, actor, evidence):
            return
    settled = False
    if delivery.status == Status.ABANDONED:
        settled = bool(operations.mark_sent([delivery.pk], actor, evidence=evidence).changed)
        if settled:
            logger.warning(
                "delivery %s was in doubt; %s reported %s: marked sent",
                delivery.pk,
                esp_name,
                event_type,
            )
        delivery.refresh_from_db()
    outcome = RECORDED.get(event_type)
    if outcome is None and (settled or delivery.status != Status.SENT):
        return  # the settling decision is the evidence; other rows: nothing to add
    _write_evidence(delivery, event, event_type, outcome or Outcome.REPORTED, actor, evidence)


def find_delivery(event: Any) -> tuple[Delivery | None, bool]:
    """The delivery ``event`` is about, and whether its metadata named the very attempt."""
    identity = identity_of(getattr(event, "metadata", None))
    if identity is not None:
        pk, token = identity
        ours = Q(claim_token=token) | Q(attempt_log__claim_token=token)
        delivery = Delivery.objects.filter(ours, pk=pk).distinct().first()
        if delivery is not None:
            return _recipients_row(delivery, ours, event), True
    message_id = str(getattr(event, "message_id", None) or "").strip()
    if not message_id:
        return None, False
    # The exclude repeats the partial index's condition, so the index is used.
    attempt = (
        Attempt.objects.filter(esp_message_id=message_id)
        .exclude(esp_message_id="")
        .select_related("delivery")
        .first()
    )
    if attempt is not None:
        return attempt.delivery, False
    # ESPs report the Message-ID with or without its angle brackets.
    bare = message_id.strip("<>")
    return Delivery.objects.filter(message_id__in=[f"<{bare}>", bare]).first(), False


def _keep_for_the_attempt(
    delivery: Delivery, token: Any, event: Any, event_type: str, actor: str, evidence: str
) -> bool:
    """Keep an event naming an attempt whose outcome is not written yet (or was written without it).

    The ESP's word that it has the message usually comes within seconds,
    while the request's answer may still be awaited (or lost, or a 5xx after
    the ESP took it): the event is written at once as the attempt's evidence
    (an Attempt row under the attempt's claim token), and the worker or the
    sweeper that decides the attempt's outcome settles it ``sent`` from it
    (:func:`outbox.worker.outcomes.settle_from_evidence`;
    ``outbox.sweeper.sweep.Sweeper._settle_from_evidence``). The row
    is locked first, so that the decision sees the evidence or happened before
    it; one decided meanwhile (in doubt) is settled here. Returns False when
    the row left the attempt's hands (the caller goes on as before).
    """
    with transaction.atomic(using=outbox_alias()):
        row = Delivery.objects.select_for_update().filter(pk=delivery.pk).first()
        if row is None or row.status in (Status.ABANDONED, Status.SENT):
            return False
        logger.warning(
            "delivery %s is %s, and %s reported %s for its attempt: the ESP has the message; "
            "kept as the attempt's evidence",
            row.pk,
            row.status,
            actor.removeprefix(operations.ESP_ACTOR),
            event_type,
        )
        _write_evidence(row, event, event_type, Outcome.REPORTED, actor, evidence, token=token)
    return True


def _recipients_row(delivery: Delivery, ours: Q, event: Any) -> Delivery:
    """The row of the event's recipient among those sent in ``delivery``'s request.

    A message's rows go to an ESP in one request under one claim token, and
    its metadata names the first of them (:func:`outbox.mail.esp.identify`): the event's
    recipient picks its own row, of the same email and attempt.
    """
    recipient = str(getattr(event, "recipient", None) or "")
    if not recipient or bare_address(recipient) == bare_address(delivery.recipient):
        return delivery
    companion = (
        Delivery.objects.filter(
            ours, email_id=delivery.email_id, recipient_key=bare_address(recipient)
        )
        .distinct()
        .first()
    )
    return companion or delivery


def _write_evidence(
    delivery: Delivery,
    event: Any,
    event_type: str,
    outcome: str,
    actor: str,
    evidence: str,
    token: Any = None,
) -> None:
    """One Attempt row for the event (not again for the same one), and its suppression.

    ``token``: the claim token of the attempt the event named, when its
    outcome is not settled yet: the row is then that attempt's evidence.
    """
    written = Attempt.objects.filter(delivery=delivery, actor=actor[:255])
    if token is not None:
        written = written.filter(claim_token=token)
    if outcome == Outcome.REPORTED:
        # Once per event type (opens and clicks come many times); an event that
        # settled the row is its evidence already.
        written = written.filter(
            outcome__in=[Outcome.REPORTED, Outcome.MARKED_SENT],
            error__startswith=evidence.split(":", 1)[0],
        )
    else:
        written = written.filter(outcome=outcome, error=evidence)
    if written.exists():
        return
    now = timezone.now()
    with transaction.atomic(using=outbox_alias()):
        Attempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            started_at=getattr(event, "timestamp", None) or now,
            finished_at=now,
            outcome=outcome,
            error=evidence,
            actor=actor[:255],
            claim_token=token,
            esp_message_id=str(getattr(event, "message_id", None) or "")[:255],
        )
        if event_type in SUPPRESSING:
            add_refused([bare_address(delivery.recipient)], evidence)
    logger.info("delivery %s: %s", delivery.pk, evidence)


def _describe(event: Any, esp_name: str) -> str:
    parts = [f"{esp_name} reported {event.event_type}"]
    for attribute in ("reject_reason", "description", "mta_response"):
        value = getattr(event, attribute, None)
        if value:
            parts.append(str(value))
    if getattr(event, "message_id", None):
        parts.append(f"ESP message id {event.message_id}")
    return ": ".join(parts)[:2000]


__all__ = ["IGNORED", "RECORDED", "SUPPRESSING", "connect", "find_delivery", "record_event"]
