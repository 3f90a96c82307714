"""The worker process: its incarnation, threads, signals, heartbeat and summary.

Every start of a worker process is its own *incarnation*: the operator's
``--worker-id`` (default ``host:pid``) plus ``#`` and a random suffix. Rows,
processing lists and heartbeats name the incarnation, so a worker restarted at
once under the same ``--worker-id`` (systemd ``%i``, a StatefulSet pod name)
never revives its predecessor's registration: the sweeper sees the old
incarnation stop beating and settles what it left behind. An incarnation the
sweeper declared dead can no longer claim (``claim.lua`` checks the
registration); this process then carries on as a new incarnation.

``concurrency`` sender threads each run a :class:`~outbox.worker.loop.SenderLoop`
on their own delivery connection and database connection; one more thread
writes the heartbeat. A sender thread that crashes stops the process, which
then exits with status 1. A delivery backend that cannot be created
(``ImproperlyConfigured``) is not a crash: its mailer is paused, its rows stay
queued, and the other mailers go on (:meth:`~outbox.worker.gate.Gate.pause_mailer`).

An unreachable Redis or database makes the threads back off and wait; with
``give_up_after`` (``--give-up-after``, 30 s by default with ``--burst``) an
outage that lasts that long stops the worker instead, with one error line
naming what was unreachable and where, and exit status
:data:`~outbox.worker.outage.EXIT_UNAVAILABLE` (1 when the database answers
but is not migrated): :class:`~outbox.worker.outage.GiveUp`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connections
from redis.exceptions import RedisError

from ..conf import outbox_settings
from ..mail.targets import get_delivery_connection
from ..models import outbox_alias
from ..queue.clock import RedisClock
from ..queue.control import ControlView
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue
from .alarm import FailureAlarm
from .backoff import close_quietly
from .cache import EmailCache
from .group_commit import GroupCommit, StepConnection
from .incarnation import Incarnation
from .loop import SenderLoop
from .outage import GiveUp
from .report import Stats

logger = logging.getLogger("outbox.worker")


def default_worker_id() -> str:
    """The worker's name when none is given: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def new_incarnation(name: str) -> str:
    """A name unique to one process start: ``<name>#<12 hex digits>``."""
    return f"{name}#{uuid.uuid4().hex[:12]}"


class Worker:
    """Deliver outbox mail until stopped (or, with ``burst``, until nothing is due)."""

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
        give_up_after: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if give_up_after is not None and give_up_after <= 0:
            raise ValueError("give_up_after must be positive")
        self.name = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.burst = burst
        self.max_messages = max_messages
        self.queue = queue or RedisQueue()
        self.summary_interval = summary_interval
        self.progress = progress
        self.stop_event = threading.Event()
        # Seconds an outage of Redis or the database may last before the
        # worker stops (None: it waits for ever); and, once it gave up, its
        # exit status (outage.GiveUp).
        self.give_up = GiveUp(give_up_after, self.stop_event)
        self.stats = Stats()
        # What the main loop waits on between its rounds: a sender thread that
        # ends, or a failure the alarm should hear of at once, cuts the wait short.
        self.wake = threading.Event()
        # Attempts and failures per mailer, for the failure alarm (alarm.FailureAlarm).
        self.alarm = FailureAlarm(self.queue, self.wake)
        self.clock = RedisClock()
        self.emails = EmailCache()
        # The operator's switches as the claims saw them (outbox.queue.control.ControlView).
        self.control = ControlView()
        self.crashed = False
        # The incarnation's name and lease, replaced as one under `_lock`
        # (outbox.worker.incarnation.Incarnation): ids claimed under an older name are the
        # sweeper's now.
        self._incarnation = Incarnation(new_incarnation(self.name), time.monotonic())
        # The heartbeat outlives stop_event: it beats until every sender thread
        # has finished its message, or the sweeper would take rows mid-send.
        self._heartbeat_stop = threading.Event()
        self._handled = 0
        self._threads_done = 0  # sender threads past their last line (the main loop's end)
        # Held briefly: the message count and the incarnation snapshot.
        self._lock = threading.Lock()
        # Its own lock, serialising reincarnations: a new incarnation's
        # registration may be retried for as long as Redis is away, and the
        # sender threads must still read the snapshot and count their messages
        # under `_lock` meanwhile.
        self._incarnation_lock = threading.Lock()
        # SQLite has one writer at a time, and a thread that finds the file
        # locked sleeps in SQLite's busy handler (1 ms, 2 ms, 5 ms, ...). The
        # sender threads take this lock around their write transaction instead,
        # so the next one starts the moment a commit ends, while the others
        # build and send messages. Other processes still meet the busy handler.
        self.sqlite_write_lock = threading.Lock()
        # The sender threads' steps, written together (group_commit.GroupCommit) on
        # the process's one step connection.
        self.steps = StepConnection(self.sqlite_write_lock)
        self.group_commit = GroupCommit(self.steps.write, limit=max(1, self.concurrency))
        self._sigint_count = 0

    @property
    def delivered_total(self) -> int:
        return self.stats.delivered_total

    @property
    def gave_up(self) -> int | None:
        """The exit status once the worker gave up on an outage; None until then."""
        return self.give_up.status

    # -- the incarnation, read as one ------------------------------------------------

    def incarnation(self) -> Incarnation:
        """The current incarnation's name and lease, as one snapshot."""
        with self._lock:
            return self._incarnation

    @property
    def worker_id(self) -> str:
        """The current incarnation's name (a sender that also needs the lease reads
        :meth:`incarnation` instead)."""
        return self.incarnation().worker_id

    @property
    def lease_from(self) -> float:
        return self.incarnation().lease_from

    @lease_from.setter
    def lease_from(self, value: float) -> None:
        """Set the current incarnation's lease start (at its registration; tests
        freeze a worker this way)."""
        with self._lock:
            self._incarnation = replace(self._incarnation, lease_from=value)

    def lease_left(self, worker_id: str) -> float:
        """Seconds incarnation ``worker_id`` may still start a send; not positive: it may not.

        An incarnation that is no longer the current one has no lease at all:
        the name and the lease are read in one snapshot, never apart.
        """
        current = self.incarnation()
        if current.worker_id != worker_id:
            return float("-inf")
        return current.lease_left()

    # -- life cycle ---------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> int:
        """Run until stopped; returns the exit status.

        0; 1 if a sender thread crashed; :data:`~outbox.worker.outage.EXIT_UNAVAILABLE`
        (or 1: not migrated) if it gave up on an outage (``give_up_after``).
        """
        # From here: a worker that waited for Redis before its threads started
        # ran for that long too.
        started = time.monotonic()
        if install_signal_handlers:
            self._install_signal_handlers()
        self.lease_from = self._register(self.worker_id)
        if self.gave_up is None and self.give_up.after is not None:
            self.give_up.wait_for_the_database(self.worker_id)
            if self.gave_up is not None:
                self._deregister()  # registered: Redis answered
        if self.gave_up is not None:
            return self.gave_up
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
            threading.Thread(target=self._thread_main, args=(i,), name=f"outbox-sender-{i}")
            for i in range(self.concurrency)
        ]
        self._threads_done = 0
        for thread in threads:
            thread.start()
        last_summary = time.monotonic()
        while self._threads_done < len(threads):
            self.wake.wait(0.2)
            self.wake.clear()
            self.alarm.tick()
            if time.monotonic() - last_summary >= self.summary_interval:
                self.stats.summary(self.worker_id, time.monotonic() - last_summary)
                last_summary = time.monotonic()
        for thread in threads:
            thread.join()  # each is past its last line
        self.stop_event.set()
        self._heartbeat_stop.set()
        self.steps.close()
        heartbeat.join(timeout=5)
        self.alarm.flush()  # the last tallies, while the process is still registered
        self.stats.summary(self.worker_id, time.monotonic() - last_summary)
        self._deregister()
        logger.info(
            "worker %s stopped after %.1fs: %d delivered%s",
            self.worker_id,
            time.monotonic() - started,
            self.delivered_total,
            "; a sender thread crashed" if self.crashed else "",
        )
        if self.gave_up is not None:
            return self.gave_up
        return 1 if self.crashed else 0

    def outlasted(self, since: float, what: str, exc: BaseException | None) -> bool:
        """Whether an outage of ``what`` that began at ``since`` stops the worker (``GiveUp``).

        Called by whichever thread waits; the first one to give up speaks.
        """
        return self.give_up.outlasted(since, what, exc, self.worker_id)

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

    def _thread_main(self, index: int) -> None:
        backend: BaseEmailBackend | None = None
        try:
            try:
                backend = get_delivery_connection()
            except ImproperlyConfigured as exc:
                # A setting the backend needs is missing (check outbox.E027 says
                # which at start): the thread still runs, for the other mailers;
                # the default one is created when its first row comes, and its
                # failure then pauses that mailer (gate.Gate.pause_mailer), burning no row.
                logger.debug(
                    "thread %d: the delivery backend cannot be created yet: %s", index, exc
                )
            SenderLoop(self, index, backend).run()
        except Exception:
            logger.exception("sender thread crashed; stopping the worker")
            self.crashed = True
            self.stop_event.set()
        finally:
            if backend is not None:
                close_quietly(backend)
            connections[outbox_alias()].close()
            with self._lock:
                self._threads_done += 1
            self.wake.set()  # the main loop looks at once

    # -- registration and heartbeat ------------------------------------------------

    def _register(self, worker_id: str) -> float:
        """Register ``worker_id``; returns when the call that did it was sent (monotonic)."""
        since = time.monotonic()
        while True:
            sent_at = time.monotonic()
            try:
                self.clock.observe(self.queue.register(worker_id))
                return sent_at
            except RedisError as exc:
                if self.outlasted(since, "Redis", exc):
                    return float("-inf")
                logger.warning("cannot register with Redis (%s); retrying", exc)
                if self.stop_event.wait(1.0):
                    return float("-inf")  # stopping, unregistered: no lease at all

    def _deregister(self) -> None:
        try:
            self.queue.give_back(self.worker_id, [], deregister=True)
        except RedisError as exc:
            # The sweeper will find the stale heartbeat and clean up after us.
            logger.warning("could not deregister from Redis: %s", exc)

    def reincarnate(self, old: str) -> None:
        """Carry on as a new incarnation after ``old`` was declared dead.

        Called by whichever thread noticed first; the others wait, then find
        the name already changed. The new name is registered *before* it is
        published: a thread that read a published but unregistered name would
        find it "dead" and move on again, leaving the first name registered
        with nobody beating for it, to be declared dead by the sweeper.
        """
        with self._incarnation_lock:
            if self.worker_id != old:
                return
            new = new_incarnation(self.name)
            logger.warning(
                "worker %s was declared dead (or Redis lost its entry); its claims are the "
                "sweeper's now; continuing as %s",
                old,
                new,
            )
            registered_at = self._register(new)
            # The name and the lease in one assignment: a sender reads both
            # of the old incarnation or both of the new one, never the new
            # lease with the old name (outbox.worker.incarnation.Incarnation).
            with self._lock:
                self._incarnation = Incarnation(new, registered_at)

    def _heartbeat_loop(self) -> None:
        interval = outbox_settings.HEARTBEAT_INTERVAL
        while not self._heartbeat_stop.wait(interval):
            try:
                self.beat()
            except RedisError as exc:
                logger.warning("heartbeat failed: %s", exc)

    def beat(self) -> None:
        """One heartbeat: renew the lease, or carry on as a new incarnation."""
        worker_id = self.worker_id
        sent_at = time.monotonic()
        now, alive = self.queue.heartbeat(worker_id)
        self.clock.observe(now)
        if not alive:
            self.reincarnate(worker_id)
            return
        with self._lock:
            # Renews the incarnation it found alive, not one that replaced it meanwhile.
            if self._incarnation.worker_id == worker_id:
                self._incarnation = self._incarnation.renewed(sent_at)

    # -- shared by the sender threads ------------------------------------------------

    def claim_size(self) -> int:
        """How many ids a thread may claim now (the batch, or what --max-messages leaves)."""
        batch = outbox_settings.CLAIM_BATCH
        if self.max_messages is None:
            return batch
        with self._lock:
            return min(batch, max(0, self.max_messages - self._handled))

    def count_handled(self) -> bool:
        """Count one finished message; True when --max-messages is reached."""
        with self._lock:
            self._handled += 1
            done = self.max_messages is not None and self._handled >= self.max_messages
        if done:
            self.stop_event.set()
        if self.progress is not None:
            self.progress(self.delivered_total, time.monotonic())
        return done

    def push_quietly(self, entries: list[QueueEntry]) -> None:
        """Push ids that came out of our processing list back (forced); log a failure."""
        try:
            self.queue.push(entries, force=True)
        except RedisError as exc:
            logger.warning(
                "could not push %d ids to Redis (%s); the sweeper will", len(entries), exc
            )


def run_worker(**options: Any) -> int:
    """Entry point for the management command."""
    return Worker(**options).run()
