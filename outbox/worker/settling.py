"""Step 4 on its own: an outcome written alone, retried, settled after a refusal, or parked.

An outcome is written with the next row's claim when there is one (the step,
``loop.SenderLoop._settle_and_mark``); this is the rest of step 4:
which outcomes go through the group commit (:meth:`Settling.grouped`), the
outcome written on its own when no next row is ready (:meth:`Settling.alone`),
and what happens when the database will not take the write.

The database may refuse an outcome's write for good (``db.refused_for_good``:
a value too long, a NUL, a constraint, a site's trigger, whatever its code),
and retrying the same write would then keep a sender thread on one row for
ever. The rule, once: only errors of the connection, the session or the
server (a lost connection, a deadlock, a timeout, "database is locked") are
retried without end (:func:`persist`); every other error is a refusal.
After a refusal for good the row is settled with the least that can be
written (:func:`settle_refused`), in this order:

* a success: ``sent`` alone (the SENT statement, without the Attempt row
  that failed); if even that is refused, ``abandoned`` with why in
  ``last_error``: the server has the message, so it is never sent again
  without a person (under "review"; under "requeue" only as any in-doubt row);
* an attempt in doubt: ``abandoned``, as it would have been;
* any other outcome (nothing was handed over): ``failed``.

``last_error`` then holds the outcome's error and the database's refusal in
full, and the worker logs an ERROR naming the delivery. If that write is
refused too, the thread keeps the outcome aside and tries it again with a
growing pause while it goes on taking mail (:meth:`Settling.settle_parked`);
the row stays ``processing`` and its id in the processing list, so if the
worker stops first, the sweeper settles it like any row left mid-send.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError, transaction

from .. import transitions
from ..db import refused_for_good, storable
from ..models import Attempt, Delivery, outbox_alias
from . import rows, sql
from .backoff import drop_db_connection
from .host import WorkerHost
from .outcomes import Settlement, sent_but_not_ours, write_outcome
from .report import announce
from .sql import mark_sent

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status
Outcome = Attempt.Outcome

# How long a worker keeps retrying the final write after the database failed
# it during shutdown; after that the row stays `processing` for the sweeper.
FINALIZE_PATIENCE = 60.0


class Settling:
    """One sender thread's outcome in hand, and the outcomes it parked.

    ``ack`` is told the id of each row settled, for the thread's next claim
    to acknowledge.
    """

    def __init__(
        self, worker: WorkerHost, database: str, vendor: str, ack: Callable[[int], None]
    ) -> None:
        self.worker = worker
        self.database = database
        self.vendor = vendor
        self.ack = ack
        self.settlement: Settlement | None = None  # the outcome in hand, not yet written
        # Outcomes the database refused for good, and their settling too: each
        # tried again at its time (time.monotonic()), with its pause (outcomes.Settlement).
        self.parked: list[tuple[float, float, Settlement]] = []

    def grouped(self, s: Settlement | None) -> bool:
        """Nothing or a success to write: a step for the group commit."""
        return self.vendor in ("postgresql", "sqlite") and (
            s is None
            # A note or the ESP's message id is written on an Attempt row, and
            # companions with their own outcomes: see outcomes.write_outcome.
            or (
                s.outcome == Outcome.SENT
                and not s.error
                and not s.esp_message_id
                and not s.companions
            )
        )

    def group_step(
        self,
        s: Settlement | None,
        claim_id: int | None,
        token: uuid.UUID,
        now: datetime,
        known: int,
        worker_id: str,
    ) -> tuple[int, rows.MarkedRow | None]:
        settle = (s.delivery.pk, s.flight.token) if s is not None else None
        step = sql.Step(settle, claim_id, worker_id, token, now, known)
        changed, claimed = self.worker.group_commit.run(step)
        if s is not None and not changed:
            changed = sent_but_not_ours(s, now)
        return changed, claimed

    def alone(self) -> None:
        """Write the outcome in hand when there is no next row to share a commit with."""
        s = self.settlement
        if s is None:
            return

        def write() -> int:
            now = self.worker.clock.now()
            if self.grouped(s):
                # A success alone is a step with nothing to claim, so that a
                # sender thread needs no database connection of its own (at the
                # end of a burst run every thread writes its last one here).
                return self.group_step(s, None, s.flight.token, now, 0, self.worker.worker_id)[0]
            with transaction.atomic(using=self.database):
                return write_outcome(s, now, self.worker.push_quietly)

        changed = persist(
            write,
            s,
            self.worker.stop_event,
            drop_db_connection,
            self.worker.outlasted,
            settle=self._settle_refused,
        )
        self.settlement = None
        if changed is not None:
            self.settled(s, changed)
        elif s.refusal:
            self._park(s, 1.0)

    def _settle_refused(self, s: Settlement) -> int:
        return settle_refused(s, self.worker.clock.now())

    def _park(self, s: Settlement, delay: float) -> None:
        """Keep an outcome that nothing could settle aside, to try again in ``delay`` s.

        Its id stays unacknowledged in the processing list and its row
        ``processing``; if the worker stops first, the sweeper settles it.
        """
        self.parked.append((time.monotonic() + delay, delay, s))
        self.parked.sort(key=lambda parked: parked[0])

    def parked_due(self) -> bool:
        """Whether the first parked outcome's time has come."""
        return bool(self.parked) and self.parked[0][0] <= time.monotonic()

    def settle_parked(self) -> None:
        """Try the first parked outcome's settling write again (:func:`settle_refused`)."""
        _due, delay, s = self.parked.pop(0)
        try:
            changed = self._settle_refused(s)
        except DatabaseError as exc:
            drop_db_connection()
            if refused_for_good(exc):
                log_unsettled(s, exc)
            self._park(s, min(delay * 2, 300.0))
            return
        self.settled(s, changed)

    def settled(self, s: Settlement, changed: int) -> None:
        worker = self.worker
        announce(s, changed, worker.stats, worker.worker_id, worker.alarm)
        for companion in s.companions:  # not claimed from Redis: nothing to ack
            announce(companion, companion.changed, worker.stats, worker.worker_id, worker.alarm)
        self.ack(s.delivery.pk)
        if self.settlement is s:  # not a parked one
            self.settlement = None


def persist(
    write: Callable[[], int],
    s: Settlement,
    stop: threading.Event,
    drop: Callable[[], None],
    outlasted: Callable[[float, str, BaseException | None], bool] | None = None,
    settle: Callable[[Settlement], int] | None = None,
) -> int | None:
    """Run a settling write, retrying while the database is unreachable.

    The outcome is known (the mail server accepted the message, or refused
    it): writing it down is worth waiting for, so the thread retries until
    the database answers. Only during shutdown does it give up, after
    FINALIZE_PATIENCE seconds, or once the outage ``outlasted`` the worker's
    patience (``--give-up-after``); the row then stays ``processing`` and its
    id stays in the processing list, and the sweeper flags it once this worker
    is gone. A write refused for good is not retried: ``settle`` (which runs
    :func:`settle_refused`) writes the least instead, and if that is refused
    for good too, it gives up at once. Returns the rows changed, or None when
    it gave up.
    """
    started = time.monotonic()
    deadline = started + FINALIZE_PATIENCE
    delay = 0.2
    while True:
        try:
            return write()
        except DatabaseError as exc:
            drop()
            if refused_for_good(exc) and settle is not None:
                if s.refusal:  # the least was refused too
                    log_unsettled(s, exc)
                    return None
                refuse(s, exc)
                write = functools.partial(settle, s)
                continue
            gave_up = outlasted is not None and outlasted(started, "the database", exc)
            if gave_up or (stop.is_set() and time.monotonic() >= deadline):
                logger.error(
                    "could not record delivery %s (Message-ID %s) as %s: %s; the row "
                    "stays processing for the sweeper",
                    s.delivery.pk,
                    s.delivery.message_id,
                    s.outcome,
                    exc,
                )
                return None
            logger.warning(
                "database error recording delivery %s as %s (%s); retrying",
                s.delivery.pk,
                s.outcome,
                exc,
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def refuse(s: Settlement, exc: BaseException) -> None:
    """Note the database's refusal for good of ``s``'s write, and say so (an ERROR)."""
    s.refusal = storable(f"{type(exc).__name__}: {exc}")
    logger.error(
        "delivery %s (Message-ID %s): the database refused to record its outcome (%s) "
        "for good: %s; settling it with the least that can be written",
        s.delivery.pk,
        s.delivery.message_id,
        s.outcome,
        s.refusal,
    )


def log_unsettled(s: Settlement, exc: BaseException) -> None:
    logger.error(
        "delivery %s (Message-ID %s): the database refused to settle it as well (%s: %s); "
        "it stays processing, tried again later, or settled by the sweeper once this "
        "worker stops",
        s.delivery.pk,
        s.delivery.message_id,
        type(exc).__name__,
        exc,
    )


def settle_refused(s: Settlement, now: datetime) -> int:
    """Settle ``s``'s row after its outcome's write was refused for good; returns rows changed.

    What is tried, in order, is the module docstring's, for each row of the
    outcome (its companions too, in one transaction). Once written,
    ``s.outcome`` and ``s.error`` say what was. Raises ``DatabaseError``
    (refused for good again, or the connection's); nothing was written then.
    """
    with transaction.atomic(using=outbox_alias()):
        for companion in s.companions:
            companion.refusal = s.refusal
            companion.changed = _settle_refused_row(companion, now)
        return _settle_refused_row(s, now)


def _settle_refused_row(s: Settlement, now: datetime) -> int:
    delivery, token = s.delivery, s.flight.token
    why = f"the database refused to record the outcome ({s.outcome}) for good: {s.refusal}"
    with transaction.atomic(using=outbox_alias()):
        if s.outcome == Outcome.SENT:
            try:
                with transaction.atomic(
                    using=outbox_alias()
                ):  # a savepoint: its refusal leaves ours usable
                    changed = mark_sent(delivery.pk, token, now)
            except DatabaseError as exc:
                if not refused_for_good(exc):
                    raise
                why = f"{why}; then refused to record it as sent: {type(exc).__name__}: {exc}"
            else:
                return changed or int(
                    Delivery.objects.filter(
                        pk=delivery.pk, status=Status.SENT, claim_token=token
                    ).exists()
                )
            outcome = Outcome.AMBIGUOUS
            error = (
                f"accepted by the mail server (Message-ID {delivery.message_id}), but {why}: "
                "mark it sent"
            )
        elif s.outcome == Outcome.AMBIGUOUS:
            outcome, error = Outcome.AMBIGUOUS, f"{s.error}; {why}"
        else:
            outcome, error = Outcome.FAILED, f"{s.error}; {why}" if s.error else why
        change = transitions.IN_DOUBT if outcome == Outcome.AMBIGUOUS else transitions.FAILED
        error = storable(error)
        changed = change.apply(delivery.pk, token, now=now, error=error)
    s.outcome, s.error, s.refused = outcome, error, []
    return changed
