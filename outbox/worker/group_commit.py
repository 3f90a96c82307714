"""Group commit: the sender threads of one worker process write their steps together.

A thread's step (the success of the message in hand and the claim of the next
one) is one commit. Alone, every email pays a round trip, a statement and a
WAL flush of its own, and on PostgreSQL that is most of what a delivery costs.
Threads that reach their step while another thread's step is being written
wait, and the next of them writes all of theirs at once: one statement (the
PL/pgSQL function ``outbox_steps``, ``STEPS_CALL``) or one transaction (SQLite,
or PostgreSQL without the functions), so one commit.

What does not change: a thread still hands its next message to the mail
server only after the commit that recorded its previous outcome and marked
the next row ``processing`` (each step's two conditional UPDATEs are the same
as alone; see ``sql.run_steps``). Outcomes are never held back to fill a
batch: a batch is whatever was waiting when the previous one finished, and a
thread that finds nobody writing writes at once. Only successes and claims go
this way; other outcomes take their own transaction (``loop.SenderLoop._settle_and_mark``).

The writer, whichever sender thread it is, writes on the worker process's
one step connection (:class:`StepConnection`): a process holds one
database session for its steps, not one per thread. If the transaction
fails, it failed for every step in it; the connection is dropped, and each
thread retries its own step, with the same tokens, as it would alone. If the
database refused the batch for good (``db.refused_for_good``: one step's
row it cannot store), the writer writes the batch's steps again one by one,
each its own commit, so that only the step refused gets the error, and its
thread settles it (``loop.SenderLoop._refused``); one bad row never fails
its neighbours' steps, however often they are retried.

Measured (the benchmark's no-op run, PostgreSQL at Django's defaults, 2 cores):
``--processes 2 --concurrency 16`` went from 1,855/s to 3,380/s, about 9
steps per commit; a batch of 16 costs the server about 75 us per step against
about 280 us for a step alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db import refused_for_good
from ..models import outbox_alias
from .sql import Step, StepResult, run_steps


class _Waiting:
    __slots__ = ("done", "error", "lead", "result", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.done = threading.Event()
        self.lead = False  # woken to write the next batch, not with a result
        self.result: StepResult | None = None
        self.error: BaseException | None = None


class GroupCommit:
    """Writes the steps of the threads that wait together, in one commit.

    One batch is written at a time. Its writer takes it from the queue when
    it starts writing, not when it is chosen: steps that arrive while it
    wakes up still go in. (Two writers at once made smaller batches and no
    faster deliveries, measured with the benchmark's no-op run.)
    """

    def __init__(self, write: Callable[[Sequence[Step]], list[StepResult]], limit: int) -> None:
        self._write = write  # sql.run_steps, in the writing thread
        self._limit = max(1, limit)
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._writing = False
        self.batches = 0
        self.steps = 0

    def run(self, step: Step) -> StepResult:
        """Write ``step`` (with whatever else is waiting) and return its result.

        Raises what the write raised (DatabaseError), for every step in the batch.
        """
        me = _Waiting(step)
        with self._lock:
            self._queue.append(me)
            lead = not self._writing
            self._writing = True
        if not lead:
            me.done.wait()
        if lead or me.lead:
            # Our step is first in the queue: nobody else takes from it now.
            self._write_batch()
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _write_batch(self) -> None:
        with self._lock:
            batch = self._queue[: self._limit]
            del self._queue[: self._limit]
        try:
            results = self._write([w.step for w in batch])
        except BaseException as exc:
            if len(batch) > 1 and refused_for_good(exc):
                self._write_one_by_one(batch)
            else:
                for w in batch:
                    w.error = exc
        else:
            for w, result in zip(batch, results, strict=True):
                w.result = result
        with self._lock:
            self.batches += 1
            self.steps += len(batch)
            following = self._queue[0] if self._queue else None
            if following is not None:
                # The first who waited writes the next batch, its own step in it.
                following.lead = True
            else:
                self._writing = False
        if following is not None:
            following.done.set()
        for w in batch:
            w.done.set()

    def _write_one_by_one(self, batch: list[_Waiting]) -> None:
        """A batch refused for good: each step alone, so that only the refused one fails."""
        for w in batch:
            try:
                w.result = self._write([w.step])[0]
            except BaseException as exc:
                w.error = exc


class StepConnection:
    """The worker process's one database session for its steps, whichever thread writes.

    One connection for every batch of this process: not one per sender
    thread, each opened (and its plans made) on the first batch that thread
    happened to write. On SQLite the writer also takes ``sqlite_write_lock``
    (``Worker.sqlite_write_lock``), the one the sender threads' own write
    transactions take.
    """

    def __init__(self, sqlite_write_lock: threading.Lock) -> None:
        self.sqlite_write_lock = sqlite_write_lock
        self._db: BaseDatabaseWrapper | None = None

    def write(self, steps: Sequence[Step]) -> list[StepResult]:
        """The group commit's write, on the step connection; one writer at a time."""
        db = self._connection()
        try:
            if db.vendor == "sqlite":
                with self.sqlite_write_lock:
                    return run_steps(steps, db)
            return run_steps(steps, db)
        except DatabaseError:
            # The next batch starts on a fresh connection.
            self.close()
            raise

    def _connection(self) -> BaseDatabaseWrapper:
        if self._db is None:
            db = connections.create_connection(outbox_alias())
            db.inc_thread_sharing()  # used by one writer at a time (GroupCommit)
            self._db = db
        return self._db

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(DatabaseError):
                db.close()
