"""Step 3 of a sweep: every queued row must be waiting in Redis.

The database decides the repair, not Redis' dedup set. A *full* check reads
what the ready lists, ``scheduled`` and the live workers' processing lists
really hold, pushes every queued row found in none of them (forced, whatever
the set says), and drops set entries that wait nowhere. It runs on the first
pass, after Redis lost data (the marker key vanished with it), when the set
counts more ids than the lists hold (partial loss), when asked, and once per
``MIRROR_FULL_SCAN_INTERVAL``. Otherwise the *incremental* check pushes the
rows that became queued since the last pass, gated by the set, so it adds no
id that is already waiting.

An id in a live worker's processing list counts as held, but only for a
while: a worker claims an id and marks its row within moments, unless an ack
was lost (a claim replayed after a lost reply, a push that failed while the
ack went through later). A queued row whose id stays in a live list longer
than ``HELD_GRACE`` is pushed as missing, and a row that leaves a list while
still queued is looked at by the next pass, however old its last change.

Which rows are "recent" is decided on one clock, the one their writers use:

- PostgreSQL: the database's. Every row that becomes queued outside a
  worker's list (an enqueue, an operator's or the sweeper's transition)
  gets ``updated_at = now()`` from the server (``outbox.statements.postgresql``,
  ``operations.transition``), and each pass reads ``SELECT now()`` at its
  start into the marker. The web hosts write these rows and may be unable to
  reach Redis at that moment (the push that failed is why the check exists),
  but never the database; a slow web host's clock plays no part. The rows a
  worker puts back (retries, releases) carry Redis time, but their ids stay
  in its list until pushed, so the held watch above finds them, whatever
  their time.
- SQLite has no server clock: a row's times are the clock of the process
  that wrote it. So the marker keeps, besides Redis time, the highest
  Delivery and Attempt ids it saw: a row enqueued since has a higher id,
  and a row an operator or the sweeper moved since has a newer Attempt row.
  SQLite has one writer at a time, which holds its lock from the first write
  to the commit, so the ids become visible in the order they are given: no
  margin is needed, and no clock.

Why pushing too much is safe: an id in Redis is only a hint. A duplicate or
stale id is dropped by the claim UPDATE that finds its row not queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.db.models import Max, Q, QuerySet

from ..conf import outbox_settings
from ..db import database_time
from ..models import Attempt, Delivery, epoch, outbox_alias
from ..queue.clock import from_timestamp
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue

logger = logging.getLogger("outbox.sweeper")

BATCH = 1000
# Rows whose last change is this close to the previous pass are checked again,
# in case their transaction committed after that pass looked (PostgreSQL:
# now() is the time a transaction started, not the time it committed).
MIRROR_MARGIN = 60.0


def held_grace() -> float:
    """How long a queued row's id may sit in a live processing list before it counts as missing.

    Pushing it early is harmless (a duplicate), only wasteful: a worker marks
    what it claims within a few sends.
    """
    return 2 * outbox_settings.HEARTBEAT_TIMEOUT


class Mirror:
    """The mirror repair of one sweep pass; ``keep_lease`` is called between batches."""

    def __init__(self, queue: RedisQueue, keep_lease: Callable[[], None]) -> None:
        self.queue = queue
        self.keep_lease = keep_lease

    def repair(self, force_full: bool) -> tuple[bool, int]:
        """Check the mirror; returns whether the check was full and how many ids it pushed."""
        state = self.queue.mirror_state()
        now = self.queue.time()
        # Read before any row is: what commits after this is the next pass's.
        marks = _marks()
        # No marker (or one of an older version, without this database's marks).
        first = "full_at" not in state or not marks.keys() <= state.keys()
        full = (
            force_full
            or first
            or now - float(state["full_at"]) > outbox_settings.MIRROR_FULL_SCAN_INTERVAL
            or self.queue.set_exceeds_lists()
        )
        held, overdue, released = self._watch_held(now)
        if full:
            # Written first: if Redis loses its data during the scan, the marker
            # goes with it and the next pass checks everything again.
            self.queue.redis.hset(
                self.queue.mirror_key, mapping={"full_at": now, "checked_until": now, **marks}
            )
            if first:
                logger.info("no mirror marker in Redis (first run, or Redis lost data): full check")
            pushed = self._full_check(overdue)
        else:
            recent = _changed_since(state, marks) | Q(pk__in=overdue | released)
            rows = Delivery.objects.queued().filter(recent)
            pushed = 0
            for batch in self._batches(rows):
                entries = [e for e in batch if e.id not in held or e.id in overdue]
                pushed += self.queue.push(entries)
        self.queue.redis.hset(self.queue.mirror_key, mapping={"checked_until": now, **marks})
        if pushed:
            logger.warning("re-mirrored %d queued deliveries Redis did not hold", pushed)
        return full, pushed

    def _watch_held(self, now: float) -> tuple[set[int], set[int], set[int]]:
        """Ids in live processing lists; queued ones held past the grace; ones let go.

        Returns (held, overdue, released): ``overdue`` are queued rows whose id
        has been in a live list for longer than :func:`held_grace`, ``released``
        queued rows watched at the last pass whose id has left every list.
        """
        held = self._held_by_live_workers()
        before = self.queue.held_watch()
        queued_held = (
            set(Delivery.objects.queued().filter(pk__in=held).values_list("pk", flat=True))
            if held
            else set()
        )
        watch = {pk: before.get(pk, now) for pk in queued_held}
        self.queue.set_held_watch(watch)
        overdue = {pk for pk, since in watch.items() if now - since > held_grace()}
        if overdue:
            logger.warning(
                "%d queued deliveries sat in a live worker's list for over %.0fs: pushed again",
                len(overdue),
                held_grace(),
            )
        return held, overdue, set(before) - held

    def _full_check(self, overdue: set[int]) -> int:
        """Make Redis hold every queued row, trusting only what its lists hold.

        What is read first (ready lists, ``scheduled``, live processing lists)
        is compared with the database; a row missing from all of them is
        pushed, forced. An id pushed by someone else meanwhile may end up
        twice: harmless. Set entries that wait nowhere are dropped last.
        """
        # The lists first, the live workers' lists after: an id claimed between
        # the two reads is seen in one of them, not missed by both.
        present = self.queue.waiting_ids()
        held = self._held_by_live_workers() - overdue
        queued: set[int] = set()
        pushed = 0
        for batch in self._batches(Delivery.objects.queued()):
            queued.update(e.id for e in batch)
            missing = [e for e in batch if e.id not in present and e.id not in held]
            if missing:
                self.queue.push(missing, force=True)
                pushed += len(missing)
        stale = sorted(self.queue.queued_set() - present - queued)
        if stale:
            dropped = self.queue.forget_stale(stale)
            logger.info("dropped %d ids from the dedup set that waited nowhere", dropped)
        return pushed

    def _batches(self, rows: QuerySet[Delivery]) -> Iterator[list[QueueEntry]]:
        """The rows' queue entries, BATCH at a time, keeping the lease."""
        last = 0
        while True:
            batch = list(
                rows.filter(pk__gt=last)
                .order_by("pk")
                .values_list("pk", "priority", "not_before")[:BATCH]
            )
            if not batch:
                return
            last = batch[-1][0]
            # epoch(), not timestamp(): a naive not_before (USE_TZ = False) is
            # read with its fold, never as the first of a repeated hour.
            yield [QueueEntry(pk, prio, epoch(not_before)) for pk, prio, not_before in batch]
            self.keep_lease()

    def _held_by_live_workers(self) -> set[int]:
        held: set[int] = set()
        for worker_id in self.queue.live_workers():
            held.update(self.queue.processing_ids(worker_id))
        return held


def _marks() -> dict[Any, float]:
    """What this pass records for the next one's window, besides Redis time.

    PostgreSQL: the database's clock (epoch seconds). SQLite: the highest
    Delivery and Attempt ids (see the module docstring).
    """
    db_time = database_time(outbox_alias())
    if db_time is not None:
        return {"checked_until_db": db_time}
    highest = Delivery.objects.aggregate(pk=Max("pk"))["pk"] or 0
    attempt = Attempt.objects.aggregate(pk=Max("pk"))["pk"] or 0
    return {"delivery_pk": highest, "attempt_pk": attempt}


def _changed_since(state: dict[str, str], marks: dict[Any, float]) -> Q:
    """Rows written since the previous pass looked, each on its writer's clock."""
    if "checked_until_db" in marks:
        since = float(state["checked_until_db"]) - MIRROR_MARGIN
        return Q(updated_at__gte=from_timestamp(since))
    # SQLite. Redis time covers what the worker and the sweeper wrote (with
    # RedisClock); the ids cover every enqueue and every transition, whatever
    # the clock of the host that made them.
    since = float(state["checked_until"]) - MIRROR_MARGIN
    moved = Attempt.objects.filter(pk__gt=int(state["attempt_pk"])).values("delivery_id")
    return (
        Q(updated_at__gte=from_timestamp(since))
        | Q(pk__gt=int(state["delivery_pk"]))
        | Q(pk__in=moved)
    )
