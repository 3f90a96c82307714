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

Why pushing too much is safe: an id in Redis is only a hint. A duplicate or
stale id is dropped by the claim UPDATE that finds its row not queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from django.db.models import Q, QuerySet

from ..conf import outbox_settings
from ..models import Delivery
from ..queue.clock import from_timestamp
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue

logger = logging.getLogger("outbox.sweeper")

BATCH = 1000
# Rows whose last change is this close to the previous pass are checked again,
# in case their transaction committed after that pass looked.
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
        first = "full_at" not in state
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
                self.queue.mirror_key, mapping={"full_at": now, "checked_until": now}
            )
            if first:
                logger.info("no mirror marker in Redis (first run, or Redis lost data): full check")
            pushed = self._full_check(overdue)
        else:
            since = float(state.get("checked_until", now)) - MIRROR_MARGIN
            recent = Q(updated_at__gte=from_timestamp(since)) | Q(pk__in=overdue | released)
            rows = Delivery.objects.queued().filter(recent)
            pushed = 0
            for batch in self._batches(rows):
                entries = [e for e in batch if e.id not in held or e.id in overdue]
                pushed += self.queue.push(entries)
        self.queue.redis.hset(self.queue.mirror_key, "checked_until", now)
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
            yield [QueueEntry(pk, prio, not_before.timestamp()) for pk, prio, not_before in batch]
            self.keep_lease()

    def _held_by_live_workers(self) -> set[int]:
        held: set[int] = set()
        for worker_id in self.queue.live_workers():
            held.update(self.queue.processing_ids(worker_id))
        return held
