"""One sender thread's loop: claim ids, mark a row, send it, settle it, repeat.

The loop reads as the protocol does (see the package docstring): each step is
one call into the room that owns it (``sql`` for the mark, ``gate`` for a
hold, ``attempt`` for the fenced hand-over and its outcome, ``outcomes`` and
``settling`` for the settle, ``backoff``); this holds their order and the
retries between them. Each claimed id is a delivery in flight
(:class:`~outbox.worker.inflight.InFlight`), which carries its own claim
token and marked row from the claim to the ack; its outcome names it
(``outcomes.Settlement.flight``).

What the thread keeps between deliveries, named once (:class:`SenderLoop`):

- ``pending``: the deliveries in flight claimed and not yet marked, first in
  line first (one whose mark failed goes back to the head, its token kept);
- ``acks``: the ids settled, held or dropped since the last claim, acked by
  the next claim (or the give-back);
- the outcome in hand, not yet settled: the ``settlement`` of ``settling``,
  its one owner (:class:`~outbox.worker.settling.Settling`, which also keeps
  the outcomes it parked);
- ``nonce``: the claim to repeat after a lost reply.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
from collections import deque
from contextlib import nullcontext

from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError, connections, transaction
from redis.exceptions import RedisError

from ..db import refused_for_good
from ..models import Attempt, Delivery, outbox_alias
from ..queue.entries import QueueEntry
from . import rows, sql
from .attempt import Sender, take_marked_row
from .backoff import Backoff, drop_db_connection, wait_idle
from .faults import fault
from .gate import Gate
from .host import WorkerHost
from .inflight import InFlight
from .outcomes import write_outcome
from .settling import Settling

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status
Outcome = Attempt.Outcome


class SenderLoop:
    """The claim-mark-send-settle loop of one thread of a :class:`Worker`."""

    # What the thread keeps between deliveries (the module docstring).
    pending: deque[InFlight]  # claimed, not yet marked: first in line first
    acks: list[int]  # settled, held or dropped since the last claim: acked by the next
    settling: Settling  # owns the outcome in hand (its settlement) and the parked ones
    nonce: str | None  # the claim to repeat after a lost reply

    def __init__(self, worker: WorkerHost, index: int, backend: BaseEmailBackend | None) -> None:
        self.worker = worker
        self.index = index
        self.pending = deque()
        self.acks = []
        # Claim tokens and nonces need to be unique, not secret: drawn from a
        # generator seeded once per thread, not from os.urandom() per email,
        # whose system call hands the GIL to another thread every time.
        self.random = random.Random(os.urandom(32))
        self.nonce = None
        # The incarnation this thread's claims were made under: once the
        # worker carries on as another, they are the sweeper's.
        self.worker_id = worker.worker_id
        self.pause = Backoff(worker)
        self.gate = Gate(worker)  # sending control: pauses, slowed domains, rate limits
        # Step 3: the mail connections (the default one, ``backend``, and one
        # per mailer) and the send under the lease.
        self.sender = Sender(worker, self.gate, backend)
        # The outbox's database, read once (a router's answer, then a
        # thread-local lookup, each time it is asked).
        self.database = outbox_alias()
        self.vendor = connections[self.database].vendor
        # Step 4: the outcome in hand, written alone when no next row is ready,
        # and the outcomes parked until the database takes them (settling.Settling).
        self.settling = Settling(worker, self.database, self.vendor, self._ack)

    def _ack(self, delivery_id: int) -> None:
        self.acks.append(delivery_id)

    def run(self) -> None:
        """Deliver until the worker stops; the last outcome and the give-back always run."""
        try:
            while not self.worker.stop_event.is_set():
                self._forget_claims_of_a_dead_incarnation()
                if self.settling.parked_due():
                    self.settling.settle_parked()
                if self.worker.incarnation().lease_left() <= 0:
                    self._wait_for_the_lease()
                    continue
                if not self.pending:
                    more = self._claim()
                    if more is None:
                        break
                    if not more:
                        continue
                if self.gate.paused():
                    self._hold_while_paused()
                    continue
                flight = self._mark(self.pending.popleft())
                if flight is None:
                    continue
                if self._held(flight):
                    continue
                self.settling.settlement = self.sender.deliver(flight)
                if self.worker.count_handled():
                    break
        finally:
            self._settle_alone()
            self._give_back()
            self.sender.close_mailers()

    def _wait_for_the_lease(self) -> None:
        """No heartbeat renewed the lease lately (Redis away, or we were frozen).

        A send would be refused: claiming or marking now would only churn rows
        through ``released`` and leave one ``processing`` for the sweeper to
        flag. Write the outcome in hand and wait; the ids in hand stay claimed.
        """
        self._settle_alone()
        self.pause.wait("the heartbeat lease", None)

    def _new_token(self) -> uuid.UUID:
        return uuid.UUID(int=self.random.getrandbits(128), version=4)

    # -- step 1: claim ----------------------------------------------------------

    def _claim(self) -> bool | None:
        """Claim more ids. True: got some; False: look again; None: nothing left to do."""
        want = self.worker.claim_size()
        if want <= 0:
            return None
        worker_id = self.worker.worker_id
        # A fresh nonce per claim; the same one again after an error, so that a
        # claim whose reply was lost hands back its ids instead of hiding them.
        self.nonce = self.nonce or self._new_token().hex
        try:
            result = self.worker.queue.claim(
                worker_id,
                want,
                thread=self.index,
                nonce=self.nonce,
                acks=self.acks,
                share=self.worker.concurrency,
            )
            # Read with the claim; a lost switch hash is restored here (same nonce
            # on a retry, so the ids of this claim are not lost either).
            switches = self.gate.observe(result.control) if result.registered else None
        except RedisError as exc:
            self._settle_alone()
            self.pause.wait("Redis", exc)
            return False
        self.nonce = None
        self.acks = []
        self.worker.clock.observe(result.now)
        self.pause.reset()
        if switches is None:
            self.worker.reincarnate(worker_id)
            return False
        if result.items:
            self.pending.extend(InFlight(c.id, c.priority) for c in result.items)
            fault("after_claim")
            return True
        if self.settling.settlement is not None:
            # Never wait with an outcome unwritten.
            sent = self.settling.settlement.outcome == Outcome.SENT
            self._settle_alone()
            if not sent or self.worker.burst:
                # Claim again: a retry or a release it pushed back may be due at once.
                return False
            # A success pushes nothing, so this claim's look still holds: wait
            # now. Its ack rides on the next claim (PROTOCOL.md: an id whose
            # row is sent may stay listed), a round trip saved per email
            # whenever sends are spread out.
        if self.worker.burst:
            return None
        self._idle(paused=switches.paused, next_due=result.next_due)
        return False

    def _idle(self, paused: bool = False, next_due: float | None = None) -> None:
        self.sender.idle(paused)
        wait_idle(self.worker, self.pause, paused, next_due)

    def _hold_while_paused(self) -> None:
        """Paused by the operator: write the outcome in hand, give back the claimed ids."""
        self._settle_alone()
        self._give_back()
        self._idle(paused=True)

    def _forget_claims_of_a_dead_incarnation(self) -> None:
        current = self.worker.worker_id
        if self.worker_id != current:
            # Declared dead: ids claimed under the old incarnation are the
            # sweeper's. A row whose claim may have committed is set back
            # first, so the sweeper does not flag a row that was never sent.
            # (An unwritten outcome is still ours: its token says so.)
            set_back, _kept = self._unclaim_pending()
            now = self.worker.clock.time()
            self.worker.push_quietly([QueueEntry(f.id, f.priority, now) for f in set_back])
            self.pending.clear()
            self.acks.clear()
            self.nonce = None
            self.worker_id = current

    # -- step 2 (with step 4 of the previous message): mark -----------------------

    def _mark(self, flight: InFlight) -> InFlight | None:
        """Write the previous outcome and mark ``flight`` processing, in one commit.

        Returns ``flight``, marked, to send; or None (a stale id, or the
        database is away and ``flight`` waits at the head of ``pending`` with
        its token).
        """
        flight.draw_token(self._new_token)
        # Read before the step: the row is marked under this incarnation's
        # name, and its send is fenced by that same name's lease, whose clock
        # runs while the step is blocked.
        flight.worker_id = self.worker.incarnation().worker_id
        try:
            changed, claimed = self._settle_and_mark(flight)
        except DatabaseError as exc:
            if refused_for_good(exc):
                return self._refused(flight, exc)
            # Keep the outcome and the token: if the transaction did commit,
            # the retry finds both rows already written under our tokens.
            self._again_later(flight, exc)
            return None
        self.pause.reset()
        s = self.settling.settlement
        if s is not None:
            self.settling.settled(s, changed)
        try:
            marked = take_marked_row(self.worker, flight, claimed)
        except DatabaseError as exc:
            # The step committed (the outcome is written), but reading what it
            # marked failed: this thread's own connection, which the step does
            # not use, may be one the server cut meanwhile. The retry, with
            # the same token, finds the row ours or skips it.
            self._again_later(flight, exc)
            return None
        if not marked:
            self.acks.append(flight.id)
            return None
        fault("after_mark_processing")
        return flight

    def _again_later(self, flight: InFlight, exc: DatabaseError) -> None:
        """The database failed ``flight`` mid-way: first in line again, with its token."""
        drop_db_connection()
        self.pending.appendleft(flight)
        self.pause.wait("the database", exc)

    def _refused(self, flight: InFlight, exc: DatabaseError) -> InFlight | None:
        """The step was refused for good (nothing of it was written): never retry it as it is.

        Which half was refused is not said: the outcome is written alone
        (settled as :meth:`Settling.alone` says if it is the one refused), then the
        mark is tried again alone, with the same token. A mark refused for
        good is dropped, with an ERROR: the row stays ``queued``, its id
        acknowledged (the mirror check pushes it again later), and this
        thread goes on.
        """
        if self.settling.settlement is not None:
            self._settle_alone()
            return self._mark(flight)
        logger.error(
            "delivery %s: the database refused to mark it processing (%s: %s); "
            "it stays queued, skipped by this thread",
            flight.id,
            type(exc).__name__,
            exc,
        )
        self.acks.append(flight.id)
        return None

    def _held(self, flight: InFlight) -> bool:
        """Whether a switch or a limit holds ``flight`` (set back to ``queued`` for later)."""
        try:
            held = self.gate.holds(flight)
        except DatabaseError as exc:
            # The hold's UPDATE failed: the row is still ours, and the
            # retry (same token) asks the gate again.
            self._again_later(flight, exc)
            return True
        if held:
            # Held until its domain or limit allows it: not an attempt.
            self.acks.append(flight.id)
        return held

    def _settle_and_mark(self, flight: InFlight) -> tuple[int, rows.MarkedRow | None]:
        """The settle of the outcome in hand and the mark of ``flight``, in one transaction.

        No outcome or a success goes through the group commit (``group_commit``);
        any other outcome through Django's atomic(). Raises DatabaseError when
        the database is away: the caller retries with the same outcome and token.
        """
        s = self.settling.settlement
        now = self.worker.clock.now()
        token, worker_id = flight.token, flight.worker_id
        if self.settling.grouped(s):
            known = self.worker.emails.recent()
            return self.settling.group_step(s, flight.id, token, now, known, worker_id)
        # SQLite: see Worker.sqlite_write_lock.
        one_writer = self.worker.sqlite_write_lock if self.vendor == "sqlite" else nullcontext()
        with one_writer, transaction.atomic(using=self.database):
            changed = write_outcome(s, now, self.worker.push_quietly) if s is not None else 0
            return changed, sql.mark_row(flight.id, worker_id, token, now)

    # -- step 4 on its own (settling.Settling), and giving back -------------------

    def _settle_alone(self) -> None:
        """Write the outcome in hand when there is no next row to share a commit with."""
        self.settling.alone()

    def _give_back(self) -> None:
        """Return claimed-but-unstarted ids to the ready lists (pause, shutdown, quota).

        What Redis or the database refuses stays in the processing list, for
        the mirror check or the sweeper (deregistering never deletes ids): an
        unwritten outcome, a claim that could not be undone.
        """
        if not self.pending and not self.acks:
            return
        _, kept = self._unclaim_pending()
        now = self.worker.clock.time()
        entries = [QueueEntry(f.id, f.priority, now) for f in self.pending if f not in kept]
        try:
            self.worker.queue.give_back(self.worker.worker_id, entries, acks=self.acks)
        except RedisError as exc:
            # It may have been applied (a lost reply): never repeat it, or its
            # acks could remove another thread's copy of a duplicate id. An id
            # still in our list is pushed by the mirror check (a queued row
            # held past the grace) or by the sweeper once we are gone.
            logger.warning(
                "could not give back %d claimed ids (%s); the sweeper will", len(entries), exc
            )
        self.pending = deque(kept)
        self.acks = []

    def _unclaim_pending(self) -> tuple[list[InFlight], list[InFlight]]:
        """Set back the rows a committed mark may hold: (flights set back, flights it could not).

        A flight whose mark was tried carries a token: its step may have
        committed unseen (the reply, or reading the row back, failed). Its id
        must not go back before its row is ``queued`` again: no worker would
        take it, and the sweeper would flag a row that was never sent.
        """
        set_back: list[InFlight] = []
        kept: list[InFlight] = []
        now = self.worker.clock.now()
        for flight in self.pending:
            if not flight.tried:
                continue
            try:
                if sql.unclaim(flight.id, flight.token, now):
                    set_back.append(flight)
            except DatabaseError as exc:
                drop_db_connection()
                logger.warning("delivery %s: cannot set its claim back yet (%s)", flight.id, exc)
                kept.append(flight)
        return set_back, kept
