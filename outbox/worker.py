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
   token, or requeue it with backoff, or mark it ``failed``, and write the
   attempt's Attempt row in the same transaction.

Why this order is safe: the database row, not Redis, decides who may send. A
crash before step 2 leaves a queued row (the sweeper pushes it back); a crash
between 2 and 4 leaves a ``processing`` row, the only state in doubt, for the
sweeper to flag; an id that Redis holds twice can pass step 2 only once. Step 4
matches the claim token, so a late worker can never overwrite another attempt.
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone
from redis.exceptions import RedisError

from . import signals
from .backends import get_delivery_connection
from .conf import outbox_settings
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
        pending: deque[Claimed] = deque()
        acks: list[int] = []
        tokens: dict[int, uuid.UUID] = {}
        generation = self.generation
        backend_open = False
        pause = _Backoff()
        batch = outbox_settings.CLAIM_BATCH
        while not self.stop_event.is_set():
            if generation != self.generation:
                # Declared dead: ids claimed under the old id are the sweeper's.
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
                    if not claimed and not self.burst:
                        if backend_open:
                            # Idle: close rather than let the server time us out mid-send.
                            _close_quietly(backend)
                            backend_open = False
                        one = self.queue.wait_claim(worker_id, outbox_settings.BLOCK_TIMEOUT)
                        claimed = [one] if one else []
                    pause.reset()
                except RedisError as exc:
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
                started = self._mark_processing(item, generation, token)
            except DatabaseError as exc:
                # Keep the token: if the UPDATE did commit, the retry finds the
                # row processing under it and carries on instead of stranding it.
                _drop_db_connection()
                pending.appendleft(item)
                tokens[item.id] = token
                pause.wait(self.stop_event, "the database", exc)
                continue
            pause.reset()
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
                    self._finish_failed(started, exc)
                    acks.append(item.id)
                    self._after_message()
                    continue
            ok = self._send_and_settle(started, backend)
            if not ok:
                _close_quietly(backend)
                backend_open = False
            acks.append(item.id)
            if self._after_message():
                break

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

    def _mark_processing(self, item: Claimed, generation: int, token: uuid.UUID) -> Started | None:
        """Step 2: claim the row in the database. None means a stale id: drop it.

        One statement, committed on its own: the row then names this worker,
        the claim token and the start time, which is all the evidence the
        sweeper needs if we die before step 4. Raises DatabaseError when the
        database is away; the caller retries with the same ``token``.
        """
        now = timezone.now()
        # No close_old_connections() here: with CONN_MAX_AGE=0 it would open a
        # new connection for every email. The connection lives as long as the
        # thread and is dropped only after a DatabaseError (_drop_db_connection).
        delivery = _claim_row(item.id, self.worker_id, token, now)
        if delivery is None:
            with transaction.atomic():
                owned = Delivery.objects.filter(
                    pk=item.id, status=Status.PROCESSING, claim_token=token
                ).first()
                if owned is None:
                    self._reschedule_if_early(item, now)
                    self.stats.add("skipped")
                    return None
            delivery = owned  # our earlier UPDATE committed; its reply was lost
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

    def _email(self, email_id: int) -> tuple[Email, list[Attachment]]:
        """Emails never change once written, so they are cached by id."""
        with self._emails_lock:
            cached = self._emails.get(email_id)
            if cached is not None:
                self._emails.move_to_end(email_id)
                return cached
        email = Email.objects.get(pk=email_id)
        attachments = list(Attachment.objects.filter(email_id=email_id).order_by("pk"))
        with self._emails_lock:
            self._emails[email_id] = (email, attachments)
            if len(self._emails) > EMAIL_CACHE_SIZE:
                self._emails.popitem(last=False)
        return email, attachments

    def _send_and_settle(self, started: Started, backend: BaseEmailBackend) -> bool:
        """Steps 3 and 4. Returns False when the connection should be reopened."""
        delivery = started.delivery
        lease = outbox_settings.HEARTBEAT_TIMEOUT * 0.8
        if started.generation != self.generation or time.monotonic() - started.started > lease:
            # We were frozen or declared dead between marking and sending: the
            # sweeper may already have acted on this row, so do not send it.
            self._release_unsent(started)
            return True
        try:
            message = build_message(delivery, started.email, started.attachments)
            if backend.send_messages([message]) != 1:
                raise DeliveryError("the email backend reported the message as not sent")
        except Exception as exc:
            self._finish_failed(started, exc)
            return False
        _fault("after_send")
        self._finish_sent(started)
        _fault("after_mark_sent")
        return True

    def _finish_sent(self, started: Started) -> None:
        delivery = started.delivery

        def write() -> int:
            now = timezone.now()
            with transaction.atomic():
                changed = Delivery.objects.filter(
                    pk=delivery.pk, status=Status.PROCESSING, claim_token=started.token
                ).update(status=Status.SENT, sent_at=now, updated_at=now, last_error="")
                # The attempt records the server's acceptance even if the row
                # was settled by someone else meanwhile: it is the evidence.
                self._log_attempt(started, now, Outcome.SENT)
            return changed

        changed = self._persist(write, delivery, "sent")
        if changed is None:
            return
        if changed:
            self.stats.add("sent")
            with self._handled_lock:
                self.delivered_total += 1
            logger.debug("sent delivery %s to %s", delivery.pk, delivery.recipient)
            signals.delivery_sent.send_robust(
                sender=Delivery, delivery_id=delivery.pk, worker_id=self.worker_id, by="worker"
            )
        else:
            logger.error(
                "delivery %s (Message-ID %s) was accepted by the mail server, but its row "
                "was settled by someone else meanwhile (the sweeper?); it may need review",
                delivery.pk,
                delivery.message_id,
            )

    def _finish_failed(self, started: Started, exc: BaseException) -> None:
        delivery = started.delivery
        error = f"{type(exc).__name__}: {exc}"[:2000]
        permanent = is_permanent(exc)
        exhausted = delivery.attempts >= delivery.max_attempts
        base, cap = outbox_settings.RETRY_BACKOFF
        retry_at = timezone.now() + timedelta(seconds=backoff_delay(delivery.attempts, base, cap))
        final = permanent or exhausted

        def write() -> int:
            now = timezone.now()
            with transaction.atomic():
                rows = Delivery.objects.filter(
                    pk=delivery.pk, status=Status.PROCESSING, claim_token=started.token
                )
                if final:
                    changed = rows.update(status=Status.FAILED, last_error=error, updated_at=now)
                else:
                    changed = rows.update(
                        status=Status.QUEUED,
                        not_before=retry_at,
                        last_error=error,
                        claim_token=None,
                        worker_id="",
                        updated_at=now,
                    )
                self._log_attempt(started, now, Outcome.FAILED if final else Outcome.RETRY, error)
                if changed and not final:
                    entry = QueueEntry(delivery.pk, delivery.priority, retry_at.timestamp())
                    transaction.on_commit(lambda: self._push_quietly([entry]))
            return changed

        changed = self._persist(write, delivery, "failed" if final else "retry")
        if not changed:
            return
        if final:
            self.stats.add("failed")
            why = "permanent error" if permanent else f"{delivery.attempts} attempts"
            logger.warning(
                "delivery %s to %s failed (%s): %s", delivery.pk, delivery.recipient, why, error
            )
            signals.delivery_failed.send_robust(
                sender=Delivery, delivery_id=delivery.pk, error=error, by="worker"
            )
        else:
            self.stats.add("retried")
            logger.info(
                "delivery %s: attempt %d of %d failed (%s); retrying at %s",
                delivery.pk,
                delivery.attempts,
                delivery.max_attempts,
                error,
                retry_at.isoformat(timespec="seconds"),
            )

    def _release_unsent(self, started: Started) -> None:
        """Undo a claim we will not send: back to queued, attempt not counted."""
        delivery = started.delivery

        def write() -> int:
            now = timezone.now()
            with transaction.atomic():
                changed = Delivery.objects.filter(
                    pk=delivery.pk, status=Status.PROCESSING, claim_token=started.token
                ).update(
                    status=Status.QUEUED,
                    attempts=F("attempts") - 1,
                    claim_token=None,
                    worker_id="",
                    updated_at=now,
                )
                self._log_attempt(started, now, Outcome.RELEASED, "lease expired before sending")
                if changed:
                    entry = QueueEntry(delivery.pk, delivery.priority, now.timestamp())
                    transaction.on_commit(lambda: self._push_quietly([entry]))
            return changed

        logger.warning("delivery %s: lease expired before sending; releasing it", delivery.pk)
        self._persist(write, delivery, "released")

    def _log_attempt(
        self, started: Started, finished: datetime, outcome: str, error: str = ""
    ) -> None:
        delivery = started.delivery
        Attempt.objects.create(
            delivery_id=delivery.pk,
            number=delivery.attempts,
            worker_id=delivery.worker_id,
            claim_token=started.token,
            started_at=delivery.processing_started_at or finished,
            finished_at=finished,
            outcome=outcome,
            error=error,
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


_CLAIM_SQL = """
UPDATE {table} SET status = %s, worker_id = %s, claim_token = %s,
    processing_started_at = %s, updated_at = %s, attempts = attempts + 1
WHERE id = %s AND status = %s AND not_before <= %s
RETURNING email_id, recipient, priority, attempts, max_attempts, message_id
"""


def _claim_row(pk: int, worker_id: str, token: uuid.UUID, now: datetime) -> Delivery | None:
    """The conditional UPDATE of step 2 with RETURNING (PostgreSQL, SQLite >= 3.35).

    Returns the claimed row (the fields the worker needs), or None if the row
    was not queued and due.
    """
    ops = connection.ops
    when = ops.adapt_datetimefield_value(now)
    token_db = Delivery._meta.get_field("claim_token").get_db_prep_value(token, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL.format(table=ops.quote_name(Delivery._meta.db_table)),
            [Status.PROCESSING, worker_id, token_db, when, when, pk, Status.QUEUED, when],
        )
        row = cursor.fetchone()
    if row is None:
        return None
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
