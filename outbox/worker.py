"""The worker: take ids from Redis, mark each row processing, send, then settle it.

For each message, in this order (``../shared/seeds/000``):

1. claim ids from Redis into this worker's processing list (one round trip,
   which also acknowledges the ids finished since the last claim);
2. mark the row ``processing`` with one conditional ``UPDATE ... RETURNING``
   (``status='queued'`` and due), which records the worker, a fresh claim
   token and the start time on the row itself. If no row changed, the id was
   stale or a duplicate: it is dropped, nothing is sent;
3. hand the message to the delivery backend;
4. mark the row ``sent`` with an UPDATE that matches this attempt's claim
   token, or requeue it with backoff, or mark it ``failed`` (writing the
   attempt's Attempt row in the same transaction).

Step 4 of one message and step 2 of the next are written in one transaction
(on PostgreSQL, one statement): one commit per email. The outcome of a message
is still durable before the next one is handed to the backend, so only the
message in hand is ever in doubt; when no next id is ready, the outcome is
written on its own before the thread waits.

Why this order is safe: the database row, not Redis, decides who may send. A
crash before step 2 leaves a queued row (the sweeper pushes it back); a crash
between 2 and 4 leaves a ``processing`` row, the only state in doubt, for the
sweeper to flag; an id that Redis holds twice can pass step 2 only once. Step 4
matches the claim token, so a late worker can never overwrite another attempt.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import signal
import smtplib
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any, NamedTuple

from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone
from redis.exceptions import RedisError

from . import signals
from .backends import get_delivery_connection
from .conf import outbox_settings
from .db import binding_cursor
from .exceptions import DeliveryError
from .message import build_message
from .models import Attachment, Attempt, Delivery, Email
from .queue import Claimed, QueueEntry, RedisQueue

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status
Outcome = Attempt.Outcome

# Fault injection for the crash tests and the chaos run: with
# OUTBOX_FAULT_POINT=<point> the worker stops itself (SIGSTOP) at that point of
# its loop, so that a test can SIGKILL it (or break its database connection)
# exactly there; OUTBOX_FAULT_COUNT=<n> limits how many times. Points:
# after_claim, after_mark_processing, after_send, after_mark_sent.
_FAULT_POINT = os.environ.get("OUTBOX_FAULT_POINT", "")
_fault_budget = [int(os.environ.get("OUTBOX_FAULT_COUNT", "-1"))]


def _fault(point: str) -> None:
    if point == _FAULT_POINT and _fault_budget[0] != 0:
        _fault_budget[0] -= 1
        os.kill(os.getpid(), signal.SIGSTOP)


# How long a worker keeps retrying the final write after the database failed
# it; after that the row stays `processing` and the sweeper flags it.
FINALIZE_PATIENCE = 60.0
EMAIL_CACHE_SIZE = 256


def default_worker_id() -> str:
    """Host, pid and a random suffix: unique on every start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: between half and all of base * 2**(n-1), capped."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def is_permanent(exc: BaseException) -> bool:
    """Whether a send error means "never retry" (a 5xx refusal, an invalid address).

    Connection-level 5xx answers (authentication, greeting) are configuration
    problems, not this message's fault, so they stay transient.
    """
    if isinstance(exc, DeliveryError):
        return exc.permanent
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _msg in exc.recipients.values()]
        return bool(codes) and all(500 <= code < 600 for code in codes)
    if isinstance(exc, (smtplib.SMTPSenderRefused, smtplib.SMTPDataError)):
        return 500 <= exc.smtp_code < 600
    if isinstance(exc, smtplib.SMTPException | OSError):
        return False
    # Django raises ValueError for an address it cannot encode or parse.
    return isinstance(exc, ValueError | UnicodeError)


@dataclass
class Stats:
    """Counters for the periodic summary line."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    skipped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)

    def take(self) -> tuple[int, int, int, int]:
        with self.lock:
            values = (self.sent, self.retried, self.failed, self.skipped)
            self.sent = self.retried = self.failed = self.skipped = 0
            return values


@dataclass
class Settlement:
    """The outcome of one attempt, waiting to be written (step 4)."""

    started: Started
    outcome: str  # an Attempt.Outcome: sent, retry, failed or released
    error: str = ""
    retry_at: datetime | None = None
    permanent: bool = False

    @property
    def delivery(self) -> Delivery:
        return self.started.delivery


@dataclass
class Started:
    """A row this worker marked processing: what it needs to send and settle it."""

    delivery: Delivery
    email: Email
    attachments: list[Attachment]
    token: uuid.UUID
    started: float  # time.monotonic() when marked processing
    generation: int


class Worker:
    """Deliver outbox mail until stopped (or, with ``burst``, until nothing is due).

    ``concurrency`` threads each claim and send on their own delivery connection
    and database connection; one more thread writes the heartbeat.
    """

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        burst: bool = False,
        max_messages: int | None = None,
        queue: RedisQueue | None = None,
        summary_interval: float = 60.0,
        progress: Callable[[int, float], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.burst = burst
        self.max_messages = max_messages
        self.queue = queue or RedisQueue()
        self.summary_interval = summary_interval
        self.progress = progress
        self.stop_event = threading.Event()
        self.stats = Stats()
        self.delivered_total = 0
        self._handled = 0
        self._handled_lock = threading.Lock()
        # Bumped when the sweeper declared this worker dead and it re-registered:
        # ids claimed under an older generation are the sweeper's now.
        self.generation = 0
        self._emails: OrderedDict[int, tuple[Email, list[Attachment]]] = OrderedDict()
        self._emails_lock = threading.Lock()
        self._sigint_count = 0

    # -- life cycle ---------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> int:
        """Run until stopped; returns the process exit status (0 on a clean stop)."""
        if install_signal_handlers:
            self._install_signal_handlers()
        self._register()
        logger.info(
            "worker %s started: concurrency %d%s",
            self.worker_id,
            self.concurrency,
            ", burst" if self.burst else "",
        )
        heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="outbox-heartbeat", daemon=True
        )
        heartbeat.start()
        threads = [
            threading.Thread(target=self._thread_main, name=f"outbox-sender-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        last_summary = time.monotonic()
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=0.2)
            if time.monotonic() - last_summary >= self.summary_interval:
                self._log_summary(time.monotonic() - last_summary)
                last_summary = time.monotonic()
        self.stop_event.set()
        heartbeat.join(timeout=5)
        self._log_summary(time.monotonic() - last_summary)
        self._deregister()
        logger.info(
            "worker %s stopped after %.1fs: %d delivered",
            self.worker_id,
            time.monotonic() - started,
            self.delivered_total,
        )
        return 0

    def stop(self) -> None:
        """Ask every thread to finish the message in hand and exit."""
        self.stop_event.set()

    def _install_signal_handlers(self) -> None:
        def graceful(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT:
                self._sigint_count += 1
                if self._sigint_count > 1:
                    logger.warning("second interrupt: exiting at once")
                    os._exit(130)
            logger.info(
                "%s: finishing the messages in hand, then exiting", signal.Signals(signum).name
            )
            self.stop()

        signal.signal(signal.SIGTERM, graceful)
        signal.signal(signal.SIGINT, graceful)

    def _register(self) -> None:
        while True:
            try:
                self.queue.register(self.worker_id)
                return
            except RedisError as exc:
                logger.warning("cannot register with Redis (%s); retrying", exc)
                if self.stop_event.wait(1.0):
                    return

    def _deregister(self) -> None:
        try:
            self.queue.release(self.worker_id, [], deregister=True)
        except RedisError as exc:
            # The sweeper will find the stale heartbeat and clean up after us.
            logger.warning("could not deregister from Redis: %s", exc)

    def _heartbeat_loop(self) -> None:
        interval = outbox_settings.HEARTBEAT_INTERVAL
        while not self.stop_event.wait(interval):
            try:
                alive = self.queue.heartbeat(self.worker_id)
            except RedisError as exc:
                logger.warning("heartbeat failed: %s", exc)
                continue
            if not alive:
                old = self.worker_id
                self.generation += 1
                self.worker_id = default_worker_id()
                logger.warning(
                    "worker %s was declared dead (or Redis lost its entry); its claims are "
                    "the sweeper's now; continuing as %s",
                    old,
                    self.worker_id,
                )
                self._register()

    def _log_summary(self, elapsed: float) -> None:
        sent, retried, failed, skipped = self.stats.take()
        if sent or retried or failed or skipped:
            logger.info(
                "%s: %d sent (%.1f/s), %d retried, %d failed, %d stale ids skipped in %.0fs",
                self.worker_id,
                sent,
                sent / max(elapsed, 1e-9),
                retried,
                failed,
                skipped,
                elapsed,
            )

    def _count_handled(self) -> bool:
        """Count one finished message; True when --max-messages is reached."""
        with self._handled_lock:
            self._handled += 1
            if self.max_messages is not None and self._handled >= self.max_messages:
                self.stop_event.set()
                return True
        return False

    def _quota_left(self) -> int | None:
        if self.max_messages is None:
            return None
        with self._handled_lock:
            return max(0, self.max_messages - self._handled)

    # -- one sender thread -------------------------------------------------------

    def _thread_main(self) -> None:
        backend: BaseEmailBackend | None = None
        try:
            backend = get_delivery_connection()
            self._sender_loop(backend)
        except Exception:
            logger.exception("sender thread crashed")
            self.stop_event.set()
        finally:
            if backend is not None:
                _close_quietly(backend)
            connection.close()

    def _sender_loop(self, backend: BaseEmailBackend) -> None:
        """Claim, mark, send; each outcome is committed with the next row's claim.

        After a send, the outcome (``Settlement``) is written in the same
        transaction that marks the next row ``processing``: one commit per
        email instead of two, and still only the message in hand is ever in
        doubt, because the outcome of message k is durable before message k+1
        is handed to the backend. When no next id is ready at once, the
        outcome is written on its own before the thread waits.
        """
        pending: deque[Claimed] = deque()
        acks: list[int] = []
        tokens: dict[int, uuid.UUID] = {}
        generation = self.generation
        backend_open = False
        pause = _Backoff()
        batch = outbox_settings.CLAIM_BATCH
        settlement: Settlement | None = None
        while not self.stop_event.is_set():
            if generation != self.generation:
                # Declared dead: ids claimed under the old id are the sweeper's.
                # (An unwritten outcome is still ours to write: its token says so.)
                pending.clear()
                acks.clear()
                generation = self.generation
            if not pending:
                quota = self._quota_left()
                want = batch if quota is None else min(batch, quota)
                if want <= 0:
                    break
                try:
                    worker_id = self.worker_id
                    claimed = self.queue.claim(worker_id, want, acks=acks)
                    acks = []
                    if not claimed and settlement is not None:
                        # Never wait with an outcome unwritten; then claim again,
                        # since a retry it pushes back may be due at once.
                        self._settle_alone(settlement, acks)
                        settlement = None
                        continue
                    if not claimed and not self.burst:
                        if backend_open:
                            # Idle: close rather than let the server time us out mid-send.
                            _close_quietly(backend)
                            backend_open = False
                        one = self.queue.wait_claim(worker_id, outbox_settings.BLOCK_TIMEOUT)
                        claimed = [one] if one else []
                    pause.reset()
                except RedisError as exc:
                    self._settle_alone(settlement, acks)
                    settlement = None
                    pause.wait(self.stop_event, "Redis", exc)
                    continue
                if not claimed:
                    if self.burst:
                        break
                    continue
                pending.extend(claimed)
                _fault("after_claim")

            item = pending.popleft()
            token = tokens.pop(item.id, None) or uuid.uuid4()
            try:
                changed, started = self._settle_and_mark(settlement, item, generation, token)
            except DatabaseError as exc:
                # Keep the outcome and the token: if the transaction did commit,
                # the retry finds both rows already written under our tokens.
                _drop_db_connection()
                pending.appendleft(item)
                tokens[item.id] = token
                pause.wait(self.stop_event, "the database", exc)
                continue
            pause.reset()
            if settlement is not None:
                self._settled(settlement, changed)
                acks.append(settlement.delivery.pk)
                settlement = None
            if started is None:
                acks.append(item.id)
                continue
            _fault("after_mark_processing")
            if not backend_open:
                try:
                    backend.open()
                    backend_open = True
                except Exception as exc:
                    # Cannot reach the mail server: this attempt is a transient failure.
                    settlement = self._failure(started, exc)
                    self._after_message()
                    continue
            settlement = self._send(started, backend)
            if settlement.outcome not in (Outcome.SENT, Outcome.RELEASED):
                _close_quietly(backend)
                backend_open = False
            if self._after_message():
                break

        self._settle_alone(settlement, acks)
        self._give_back(pending, acks)

    def _after_message(self) -> bool:
        done = self._count_handled()
        if self.progress is not None:
            self.progress(self.delivered_total, time.monotonic())
        return done

    def _give_back(self, pending: deque[Claimed], acks: list[int]) -> None:
        """Return claimed-but-unstarted ids to the ready lists (shutdown, quota)."""
        if not pending and not acks:
            return
        entries = [QueueEntry(c.id, c.priority, time.time()) for c in pending]
        try:
            self.queue.release(self.worker_id, entries, acks=acks)
        except RedisError as exc:
            # They stay in our processing list; the sweeper returns them once
            # this worker's heartbeat is gone.
            logger.warning("could not give back %d claimed ids: %s", len(entries), exc)

    # -- the database steps -----------------------------------------------------

    def _settle_and_mark(
        self, settlement: Settlement | None, item: Claimed, generation: int, token: uuid.UUID
    ) -> tuple[int, Started | None]:
        """Step 4 of the previous message and step 2 of the next, in one transaction.

        Returns how many rows the outcome's UPDATE changed (0 without an
        outcome) and the next row, or None if its id was stale. Raises
        DatabaseError when the database is away; the caller retries with the
        same outcome and ``token``.

        On PostgreSQL the common case (no outcome, or a success) is a single
        statement run in autocommit, which PostgreSQL executes atomically: one
        round trip and one commit per email (``_step_postgresql``).
        """
        now = timezone.now()
        if connection.vendor == "postgresql" and (
            settlement is None or settlement.outcome == Outcome.SENT
        ):
            changed, claimed = _step_postgresql(
                settlement, item.id, self.worker_id, token, now, self._recent_email()
            )
            if settlement is not None and not changed:
                changed = self._sent_but_not_ours(settlement, now)
        else:
            with transaction.atomic():
                changed = self._write_outcome(settlement) if settlement is not None else 0
                claimed = _claim_row(item.id, self.worker_id, token, now)
        return changed, self._started(item, generation, token, now, claimed)

    def _settle_alone(self, settlement: Settlement | None, acks: list[int]) -> None:
        """Write an outcome that has no next row to share a commit with."""
        if settlement is None:
            return

        def write() -> int:
            with transaction.atomic():
                return self._write_outcome(settlement)

        changed = self._persist(write, settlement.delivery, settlement.outcome)
        if changed is not None:
            self._settled(settlement, changed)
            acks.append(settlement.delivery.pk)

    def _started(
        self,
        item: Claimed,
        generation: int,
        token: uuid.UUID,
        now: datetime,
        claimed: _ClaimedRow | None,
    ) -> Started | None:
        """What step 2's conditional UPDATE gave us; None means a stale id: drop it.

        The UPDATE left the row naming this worker, the claim token and the
        start time, which is all the evidence the sweeper needs if we die
        before step 4.
        """
        # No close_old_connections() anywhere here: with CONN_MAX_AGE=0 it would
        # open a new connection for every email. The connection lives as long
        # as the thread and is dropped only after a DatabaseError.
        if claimed is None:
            owned = Delivery.objects.filter(
                pk=item.id, status=Status.PROCESSING, claim_token=token
            ).first()
            if owned is None:
                self._reschedule_if_early(item, now)
                self.stats.add("skipped")
                return None
            # Our earlier UPDATE committed; its reply was lost.
            claimed = _ClaimedRow(owned, None, False)
        delivery = claimed.delivery
        if claimed.email is not None:
            email, attachments = self._remember_email(claimed.email, claimed.has_attachments)
        else:
            email, attachments = self._email(delivery.email_id)
        return Started(delivery, email, attachments, token, time.monotonic(), generation)

    def _reschedule_if_early(self, item: Claimed, now: datetime) -> None:
        """A queued row that is not due yet was pushed early: put it in `scheduled`."""
        row = (
            Delivery.objects.filter(pk=item.id, status=Status.QUEUED, not_before__gt=now)
            .values_list("priority", "not_before")
            .first()
        )
        if row is not None:
            priority, not_before = row
            transaction.on_commit(
                lambda: self._push_quietly([QueueEntry(item.id, priority, not_before.timestamp())])
            )

    def _recent_email(self) -> int:
        """The id of the most recently used cached email (0 if none).

        A multi-recipient email's ids are claimed one after another, so the
        next claim is most likely for this one: its content need not be read.
        """
        with self._emails_lock:
            return next(reversed(self._emails), 0)

    def _email(self, email_id: int) -> tuple[Email, list[Attachment]]:
        """Emails never change once written, so they are cached by id."""
        with self._emails_lock:
            cached = self._emails.get(email_id)
            if cached is not None:
                self._emails.move_to_end(email_id)
                return cached
        return self._remember_email(*_load_email(email_id))

    def _remember_email(
        self, email: Email, has_attachments: bool
    ) -> tuple[Email, list[Attachment]]:
        attachments = (
            list(Attachment.objects.filter(email_id=email.pk).order_by("pk"))
            if has_attachments
            else []
        )
        with self._emails_lock:
            self._emails[email.pk] = (email, attachments)
            if len(self._emails) > EMAIL_CACHE_SIZE:
                self._emails.popitem(last=False)
        return email, attachments

    # -- sending and outcomes -----------------------------------------------------

    def _send(self, started: Started, backend: BaseEmailBackend) -> Settlement:
        """Step 3: hand the message to the backend; returns the outcome to write."""
        lease = outbox_settings.HEARTBEAT_TIMEOUT * 0.8
        if started.generation != self.generation or time.monotonic() - started.started > lease:
            # We were frozen or declared dead between marking and sending: the
            # sweeper may already have acted on this row, so do not send it.
            logger.warning(
                "delivery %s: lease expired before sending; releasing it", started.delivery.pk
            )
            return Settlement(started, Outcome.RELEASED, "lease expired before sending")
        try:
            message = build_message(started.delivery, started.email, started.attachments)
            if backend.send_messages([message]) != 1:
                raise DeliveryError("the email backend reported the message as not sent")
        except Exception as exc:
            return self._failure(started, exc)
        _fault("after_send")
        return Settlement(started, Outcome.SENT)

    def _failure(self, started: Started, exc: BaseException) -> Settlement:
        delivery = started.delivery
        error = f"{type(exc).__name__}: {exc}"[:2000]
        permanent = is_permanent(exc)
        if permanent or delivery.attempts >= delivery.max_attempts:
            return Settlement(started, Outcome.FAILED, error, permanent=permanent)
        base, cap = outbox_settings.RETRY_BACKOFF
        delay = backoff_delay(delivery.attempts, base, cap)
        return Settlement(started, Outcome.RETRY, error, timezone.now() + timedelta(seconds=delay))

    def _write_outcome(self, s: Settlement) -> int:
        """Step 4, inside the caller's transaction: one UPDATE matching the claim token.

        A success is recorded on the row itself (status, ``sent_at``, and the
        worker, token, start time and attempt number it was claimed with):
        that is the evidence, so it writes no Attempt row. Any other outcome
        also writes its Attempt row, and a retry or a release pushes the id
        back to Redis once the transaction commits. Returns how many rows
        changed (0: someone else settled the row meanwhile).
        """
        delivery = s.delivery
        now = timezone.now()
        if s.outcome == Outcome.SENT:
            changed = _mark_sent(delivery.pk, s.started.token, now)
            return changed or self._sent_but_not_ours(s, now)
        rows = Delivery.objects.filter(
            pk=delivery.pk, status=Status.PROCESSING, claim_token=s.started.token
        )
        if s.outcome == Outcome.FAILED:
            changed = rows.update(status=Status.FAILED, last_error=s.error, updated_at=now)
        elif s.outcome == Outcome.RETRY:
            changed = rows.update(
                status=Status.QUEUED,
                not_before=s.retry_at,
                last_error=s.error,
                claim_token=None,
                worker_id="",
                updated_at=now,
            )
        else:  # released: not sent, so the attempt does not count
            changed = rows.update(
                status=Status.QUEUED,
                attempts=F("attempts") - 1,
                claim_token=None,
                worker_id="",
                updated_at=now,
            )
        if not changed and _attempt_logged(s):
            # A retry after a commit whose reply was lost: nothing to write again.
            changed = 1
        else:
            self._log_attempt(s, now)
        if changed and s.outcome in (Outcome.RETRY, Outcome.RELEASED):
            at = s.retry_at.timestamp() if s.retry_at is not None else now.timestamp()
            entry = QueueEntry(delivery.pk, delivery.priority, at)
            transaction.on_commit(lambda: self._push_quietly([entry]))
        return changed

    def _sent_but_not_ours(self, s: Settlement, now: datetime) -> int:
        """The success UPDATE changed nothing: find out why (rare).

        Returns 1 if the row is already ``sent`` under this attempt's token (a
        retry after a commit whose reply was lost). Otherwise someone else (the
        sweeper, an operator) settled the row meanwhile: the server's
        acceptance is then written as an Attempt row, the evidence an
        operator needs, and 0 is returned.
        """
        delivery = s.delivery
        if Delivery.objects.filter(
            pk=delivery.pk, status=Status.SENT, claim_token=s.started.token
        ).exists():
            return 1
        if not _attempt_logged(s):
            self._log_attempt(s, now)
        return 0

    def _settled(self, s: Settlement, changed: int) -> None:
        """After the commit: counters, log lines and signals for one outcome."""
        delivery = s.delivery
        if s.outcome == Outcome.SENT:
            if not changed:
                logger.error(
                    "delivery %s (Message-ID %s) was accepted by the mail server, but its "
                    "row was settled by someone else meanwhile (the sweeper?); it may need "
                    "review",
                    delivery.pk,
                    delivery.message_id,
                )
                return
            self.stats.add("sent")
            with self._handled_lock:
                self.delivered_total += 1
            logger.debug("sent delivery %s to %s", delivery.pk, delivery.recipient)
            signals.delivery_sent.send_robust(
                sender=Delivery, delivery_id=delivery.pk, worker_id=self.worker_id, by="worker"
            )
            _fault("after_mark_sent")
        elif not changed or s.outcome == Outcome.RELEASED:
            return
        elif s.outcome == Outcome.FAILED:
            self.stats.add("failed")
            why = "permanent error" if s.permanent else f"{delivery.attempts} attempts"
            logger.warning(
                "delivery %s to %s failed (%s): %s", delivery.pk, delivery.recipient, why, s.error
            )
            signals.delivery_failed.send_robust(
                sender=Delivery, delivery_id=delivery.pk, error=s.error, by="worker"
            )
        else:
            assert s.retry_at is not None
            self.stats.add("retried")
            logger.info(
                "delivery %s: attempt %d of %d failed (%s); retrying at %s",
                delivery.pk,
                delivery.attempts,
                delivery.max_attempts,
                s.error,
                s.retry_at.isoformat(timespec="seconds"),
            )

    def _log_attempt(self, s: Settlement, finished: datetime) -> None:
        delivery = s.delivery
        Attempt.objects.create(
            delivery_id=delivery.pk,
            number=delivery.attempts,
            worker_id=delivery.worker_id,
            claim_token=s.started.token,
            started_at=delivery.processing_started_at or finished,
            finished_at=finished,
            outcome=s.outcome,
            error=s.error,
            actor=delivery.worker_id,
        )

    def _persist(self, write: Callable[[], int], delivery: Delivery, what: str) -> int | None:
        """Run a settling write, retrying while the database is unreachable.

        The outcome is known (the mail server accepted the message, or refused
        it): writing it down is worth waiting for, so the thread retries until
        the database answers. Only during shutdown does it give up, after
        FINALIZE_PATIENCE seconds; the row then stays ``processing`` and the
        sweeper flags it once this worker is gone.
        """
        deadline = time.monotonic() + FINALIZE_PATIENCE
        delay = 0.2
        while True:
            try:
                return write()
            except DatabaseError as exc:
                _drop_db_connection()
                if self.stop_event.is_set() and time.monotonic() >= deadline:
                    logger.error(
                        "could not record delivery %s (Message-ID %s) as %s: %s; the row "
                        "stays processing for the sweeper",
                        delivery.pk,
                        delivery.message_id,
                        what,
                        exc,
                    )
                    return None
                logger.warning(
                    "database error recording delivery %s as %s (%s); retrying",
                    delivery.pk,
                    what,
                    exc,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _push_quietly(self, entries: list[QueueEntry]) -> None:
        try:
            self.queue.push(entries)
        except RedisError as exc:
            logger.warning(
                "could not push %d ids to Redis (%s); the sweeper will", len(entries), exc
            )


# -- the hot path in SQL --------------------------------------------------------
# Raw statements for what runs once per email: the ORM's query building costs
# more CPU than the round trip. Each is still one conditional statement.
#
# Each finds its row by primary key. The status test is written as
# ``(status = ...) IS TRUE``, which no index can serve, because PostgreSQL
# otherwise may plan it on the (status, updated_at) index when its statistics
# say few rows are queued (a new table, or one analysed just after a drain):
# each claim would then scan every queued row, and a burst of n emails would
# cost O(n^2).

# Step 4 for a success and step 2, with named parameters (``_params``); used
# alone, and together in the PostgreSQL step statement below.
_SENT_SQL = """
UPDATE {delivery} SET status = %(sent)s, sent_at = %(now)s, updated_at = %(now)s,
    last_error = ''
WHERE id = %(settle_id)s AND (status = %(processing)s) IS TRUE
    AND claim_token = %(settle_token)s
"""

_CLAIM_SQL = """
UPDATE {delivery} SET status = %(processing)s, worker_id = %(worker)s,
    claim_token = %(token)s, processing_started_at = %(now)s, updated_at = %(now)s,
    attempts = attempts + 1
WHERE id = %(claim_id)s AND (status = %(queued)s) IS TRUE AND not_before <= %(now)s
RETURNING email_id, recipient, priority, attempts, max_attempts, message_id
"""

# PostgreSQL: the success of the previous message (if any), the claim of the
# next one and the next one's content, in one statement. A statement run in
# autocommit is its own transaction, so both UPDATEs commit together or not at
# all. They touch different rows; a CTE's RETURNING is all the SELECT reads.
# The email's content is skipped when the worker has it cached (%(known)s).
_STEP_SQL_POSTGRESQL = (
    "WITH settled AS ("
    + _SENT_SQL
    + "RETURNING id\n), claimed AS ("
    + _CLAIM_SQL
    + """)
SELECT (SELECT count(*) FROM settled),
    c.email_id, c.recipient, c.priority, c.attempts, c.max_attempts, c.message_id,
    e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers,
    EXISTS (SELECT 1 FROM {attachment} a WHERE a.email_id = e.id)
FROM (VALUES (1)) AS one
LEFT JOIN claimed c ON true
LEFT JOIN {email} e ON e.id = c.email_id AND e.id <> %(known)s
"""
)

_EMAIL_SQL = """
SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers,
    EXISTS (SELECT 1 FROM {attachment} a WHERE a.email_id = e.id)
FROM {email} e WHERE e.id = %s
"""


class _ClaimedRow(NamedTuple):
    delivery: Delivery
    email: Email | None  # None: not read with the claim (cached, or SQLite)
    has_attachments: bool


def _sql(template: str) -> str:
    return _sql_for_vendor(template, connection.vendor)


@functools.cache
def _sql_for_vendor(template: str, vendor: str) -> str:
    # Formatted once per statement, not once per email.
    quote = connection.ops.quote_name
    return template.format(
        delivery=quote(Delivery._meta.db_table),
        email=quote(Email._meta.db_table),
        attachment=quote(Attachment._meta.db_table),
    )


def _params(
    now: datetime,
    *,
    settle_id: int | None = None,
    settle_token: uuid.UUID | None = None,
    claim_id: int | None = None,
    worker: str = "",
    token: uuid.UUID | None = None,
    known: int = 0,
) -> dict[str, Any]:
    """The named parameters of the statements above, adapted for this database."""
    claim_token = Delivery._meta.get_field("claim_token")
    return {
        "sent": Status.SENT,
        "processing": Status.PROCESSING,
        "queued": Status.QUEUED,
        "now": connection.ops.adapt_datetimefield_value(now),
        "settle_id": settle_id,
        "settle_token": claim_token.get_db_prep_value(settle_token, connection),
        "claim_id": claim_id,
        "worker": worker,
        "token": claim_token.get_db_prep_value(token, connection),
        "known": known,
    }


def _delivery(
    pk: int, worker_id: str, token: uuid.UUID, now: datetime, row: Sequence[Any]
) -> Delivery:
    """The claimed row as the worker needs it, from the RETURNING columns."""
    email_id, recipient, priority, attempts, max_attempts, message_id = row
    return Delivery(
        pk=pk,
        email_id=email_id,
        recipient=recipient,
        priority=priority,
        attempts=attempts,
        max_attempts=max_attempts,
        message_id=message_id,
        status=Status.PROCESSING,
        worker_id=worker_id,
        claim_token=token,
        processing_started_at=now,
    )


def _email_from(pk: int, row: Sequence[Any]) -> Email:
    subject, body, html_message, from_email, reply_to, headers = row
    return Email(
        pk=pk,
        subject=subject,
        body=body,
        html_message=html_message,
        from_email=from_email,
        reply_to=_json(reply_to),
        headers=_json(headers),
    )


def _claim_row(pk: int, worker_id: str, token: uuid.UUID, now: datetime) -> _ClaimedRow | None:
    """The conditional UPDATE of step 2 with RETURNING (PostgreSQL, SQLite >= 3.35).

    Returns the claimed row (the fields the worker needs), or None if the row
    was not queued and due.
    """
    with connection.cursor() as cursor:
        cursor.execute(_sql(_CLAIM_SQL), _params(now, claim_id=pk, worker=worker_id, token=token))
        row = cursor.fetchone()
    if row is None:
        return None
    return _ClaimedRow(_delivery(pk, worker_id, token, now, row), None, False)


def _step_postgresql(
    settlement: Settlement | None,
    claim_id: int,
    worker_id: str,
    token: uuid.UUID,
    now: datetime,
    known_email: int,
) -> tuple[int, _ClaimedRow | None]:
    """Record a success and claim the next row in one statement (PostgreSQL).

    Returns how many rows the success UPDATE changed and the claimed row (with
    its email's content unless it is ``known_email``), or None.
    """
    with binding_cursor(connection) as cursor:
        cursor.execute(
            _sql(_STEP_SQL_POSTGRESQL),
            _params(
                now,
                settle_id=settlement.delivery.pk if settlement is not None else None,
                settle_token=settlement.started.token if settlement is not None else None,
                claim_id=claim_id,
                worker=worker_id,
                token=token,
                known=known_email,
            ),
        )
        row = cursor.fetchone()
    assert row is not None  # the SELECT always returns its one row
    settled = int(row[0])
    if row[1] is None:
        return settled, None
    delivery = _delivery(claim_id, worker_id, token, now, row[1:7])
    if row[7] is None:
        return settled, _ClaimedRow(delivery, None, False)
    return settled, _ClaimedRow(delivery, _email_from(row[1], row[7:13]), bool(row[13]))


def _mark_sent(pk: int, token: uuid.UUID, now: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_sql(_SENT_SQL), _params(now, settle_id=pk, settle_token=token))
        return int(cursor.rowcount)


def _load_email(email_id: int) -> tuple[Email, bool]:
    """The email's content and whether it has attachments, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_EMAIL_SQL), [email_id])
        row = cursor.fetchone()
    if row is None:
        raise Email.DoesNotExist(f"email {email_id} is gone")
    return _email_from(email_id, row[:6]), bool(row[6])


def _json(value: Any) -> Any:
    # A raw cursor gets JSON columns as text on PostgreSQL (Django's loader) and SQLite.
    return json.loads(value) if isinstance(value, str | bytes) else value


def _attempt_logged(s: Settlement) -> bool:
    """Whether this attempt's outcome already has its Attempt row.

    True after a retry of a commit whose reply was lost: the Attempt row is
    written in the same transaction as the outcome, so its claim token is the
    proof.
    """
    return Attempt.objects.filter(
        delivery_id=s.delivery.pk, claim_token=s.started.token, outcome=s.outcome
    ).exists()


class _Backoff:
    """Growing pause while Redis or the database is away, logged once per outage."""

    def __init__(self) -> None:
        self.delay = 0.0

    def reset(self) -> None:
        if self.delay:
            logger.info("connection restored")
        self.delay = 0.0

    def wait(self, stop: threading.Event, what: str, exc: BaseException | None) -> None:
        if not self.delay:
            logger.warning("%s is unavailable (%s); backing off", what, exc or "error")
        self.delay = min(max(self.delay * 2, 0.2), 5.0)
        stop.wait(self.delay)


def _close_quietly(backend: BaseEmailBackend) -> None:
    try:
        backend.close()
    except Exception:  # a dead connection may fail to say goodbye
        logger.debug("closing the delivery connection failed", exc_info=True)


def _drop_db_connection() -> None:
    try:
        connection.close()
    except Exception:
        logger.debug("closing the database connection failed", exc_info=True)


def run_worker(**options: Any) -> int:
    """Entry point for the management command."""
    return Worker(**options).run()
