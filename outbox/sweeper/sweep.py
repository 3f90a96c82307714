"""The sweeper: repair what dead workers and lost Redis data left behind.

The database is the truth; a pass makes Redis and the rows agree again:

1. **Dead workers.** A worker whose heartbeat is older than
   ``HEARTBEAT_TIMEOUT`` is declared dead (atomically, so it cannot come back
   under that id). For each id in its processing list, by the row's status:
   ``queued`` (it died before marking the row) goes back to its ready list;
   ``processing`` (it died inside the send window) follows ``ABANDONED_POLICY``;
   anything else is simply dropped. Then its list and entry are removed.
2. **Stuck rows.** Rows ``processing`` for longer than the timeout whose worker
   is not alive get the same policy, even when Redis lost every key: this
   covers Redis data loss and a "mark sent" write the database refused.
3. **The mirror.** Every queued row must be waiting in Redis: a full check
   (when Redis lost data, and periodically) or an incremental one; see
   ``mirror``.
4. **Settlement** (optional): ``OUTBOX["RECONCILERS"]`` are asked about the
   oldest abandoned rows, which are settled from their answers
   (``reconcile``).
5. **Content retention**: the content of settled mail is cleared after
   ``OUTBOX["CONTENT_RETENTION"]``, a sensitive email's at once; the rows stay
   (``retention``). Not while a worker of an earlier release is registered
   (a rolling upgrade: ``outbox.queue.reliable.RELEASE_LEVEL``), which would
   send a cleared email empty if an earlier release's requeue gave it one.
6. **Row retention** (optional): sent rows past an age are deleted in batches.

Rows that were processing when their worker died become ``abandoned`` under
``"review"`` (a person settles them: exactly once) or ``queued`` under
``"requeue"`` (at least once; the attempt counts, so a message that kills its
worker every time ends ``failed``).

Several sweepers may run at once (one per host): a lease in Redis lets one act
per pass, and every row change is a conditional update that is correct even
if two did act.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import F, Q
from django.utils import timezone
from redis.exceptions import RedisError

from .. import operations, transitions
from ..conf import outbox_settings
from ..db import database_address, database_problem
from ..models import Attempt, Delivery, Email, epoch, outbox_alias
from ..queue.client import redis_address
from ..queue.clock import from_timestamp
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue
from . import reconcile, retention
from .mirror import Mirror

logger = logging.getLogger("outbox.sweeper")

Status = Delivery.Status
Outcome = Attempt.Outcome

BATCH = 1000
ACTOR = "sweeper"


@dataclass
class SweepReport:
    """Counts of one pass; ``line()`` is what the command prints."""

    returned: int = 0  # claimed, never started: back to the ready list
    abandoned: int = 0
    requeued: int = 0
    failed: int = 0  # requeue policy, attempts exhausted
    remirrored: int = 0
    promoted: int = 0
    reaped: int = 0  # dead workers cleaned up
    purged: int = 0
    content_cleared: int = 0  # emails whose content the retention cleared
    reconciled_sent: int = 0  # abandoned rows a reconciler settled as sent
    reconciled_requeued: int = 0  # ... and requeued as never sent
    expired: int = 0  # queued rows past their expires_at, cancelled
    sent_by_esp: int = 0  # left mid-send, but the ESP's event for the attempt had come
    full_mirror_check: bool = False
    lock_held_elsewhere: bool = False
    # Why the pass could not be done (or finished): "redis", "database" (it
    # does not answer) or "not migrated"; None when it was done.
    failure: str | None = None
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        if self.lock_held_elsewhere:
            return "sweep: another sweeper holds the lock; nothing done"
        text = (
            f"{'sweep failed' if self.failure else 'sweep'}: returned to queue {self.returned}, marked abandoned {self.abandoned}, "
            f"requeued {self.requeued}, failed {self.failed}, re-mirrored {self.remirrored}, "
            f"promoted {self.promoted}, dead workers reaped {self.reaped}"
        )
        if self.content_cleared:
            text += f", content cleared {self.content_cleared}"
        if self.purged:
            text += f", purged {self.purged}"
        if self.reconciled_sent or self.reconciled_requeued:
            text += (
                f", settled by reconcilers: {self.reconciled_sent} sent, "
                f"{self.reconciled_requeued} requeued"
            )
        if self.expired:
            text += f", expired {self.expired}"
        if self.sent_by_esp:
            text += f", sent by the ESP's word {self.sent_by_esp}"
        text += f" ({'full' if self.full_mirror_check else 'incremental'} mirror check, "
        text += f"{self.seconds:.2f}s)"
        if self.errors:
            text += "; errors: " + "; ".join(self.errors)
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sweeper:
    def __init__(
        self,
        queue: RedisQueue | None = None,
        *,
        policy: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.queue = queue or RedisQueue()
        self.policy = policy or outbox_settings.ABANDONED_POLICY
        self.timeout = outbox_settings.HEARTBEAT_TIMEOUT if timeout is None else timeout
        self.lease = max(60.0, 4 * self.timeout)
        self._token = ""
        # The earlier release's workers the content retention last waited for (logged on change).
        self._waiting_for: list[str] = []

    def run_pass(
        self, *, full_mirror_check: bool = False, purge_sent_older_than: float | None = None
    ) -> SweepReport:
        """One pass of repairs; returns what it did."""
        report = SweepReport()
        started = time.monotonic()
        token = uuid.uuid4().hex
        try:
            if not self.queue.acquire_lock(token, self.lease):
                report.lock_held_elsewhere = True
                return report
        except RedisError as exc:
            # Without Redis we can neither tell live workers from dead ones nor
            # repair the mirror; the rows are safe in the database meanwhile.
            report.failure = "redis"
            report.errors.append(f"Redis ({redis_address()}) is unreachable: {_why(exc)}")
            logger.error("sweep skipped: %s", report.errors[-1])
            return report
        self._token = token
        try:
            self._reap_dead_workers(report)
            self._settle_stuck_rows(report)
            self._cancel_expired(report)
            self._reconcile(report)
            self._rebuild_mirror(report, force_full=full_mirror_check)
            report.promoted += self.queue.promote()
            self._clear_content(report)
            if purge_sent_older_than is not None:
                report.purged = self.purge_sent(purge_sent_older_than)
        except RedisError as exc:
            report.failure = "redis"
            report.errors.append(f"Redis ({redis_address()}) failed: {_why(exc)}")
            logger.error("sweep interrupted: %s", report.errors[-1])
        except DatabaseError as exc:
            # The next pass starts over on a fresh connection; every change is
            # a conditional update, so a half-done pass leaves nothing wrong.
            connections[outbox_alias()].close()
            self._database_failed(report, exc)
            logger.error("sweep interrupted: %s", report.errors[-1])
        finally:
            self._token = ""
            with contextlib.suppress(RedisError):  # the lease expires by itself
                self.queue.release_lock(token)
            report.seconds = time.monotonic() - started
        return report

    def _database_failed(self, report: SweepReport, exc: DatabaseError) -> None:
        """Say why the database failed the pass: it does not answer, or is not migrated."""
        alias = outbox_alias()
        problem = database_problem(alias)
        if problem is not None and problem.kind == "not migrated":
            report.failure = "not migrated"
            report.errors.append(str(problem))
        else:
            report.failure = "database"
            report.errors.append(f"{database_address(alias)} failed: {_why(exc)}")

    def _keep_lease(self) -> None:
        if self._token:
            self.queue.extend_lock(self._token, self.lease)

    # -- 1. dead workers --------------------------------------------------------

    def _reap_dead_workers(self, report: SweepReport) -> None:
        newly_dead = self.queue.declare_dead(self.timeout)
        if newly_dead:
            logger.warning("declared dead (no heartbeat for %.0fs): %s", self.timeout, newly_dead)
        # Also finishes workers a crashed sweeper declared dead but did not reap.
        for worker_id in self.queue.dead_workers():
            self._reap(worker_id, report)
            self._keep_lease()

    def _reap(self, worker_id: str, report: SweepReport) -> None:
        ids = self.queue.processing_ids(worker_id)
        rows = list(
            Delivery.objects.filter(pk__in=set(ids)).values(
                "pk", "status", "worker_id", "priority", "not_before", "email_id"
            )
        )
        back = [
            QueueEntry(row["pk"], row["priority"], epoch(row["not_before"]))
            for row in rows
            if row["status"] == Status.QUEUED
        ]
        in_window = [
            row["pk"]
            for row in rows
            if row["status"] == Status.PROCESSING and row["worker_id"] == worker_id
        ]
        if in_window:
            in_window += self._companions(rows, worker_id)
            self._apply_policy(in_window, Q(worker_id=worker_id), report, worker_id)
        self.queue.reap(worker_id, back)
        report.returned += len(back)
        report.reaped += 1
        logger.info(
            "reaped worker %s: %d ids held, %d returned to the queue, %d were mid-send",
            worker_id,
            len(ids),
            len(back),
            len(in_window),
        )

    def _companions(self, rows: Sequence[Mapping[str, Any]], worker_id: str) -> list[int]:
        """The rows the dead worker marked with those it claimed, for one ESP request.

        They are in no processing list (``outbox.mail.request``): found by their
        message and their worker, through the index of ``email_id``.
        """
        emails = {row["email_id"] for row in rows if row["status"] == Status.PROCESSING}
        held = {row["pk"] for row in rows}
        return [
            pk
            for pk in Delivery.objects.filter(
                email_id__in=emails, status=Status.PROCESSING, worker_id=worker_id
            ).values_list("pk", flat=True)
            if pk not in held
        ]

    # -- 2. rows stuck in processing ----------------------------------------------

    def _settle_stuck_rows(self, report: SweepReport) -> None:
        alive = list(self.queue.live_workers())
        # Redis time, like the workers' start times: one clock, whatever ours says.
        cutoff = from_timestamp(self.queue.time() - self.timeout)
        stuck = Q(status=Status.PROCESSING, processing_started_at__lt=cutoff) & ~Q(
            worker_id__in=alive
        )
        last = 0
        while True:
            ids = list(
                Delivery.objects.filter(stuck, pk__gt=last)
                .order_by("pk")
                .values_list("pk", flat=True)[:BATCH]
            )
            if not ids:
                return
            last = ids[-1]
            self._apply_policy(ids, stuck, report, None)
            self._keep_lease()

    def _apply_policy(
        self, ids: list[int], condition: Q, report: SweepReport, worker_id: str | None
    ) -> None:
        who = f"worker {worker_id}" if worker_id else "its worker"
        now = from_timestamp(self.queue.time())
        ids = self._settle_from_evidence(ids, condition, report, who, now)
        if not ids:
            return
        # An event kept after that look (its row locked) is read again under
        # the transition's lock: that row stays for the next pass, settled
        # ``sent`` from it, never requeued, failed or abandoned.
        condition &= ~Q(operations.reported())
        if self.policy == "requeue":
            result = operations.transition(
                ids,
                transitions.REQUEUE_DEAD,
                actor=ACTOR,
                now=now,
                error=f"{who} went away mid-send; requeued (the email may arrive twice)",
                condition=condition & Q(attempts__lt=F("max_attempts")),
            )
            report.requeued += len(result.changed)
            result = operations.transition(
                ids,
                transitions.FAIL_DEAD,
                actor=ACTOR,
                now=now,
                error=f"{who} went away mid-send on every attempt; giving up",
                condition=condition & Q(attempts__gte=F("max_attempts")),
            )
            report.failed += len(result.changed)
        else:
            result = operations.transition(
                ids,
                transitions.ABANDON,
                actor=ACTOR,
                now=now,
                error=(
                    f"{who} went away mid-send; check the mail logs for this Message-ID, "
                    "then mark it sent or requeue it"
                ),
                condition=condition,
            )
            report.abandoned += len(result.changed)
            if result.changed:
                logger.warning(
                    "marked %d deliveries abandoned for review: %s",
                    len(result.changed),
                    result.changed[:20],
                )

    def _settle_from_evidence(
        self, ids: list[int], condition: Q, report: SweepReport, who: str, now: Any
    ) -> list[int]:
        """Settle ``sent`` the rows whose attempt the ESP reported before ``who`` went away.

        Whatever the policy: the ESP has the message (``outbox.contrib.anymail.record_event``
        kept its event as the attempt's evidence), so it is never sent again.
        The row goes through ``abandoned`` (the operator's transitions, each
        in the attempt log). Returns the others.
        """
        settled = operations.evidenced(ids)
        if not settled:
            return ids
        operations.transition(
            settled,
            transitions.ABANDON,
            actor=ACTOR,
            now=now,
            error=f"{who} went away mid-send; its ESP had reported the message",
            condition=condition,
        )
        result = operations.mark_sent(
            settled, ACTOR, evidence="the ESP reported this attempt's message (its event above)"
        )
        report.sent_by_esp += len(result.changed)
        logger.info(
            "marked %d deliveries sent from their ESP's events: %s",
            len(result.changed),
            result.changed[:20],
        )
        return [pk for pk in ids if pk not in set(settled)]

    # -- settlement by the reconcilers ------------------------------------------

    def _reconcile(self, report: SweepReport) -> None:
        result = reconcile.reconcile(self.queue, self.policy)
        report.reconciled_sent += result.sent
        report.reconciled_requeued += result.requeued
        report.errors += result.errors
        self._keep_lease()

    # -- 2b. expired rows ------------------------------------------------------------

    def _cancel_expired(self, report: SweepReport) -> None:
        """Cancel queued rows past their ``expires_at``: at most BATCH per pass.

        One conditional UPDATE (still queued, still expired) with an Attempt
        row each; a worker that claims such a row meanwhile finds it expired
        in its own claim UPDATE, so either way it is never sent. Their ids
        left in Redis are dropped by the claim that finds them not queued.
        """
        now = from_timestamp(self.queue.time())
        expired = Q(expires_at__lte=now)
        ids = list(
            Delivery.objects.queued()
            .filter(expired)
            .order_by("expires_at")
            .values_list("pk", flat=True)[:BATCH]
        )
        if not ids:
            return
        error = f"expired: not sent before its expires_at; cancelled by the {ACTOR}"
        result = operations.transition(
            ids, transitions.EXPIRE, actor=ACTOR, now=now, error=error, condition=expired
        )
        report.expired += len(result.changed)

    # -- 3. the Redis mirror (mirror.Mirror) -----------------------------------------

    def _rebuild_mirror(self, report: SweepReport, force_full: bool) -> None:
        report.full_mirror_check, pushed = Mirror(self.queue, self._keep_lease).repair(force_full)
        report.remirrored += pushed

    # -- 5. content retention (its rules: retention.clear_content) --------------------

    def _clear_content(self, report: SweepReport) -> None:
        earlier = sorted(self.queue.earlier_releases())  # not by heartbeat: logged on change
        if earlier != self._waiting_for:
            self._waiting_for = earlier
            if earlier:
                logger.info(
                    "content retention waits: workers of an earlier release are running (%s); "
                    "they would send an email whose content is cleared empty",
                    ", ".join(earlier),
                )
            else:
                logger.info("content retention resumes: no worker of an earlier release is left")
        if not earlier:
            report.content_cleared = retention.clear_content(
                from_timestamp(self.queue.time()), self._keep_lease
            )

    # -- 6. row retention ---------------------------------------------------------------

    def purge_sent(self, older_than_days: float) -> int:
        """Delete sent rows (and their attempts) older than the age, in batches.

        Their content has usually gone long before (``retention.clear_content``): this is
        the retention of the rows themselves, evidence included.
        """
        cutoff = timezone.now() - timedelta(days=older_than_days)
        purged = 0
        while True:
            batch = list(
                Delivery.objects.filter(status=Status.SENT, sent_at__lt=cutoff).values_list(
                    "pk", "email_id"
                )[:BATCH]
            )
            if not batch:
                return purged
            Delivery.objects.filter(pk__in=[pk for pk, _ in batch]).delete()
            Email.objects.filter(
                pk__in={email_id for _, email_id in batch}, deliveries__isnull=True
            ).delete()
            purged += len(batch)
            self._keep_lease()


def _why(exc: BaseException) -> str:
    """An exception as one line: its class and its message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
