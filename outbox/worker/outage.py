"""When an outage of Redis or the database stops the worker, and the line that says why.

Without ``give_up_after`` the worker waits an outage out. With it
(``--give-up-after``, 30 s by default with ``--burst``) an outage that lasts
that long stops the worker: one error line naming what was unreachable, where
and why, and exit status :data:`EXIT_UNAVAILABLE` (1 when the database answers
but is not migrated). Whichever thread waits asks :meth:`GiveUp.outlasted`
(through ``process.Worker.outlasted``); the first one to give up speaks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from django.db import DatabaseError, connections

from ..db import database_address, database_problem
from ..models import outbox_alias
from ..queue.client import redis_address

logger = logging.getLogger("outbox.worker")

# The exit status of a worker that gave up on an unreachable Redis or
# database: EX_TEMPFAIL of sysexits.h ("try again later").
EXIT_UNAVAILABLE = 75


class GiveUp:
    """How long an outage may last before the worker stops, and whether it did.

    ``after``: seconds an outage of Redis or the database may last (None: the
    worker waits for ever). ``status``: once it gave up, its exit status.
    """

    def __init__(self, after: float | None, stop_event: threading.Event) -> None:
        self.after = after
        self.status: int | None = None
        self.stop_event = stop_event
        self._lock = threading.Lock()

    def outlasted(self, since: float, what: str, exc: BaseException | None, worker_id: str) -> bool:
        """Whether an outage of ``what`` that began at ``since`` stops the worker.

        True (once ``after`` has passed): the worker gives up, logging one
        error line that names what was unreachable, where, and why, and stops.
        """
        if self.after is None or time.monotonic() - since < self.after:
            return False
        with self._lock:
            first = self.status is None
            if first:
                self.status = EXIT_UNAVAILABLE  # until describe_outage() says which
        if first:
            message, self.status = describe_outage(what, exc, time.monotonic() - since)
            logger.error("worker %s giving up: %s", worker_id, message)
        self.stop_event.set()
        return True

    def wait_for_the_database(self, worker_id: str) -> None:
        """Before the threads start: the database answers, or the worker gives up.

        Only with ``after``: a burst run that finds no id in Redis would
        otherwise exit 0 without having asked the database at all.
        """
        since = time.monotonic()
        while not self.stop_event.is_set():
            db = connections[outbox_alias()]
            try:
                db.ensure_connection()
                return
            except DatabaseError as exc:
                with contextlib.suppress(DatabaseError):
                    db.close()
                if self.outlasted(since, "the database", exc, worker_id):
                    return
                logger.warning("cannot reach the database (%s); retrying", exc)
                self.stop_event.wait(1.0)


def describe_outage(what: str, exc: BaseException | None, lasted: float) -> tuple[str, int]:
    """The give-up line's text and the exit status, for an outage of ``what``."""
    why = f"{type(exc).__name__}: {exc}" if exc is not None else "no answer"
    if what == "the database":
        problem = database_problem(outbox_alias())
        if problem is not None and problem.kind == "not migrated":
            return str(problem), 1
        where = database_address(outbox_alias())
        return f"{where} unreachable for {lasted:.0f}s ({why})", EXIT_UNAVAILABLE
    if what == "the heartbeat lease":
        why = "no heartbeat reached it"
    return f"Redis ({redis_address()}) unreachable for {lasted:.0f}s ({why})", EXIT_UNAVAILABLE
