"""State changes made outside the worker's hot path: by the sweeper and by operators.

Each call is one transaction. The rows to change are locked and read, then
changed with an UPDATE that repeats the same condition, so a row that moved on
meanwhile (a worker finished it, another sweeper got there first) is skipped,
never overwritten. Every change is written to the Attempt log with its actor,
and rows that become ``queued`` are pushed to Redis after the commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connections, router, transaction
from django.db.models import DateTimeField, Func, Q
from django.utils import timezone

from . import signals
from .exceptions import OutboxError
from .models import WORKER_ID_MAX_LENGTH, Attempt, Delivery
from .queue.entries import QueueEntry
from .queue.publish import publish

Status = Delivery.Status
Outcome = Attempt.Outcome

_CHUNK = 500


class TransactionNow(Func):
    """PostgreSQL's ``now()``: the time its transaction started, as the enqueue statements
    and the worker's due test read it (Django's ``Now()`` is the statement's time there)."""

    template = "now()"
    output_field = DateTimeField()


@dataclass
class TransitionResult:
    """What a transition changed, and why the other rows were left alone."""

    changed: list[int] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # current status -> count

    def __iadd__(self, other: TransitionResult) -> TransitionResult:
        self.changed += other.changed
        self.skipped.update(other.skipped)
        return self


def transition(
    ids: Iterable[int],
    *,
    allowed: Sequence[str],
    to: str,
    outcome: str,
    actor: str,
    error: str = "",
    condition: Q | None = None,
    updates: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> TransitionResult:
    """Move the rows among ``ids`` whose status is in ``allowed`` to ``to``.

    ``condition`` narrows the rows further (e.g. "still held by this dead
    worker"). ``updates`` are extra column values. Rows reaching ``queued``
    become due now unless ``updates`` says otherwise. ``now`` is the time to
    write (the sweeper passes Redis time, the one clock; operators' actions
    use this host's clock, except that on PostgreSQL "due now" is the
    database's ``now()``, the clock the worker's due test reads).
    """
    result = TransitionResult()
    id_list = list(dict.fromkeys(ids))
    for start in range(0, len(id_list), _CHUNK):
        result += _transition_chunk(
            id_list[start : start + _CHUNK],
            allowed=allowed,
            to=to,
            outcome=outcome,
            actor=actor,
            error=error,
            condition=condition,
            updates=updates or {},
            now=now or timezone.now(),
            database_due=now is None,
        )
    return result


def _transition_chunk(
    ids: list[int],
    *,
    allowed: Sequence[str],
    to: str,
    outcome: str,
    actor: str,
    error: str,
    condition: Q | None,
    updates: dict[str, Any],
    now: datetime,
    database_due: bool = False,
) -> TransitionResult:
    result = TransitionResult()
    using = router.db_for_write(Delivery)
    values = _new_values(to, error, updates, now)
    due_now = to == Status.QUEUED and "not_before" not in updates
    if due_now and database_due and connections[using].vendor == "postgresql":
        values["not_before"] = TransactionNow()

    with transaction.atomic(using=using):
        match = Q(pk__in=ids, status__in=list(allowed))
        if condition is not None:
            match &= condition
        rows = list(
            Delivery.objects.using(using)
            # A row locked right now is being settled by someone else (or by a
            # frozen worker inside its transaction): skip it, never wait on it.
            .select_for_update(skip_locked=True)
            .filter(match)
            .values_list("pk", "attempts", "priority", "worker_id")
        )
        if rows:
            _change_rows(
                using, match, rows, values, outcome=outcome, actor=actor, error=error, now=now
            )
        result.changed = [pk for pk, *_ in rows]
        _count_skipped(using, set(ids) - set(result.changed), result.skipped)
        if rows:
            when = values.get("not_before", now)
            # Due by the database's now(): due now by Redis' clock too.
            due = 0.0 if isinstance(when, TransactionNow) else when.timestamp()
            entries = [QueueEntry(pk, priority, due) for pk, _a, priority, _w in rows]
            workers = {pk: worker_id for pk, _a, _p, worker_id in rows}
            transaction.on_commit(
                partial(_after_commit, to, entries, workers, actor, error), using=using
            )
    return result


def _new_values(to: str, error: str, updates: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The column values a transition to ``to`` writes."""
    values: dict[str, Any] = {"status": to, "updated_at": now, **updates}
    if to == Status.QUEUED:
        values.setdefault("not_before", now)
        values.update(claim_token=None, worker_id="")
    if to == Status.SENT:
        values.setdefault("sent_at", now)
    if error and to in (Status.FAILED, Status.ABANDONED):
        values.setdefault("last_error", error)
    return values


def _change_rows(
    using: str,
    match: Q,
    rows: list[tuple[int, int, str, str]],
    values: dict[str, Any],
    *,
    outcome: str,
    actor: str,
    error: str,
    now: datetime,
) -> None:
    """Update the locked ``rows`` and log one Attempt each (inside the transaction)."""
    changed = (
        Delivery.objects.using(using).filter(match, pk__in=[pk for pk, *_ in rows]).update(**values)
    )
    if changed != len(rows):
        # The rows are locked, so this cannot happen on PostgreSQL or on
        # SQLite (one writer); roll back rather than log a wrong history.
        raise OutboxError(f"expected to change {len(rows)} rows, changed {changed}")
    Attempt.objects.using(using).bulk_create(
        Attempt(
            delivery_id=pk,
            number=attempts,
            worker_id=worker_id,
            started_at=now,
            finished_at=now,
            outcome=outcome,
            error=error,
            actor=actor[:WORKER_ID_MAX_LENGTH],
        )
        for pk, attempts, _priority, worker_id in rows
    )


def _count_skipped(using: str, others: set[int], skipped: Counter[str]) -> None:
    """Count the rows left alone by their current status; rows gone count as "deleted"."""
    if not others:
        return
    for (status,) in Delivery.objects.using(using).filter(pk__in=others).values_list("status"):
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


def requeue(ids: Iterable[int], actor: str) -> TransitionResult:
    """Send again: abandoned, failed and cancelled rows, with a fresh attempt budget."""
    return transition(
        ids,
        allowed=[Status.ABANDONED, Status.FAILED, Status.CANCELLED],
        to=Status.QUEUED,
        outcome=Outcome.REQUEUED,
        actor=actor,
        updates={"attempts": 0, "sent_at": None},
    )


def mark_sent(ids: Iterable[int], actor: str) -> TransitionResult:
    """The mail logs show the message left: an abandoned row becomes sent."""
    return transition(
        ids,
        allowed=[Status.ABANDONED],
        to=Status.SENT,
        outcome=Outcome.MARKED_SENT,
        actor=actor,
        updates={"last_error": ""},  # the attempt log keeps why it was abandoned
    )


def mark_failed(ids: Iterable[int], actor: str) -> TransitionResult:
    """The mail logs show it never left, and it should not be sent: failed."""
    return transition(
        ids,
        allowed=[Status.ABANDONED],
        to=Status.FAILED,
        outcome=Outcome.MARKED_FAILED,
        actor=actor,
        error=f"marked failed by {actor}",
    )


def cancel(ids: Iterable[int], actor: str) -> TransitionResult:
    """Never send: queued and abandoned rows become cancelled."""
    return transition(
        ids,
        allowed=[Status.QUEUED, Status.ABANDONED],
        to=Status.CANCELLED,
        outcome=Outcome.CANCELLED,
        actor=actor,
    )
