"""Step 4 of a sender thread: the outcome in hand, written alone, and the parked ones.

An outcome is written with the next row's claim when there is one (the step,
``loop.py``, ``SenderLoop._settle_and_mark``); this is the rest of step 4:
which outcomes go through the group commit (:meth:`Settling.grouped`), the
outcome written on its own when no next row is ready (:meth:`Settling.alone`),
and an outcome the database refused for good, parked and tried again at its
time until its least write (``outcomes.py``, ``settle_refused``) goes through.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError, transaction

from ..db import refused_for_good
from ..models import Attempt
from . import sql
from .backoff import drop_db_connection
from .host import WorkerHost
from .outcomes import (
    Settlement,
    log_unsettled,
    persist,
    sent_but_not_ours,
    settle_refused,
    write_outcome,
)
from .report import announce

Outcome = Attempt.Outcome


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
        # tried again at its time (time.monotonic()), with its pause (outcomes.py).
        self.parked: list[tuple[float, float, Settlement]] = []

    def grouped(self, s: Settlement | None) -> bool:
        """Nothing or a success to write: a step for the group commit."""
        return self.vendor in ("postgresql", "sqlite") and (
            s is None
            # A note or the ESP's message id is written on an Attempt row: see outcomes.py.
            or (s.outcome == Outcome.SENT and not s.error and not s.esp_message_id)
        )

    def group_step(
        self,
        s: Settlement | None,
        claim_id: int | None,
        token: uuid.UUID,
        now: datetime,
        known: int,
        worker_id: str,
    ) -> tuple[int, sql.ClaimedRow | None]:
        settle = (s.delivery.pk, s.started.token) if s is not None else None
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
                return self.group_step(s, None, s.started.token, now, 0, self.worker.worker_id)[0]
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
        """Try the first parked outcome's settling write again (``outcomes.settle_refused``)."""
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
        announce(s, changed, self.worker.stats, self.worker.worker_id)
        self.ack(s.delivery.pk)
        if self.settlement is s:  # not a parked one
            self.settlement = None
