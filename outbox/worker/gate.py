"""The worker's side of sending control: pauses, slowed domains and rate limits.

Two checks, each a small hook in the sender loop (:class:`~outbox.worker.loop.SenderLoop`):

- **before marking a row**, :meth:`Gate.paused`: a global pause (read from the
  claim replies, or again from Redis when the view is older than
  ``control.MAX_AGE``) makes the thread give back its claimed ids instead of
  sending them (:mod:`outbox.queue.control`);
- **after the claim UPDATE**, :meth:`Gate.holds`: the row's recipient domain
  (and its email's mailer) is now known. A paused domain, a domain slowed down
  after a 421/450, a mailer paused after its ESP refused the credential, or a
  rate limit with no free slot (its domain's, its
  mailer's or ``"*"``, taken together; :func:`outbox.queue.ratelimit.take`) holds the row:
  ONE conditional UPDATE (``WHERE status='processing' AND claim_token=<ours>``)
  puts it back to ``queued`` with ``attempts`` restored and ``not_before`` =
  the moment it may go, and the id goes to ``scheduled`` for that moment
  (forced push, after the UPDATE committed). No Attempt row is written: it
  was not an attempt. If the UPDATE changes nothing, someone else settled the
  row meanwhile and nothing is pushed.

A third hook, :meth:`Gate.settled`, sees each outcome: a mailer whose ESP
refused its credential (``on_send_error``) is paused for all workers
(:func:`outbox.queue.control.refuse`); the row that met the refusal is released
(not an attempt), due when the pause ends, and the first success through the
mailer afterwards ends it.

With no limits configured and no switch set, :meth:`Gate.holds` does no
Redis round trip and no query (the ratelimit module docstring says why the
check sits here, and why the moment the row is ``processing`` while held
is safe).
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from ..conf import outbox_settings
from ..mail.failures import configuration_refused, http_failure
from ..models import Attempt, Delivery
from ..queue import control, ratelimit
from ..queue.clock import from_timestamp
from ..queue.entries import QueueEntry
from . import sql
from .host import WorkerHost
from .inflight import InFlight
from .outcomes import Settlement

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status
Outcome = Attempt.Outcome

# Seconds a row waits when Redis could not be asked about its rate limit.
REDIS_DOWN_DELAY = 1.0


class Gate:
    """Sending control for the threads of one worker process."""

    def __init__(self, worker: WorkerHost) -> None:
        self.worker = worker

    def observe(self, fields: dict[str, str] | None) -> control.ControlState:
        """Take the control hash a claim reply carried (may restore a lost one)."""
        return self.worker.control.observe(fields, self.worker.queue)

    def paused(self) -> bool:
        """Whether all sending is paused now (the view is at most MAX_AGE old)."""
        view = self.worker.control
        try:
            return view.fresh(self.worker.queue).paused
        except RedisError:
            # Redis is away: claims fail too; the last view decides the ids in hand.
            return view.current.paused

    def holds(self, flight: InFlight) -> bool:
        """Give ``flight`` back if a switch or a limit holds it; True if it did."""
        delivery = flight.delivery
        current, configured = self.worker.control.current, ratelimit.limits()
        if not (
            configured or current.paused_domains or current.slow_domains or current.paused_mailers
        ):
            return False  # the common case, once per email: nothing can hold it
        domain = ratelimit.domain_of(delivery.recipient)
        now = self.worker.clock.time()
        until = control.hold_until(current, domain, now, flight.email.mailer)
        if until is None:
            checks = ratelimit.applicable(domain, configured, flight.email.mailer)
            if not checks:
                return False
            try:
                now, until = ratelimit.take(self.worker.queue, delivery.pk, checks)
            except RedisError as exc:
                logger.warning("cannot check the rate limit of %s (%s); holding it", domain, exc)
                until = now + REDIS_DOWN_DELAY
            if until is None:
                return False
        self.give_back(flight, until)
        return True

    def give_back(self, flight: InFlight, until: float) -> int:
        """Put a claimed row back to ``queued`` until ``until`` (Redis time); not an attempt."""
        delivery = flight.delivery
        due = from_timestamp(until)
        changed = sql.unclaim(delivery.pk, flight.token, self.worker.clock.now(), due)
        if changed:
            self.worker.push_quietly([QueueEntry(delivery.pk, delivery.priority, until)])
            self.worker.stats.add("held")
            logger.debug("delivery %s held until %s", delivery.pk, due.isoformat())
        return changed

    def on_send_error(self, flight: InFlight, exc: BaseException, *, connecting: bool) -> None:
        """A 421 or 450 slows the recipient's whole domain down, not only this message.

        Said while ``connecting`` (the greeting, EHLO, login), it is about the
        mail server as a whole, not one domain: then all sending (``"*"``) waits.
        An ESP's 429 or 503 with ``Retry-After`` is about the account: the
        email's mailer (``"mailer:<alias>"``; all sending for the default
        backend) waits that long (:func:`outbox.mail.failures.retry_after`). One that refused the
        mailer's credential (401, 403), or a backend that cannot be created,
        pauses that mailer (:meth:`pause_mailer`).
        """
        why = configuration_refused(exc)
        if why is not None:
            self.pause_mailer(flight.email.mailer, why)
            return
        http = http_failure(exc)
        if http is not None and http.retry_after:
            mailer = flight.email.mailer
            domain = f"{ratelimit.MAILER_PREFIX}{mailer}" if mailer else ratelimit.GLOBAL
            seconds = http.retry_after
        elif ratelimit.throttled(exc):
            domain = (
                ratelimit.GLOBAL if connecting else ratelimit.domain_of(flight.delivery.recipient)
            )
            seconds = outbox_settings.THROTTLE_PENALTY
        else:
            return
        try:
            control.slow_down(domain, seconds, self.worker.queue)
        except RedisError as exc2:
            logger.warning("could not slow %s down (%s)", domain, exc2)
            return
        logger.warning(
            "the mail server asked to slow down (%s); holding %s for %.0fs", exc, domain, seconds
        )

    def pause_mailer(self, mailer: str, why: str) -> None:
        """Pause ``mailer`` for all workers (``outbox.queue.control.refuse``); log a new pause."""
        queue = self.worker.queue
        try:
            state, began = control.refuse(mailer, why, queue)
        except RedisError as exc:
            # Its rows are released anyway; the next refusal tries again.
            logger.warning("could not pause %s (%s): %s", _mailer_name(mailer), exc, why)
            return
        self.worker.control.take(state, queue)  # this thread's next rows wait at once
        paused = state.paused_mailers.get(mailer)
        if began and paused is not None:
            logger.error(
                "%s paused for %.0fs (%d in a row): %s; its mail stays queued and is tried "
                "again when the pause ends",
                _mailer_name(mailer),
                paused.until - paused.since,
                paused.count,
                why,
            )

    def settled(self, settlement: Settlement) -> Settlement:
        """``settlement``, shaped by its mailer's pause (the view this worker has of it).

        A release (the companions' in its ESP request too) is due when the
        pause ends; a success through a mailer that was paused ends the pause,
        for every worker.
        """
        mailer = settlement.flight.email.mailer
        paused = self.worker.control.current.paused_mailers.get(mailer)
        if paused is None:
            return settlement
        due = from_timestamp(paused.until)
        for one in (settlement, *settlement.companions):  # the rows of one ESP request
            if one.outcome == Outcome.RELEASED and (one.retry_at is None or one.retry_at < due):
                one.retry_at = due
        if settlement.outcome == Outcome.SENT:
            queue = self.worker.queue
            try:
                state, forgot = control.accepted(mailer, queue)
            except RedisError as exc:
                logger.warning("could not end the pause of %s (%s)", _mailer_name(mailer), exc)
                return settlement
            self.worker.control.take(state, queue)
            if forgot:
                logger.warning(
                    "%s: its ESP took a message again; sending resumed", _mailer_name(mailer)
                )
        return settlement


def _mailer_name(mailer: str) -> str:
    return f"the mailer {mailer!r}" if mailer else "the default mailer"
