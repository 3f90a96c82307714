"""State changes made outside the worker's hot path: by the sweeper and by operators.

Each call applies one transition of :mod:`outbox.transitions`, in one
transaction. The rows to change are locked and read, then changed with an
UPDATE that repeats the same condition, so a row that moved on
meanwhile (a worker finished it, another sweeper got there first) is skipped,
never overwritten. Every change is written to the Attempt log with its actor,
and rows that become ``queued`` are pushed to Redis after the commit.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from . import signals, tracing, transitions
from .db import database_now
from .exceptions import OutboxError
from .models import WORKER_ID_MAX_LENGTH, Attempt, Delivery, instant, outbox_alias
from .queue.entries import QueueEntry
from .queue.publish import publish
from .transitions import Transition

Status = Delivery.Status


class Locked(NamedTuple):
    """A row a transition locked, read by column name: what its change and its push need."""

    pk: int
    attempts: int
    priority: str
    worker_id: str
    not_before: datetime


_CHUNK = 500

# A skipped row's reason when it was in a source status but its email's content
# is gone (``transitions.CONTENT``: a requeue would have nothing to send).
CONTENT_CLEARED = "content cleared"


@dataclass
class TransitionResult:
    """What a transition changed, and why the other rows were left alone."""

    changed: list[int] = field(default_factory=list)
    # current status (or CONTENT_CLEARED, or "deleted") -> count
    skipped: Counter[str] = field(default_factory=Counter)

    def __iadd__(self, other: TransitionResult) -> TransitionResult:
        self.changed += other.changed
        self.skipped.update(other.skipped)
        return self


def transition(
    ids: Iterable[int],
    change: Transition,
    *,
    actor: str,
    error: str = "",
    condition: Q | None = None,
    now: datetime | None = None,
) -> TransitionResult:
    """Apply ``change`` (from :mod:`outbox.transitions`) to the rows among ``ids`` it may change.

    ``condition`` narrows the rows further (e.g. "still held by this dead
    worker"); ``error`` is the text the transition writes, if it writes one,
    and the attempt log's. A requeue that keeps its schedule
    (:data:`~outbox.transitions.REQUEUE`) leaves a ``not_before`` still ahead.

    The clocks: ``now`` is the time to write (the sweeper passes Redis time,
    the clock of its other decisions). Without it (an operator's action) it is
    the database's ``now()`` on PostgreSQL, the clock the worker's due test
    reads, and this host's clock on SQLite, which has no server clock. What
    the table writes as "the clock" (a requeued row's ``updated_at``) is the
    database's ``now()`` on PostgreSQL whoever acts (:mod:`outbox.transitions.table`
    says why); the sweeper's other writes keep Redis time (an abandoned row's
    ``updated_at`` is compared with Redis time by :func:`outbox.sweeper.reconcile.reconcile`).
    """
    result = TransitionResult()
    id_list = list(dict.fromkeys(ids))
    for start in range(0, len(id_list), _CHUNK):
        result += _transition_chunk(
            id_list[start : start + _CHUNK],
            change,
            actor=actor,
            error=error,
            condition=condition,
            now=now,
        )
    return result


def _transition_chunk(
    ids: list[int],
    change: Transition,
    *,
    actor: str,
    error: str,
    condition: Q | None,
    now: datetime | None,
) -> TransitionResult:
    result = TransitionResult()
    using = outbox_alias()
    to = str(change.target.value)
    with transaction.atomic(using=using):
        db_now = database_now(using)  # the transaction's now(): what its statements read
        # An operator's "now" on PostgreSQL is the database's: due now by the
        # clock of the worker's claim, which Redis' follows (pushed as due now).
        due_by_database = now is None and db_now is not None
        moment = now or db_now or timezone.now()
        values = change.values(connections[using].vendor, now=moment, error=error)
        keep = change.keeps_schedule()
        match = Q(pk__in=ids) & change.match()
        if condition is not None:
            match &= condition
        rows = [
            Locked(**row)
            for row in Delivery.objects.using(using)
            # A row locked right now is being settled by someone else (or by a
            # frozen worker inside its transaction): skip it, never wait on it.
            # A requeue's condition joins the email (transitions.CONTENT), whose
            # row is then locked too: the content retention takes turns with it
            # (outbox.sweeper.retention.clear_content).
            .select_for_update(skip_locked=True)
            .filter(match)
            .values(*Locked._fields)
        ]
        if rows:
            _change_rows(
                using,
                match,
                rows,
                values,
                outcome=change.logged_as,
                actor=actor,
                error=error,
                now=moment,
            )
        result.changed = [row.pk for row in rows]
        _count_skipped(using, set(ids) - set(result.changed), result.skipped, change)
        if rows:
            entries = []
            at = instant(moment)
            for row in rows:
                # The push after the commit carries the row's new not_before,
                # so it replaces any scheduled entry of the id with that time.
                # Compared as instants: naive times (USE_TZ = False) compare
                # without their fold, and a repeated hour's second time would
                # lose to an earlier "now".
                when = max(instant(row.not_before), at) if keep else at
                due = 0.0 if due_by_database and when == at else when.timestamp()
                entries.append(QueueEntry(row.pk, row.priority, due))
            workers = {row.pk: row.worker_id for row in rows}
            transaction.on_commit(
                partial(_after_commit, to, entries, workers, actor, error), using=using
            )
            # On the email's trace, when OpenTelemetry records (outbox.tracing.settled).
            changed = result.changed
            transaction.on_commit(
                partial(tracing.settled, changed, str(change.logged_as or to), actor), using=using
            )
    return result


def _change_rows(
    using: str,
    match: Q,
    rows: list[Locked],
    values: dict[str, Any],
    *,
    outcome: str,
    actor: str,
    error: str,
    now: datetime,
) -> None:
    """Update the locked ``rows`` and log one Attempt each (inside the transaction)."""
    changed = (
        Delivery.objects.using(using)
        .filter(match, pk__in=[row.pk for row in rows])
        .update(**values)
    )
    if changed != len(rows):
        # The rows are locked, so this cannot happen on PostgreSQL or on
        # SQLite (one writer); roll back rather than log a wrong history.
        raise OutboxError(f"expected to change {len(rows)} rows, changed {changed}")
    Attempt.objects.using(using).bulk_create(
        Attempt(
            delivery_id=row.pk,
            number=row.attempts,
            worker_id=row.worker_id,
            started_at=now,
            finished_at=now,
            outcome=outcome,
            error=error,
            actor=actor[:WORKER_ID_MAX_LENGTH],
        )
        for row in rows
    )


def _count_skipped(using: str, others: set[int], skipped: Counter[str], change: Transition) -> None:
    """Count the rows left alone by their current status; rows gone count as "deleted".

    A row the change would take but for its email's cleared content counts as
    :data:`CONTENT_CLEARED`.
    """
    if not others:
        return
    guarded = transitions.CONTENT in change.guard
    for status, cleared in (
        Delivery.objects.using(using)
        .filter(pk__in=others)
        .values_list("status", "email__content_cleared_at")
    ):
        if guarded and cleared is not None and status in change.source:
            skipped[CONTENT_CLEARED] += 1
        else:
            skipped[status] += 1
    missing = len(others) - sum(skipped.values())
    if missing:
        skipped["deleted"] += missing


def _after_commit(
    to: str, entries: list[QueueEntry], workers: dict[int, str], actor: str, error: str
) -> None:
    if to == Status.QUEUED:
        # Forced: a row coming back to queued may have left its id anywhere in
        # Redis (scheduled for an old time, or a dedup-set entry whose list was
        # lost); a duplicate is harmless, a skipped push would strand the row.
        publish(entries, force=True)
    for entry in entries:
        if to == Status.SENT:
            signals.delivery_sent.send_robust(
                sender=Delivery, delivery_id=entry.id, worker_id=workers[entry.id], by=actor
            )
        elif to == Status.FAILED:
            signals.delivery_failed.send_robust(
                sender=Delivery, delivery_id=entry.id, error=error, by=actor
            )
        elif to == Status.ABANDONED:
            signals.delivery_abandoned.send_robust(
                sender=Delivery, delivery_id=entry.id, worker_id=workers[entry.id]
            )


# -- operator actions (the admin calls these) ---------------------------------


def requeue(ids: Iterable[int], actor: str, *, send_now: bool = False) -> TransitionResult:
    """Send again: abandoned, failed and cancelled rows, with a fresh attempt budget.

    A row whose ``not_before`` (its ``send_at``) is still ahead keeps it: a
    cancelled newsletter requeued an hour early goes out at its hour. With
    ``send_now`` every row is due at once. A row whose email's content was
    cleared (``OUTBOX["CONTENT_RETENTION"]``, or a sensitive email) is refused:
    skipped as :data:`CONTENT_CLEARED`, never queued with nothing to send.
    """
    return transition(
        ids, transitions.REQUEUE_NOW if send_now else transitions.REQUEUE, actor=actor
    )


def requeue_now(ids: Iterable[int], actor: str) -> TransitionResult:
    """Send again at once, schedule or not: :func:`requeue` with ``send_now``."""
    return requeue(ids, actor, send_now=True)


def mark_sent(ids: Iterable[int], actor: str, evidence: str = "") -> TransitionResult:
    """The mail logs show the message left: an abandoned row becomes sent.

    ``evidence`` (what showed it: an ESP's event, say) is written on the
    attempt log's row of the decision.
    """
    return transition(ids, transitions.MARK_SENT, actor=actor, error=evidence)


# The actor of an ESP's tracking event (outbox.contrib.anymail.record_event): ``esp:<its name>``.
ESP_ACTOR = "esp:"


def esp_evidence(delivery_id: int, token: uuid.UUID) -> Attempt | None:
    """An ESP's event kept for the attempt under ``token``, if one came.

    The ESP's word that it has the message (:func:`outbox.contrib.anymail.record_event`): whoever
    decides that attempt's outcome settles it ``sent`` from this, never a
    retry (:func:`outbox.worker.outcomes.settle_from_evidence`,
    ``outbox.sweeper.sweep.Sweeper``).
    """
    return (
        Attempt.objects.filter(
            delivery_id=delivery_id, claim_token=token, actor__startswith=ESP_ACTOR
        )
        .order_by("pk")
        .first()
    )


def reported() -> Exists:
    """A row's current attempt has an ESP's event (a condition on ``Delivery``).

    In a transition's condition it is read after the rows are locked: an
    event is kept with its row locked (``outbox.contrib.anymail``), so it
    either committed before that read, or waits for the transition's commit.
    """
    return Exists(
        Attempt.objects.filter(
            delivery=OuterRef("pk"),
            claim_token=OuterRef("claim_token"),
            actor__startswith=ESP_ACTOR,
        )
    )


def evidenced(ids: Iterable[int]) -> list[int]:
    """Those of ``ids`` still ``processing`` whose current attempt has an ESP's event."""
    return list(
        Delivery.objects.filter(reported(), pk__in=list(ids), status=Status.PROCESSING).values_list(
            "pk", flat=True
        )
    )


def mark_failed(ids: Iterable[int], actor: str) -> TransitionResult:
    """The mail logs show it never left, and it should not be sent: failed."""
    return transition(ids, transitions.MARK_FAILED, actor=actor, error=f"marked failed by {actor}")


def cancel(ids: Iterable[int], actor: str) -> TransitionResult:
    """Never send: queued and abandoned rows become cancelled."""
    return transition(ids, transitions.CANCEL, actor=actor)
