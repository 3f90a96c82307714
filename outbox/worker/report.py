"""What a worker tells the operator: counters, one log line per outcome, signals.

While a mailer's failure alarm is on (``alarm.FailureAlarm``), the lines of its single
failed attempts go down to DEBUG: the alarm's own line, once a window, says
what they would.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from .. import signals
from ..models import Attempt, Delivery
from .alarm import FailureAlarm
from .faults import fault
from .outcomes import Settlement

logger = logging.getLogger("outbox.worker")

Outcome = Attempt.Outcome


@dataclass
class Stats:
    """Counters for the periodic summary line, and the run's total."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    in_doubt: int = 0
    skipped: int = 0
    held: int = 0  # held to wait for a rate limit or a paused or slowed domain
    delivered_total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)
            if name == "sent":
                self.delivered_total += 1

    def take(self) -> tuple[int, int, int, int, int, int]:
        with self.lock:
            values = (
                self.sent,
                self.retried,
                self.failed,
                self.in_doubt,
                self.skipped,
                self.held,
            )
            self.sent = self.retried = self.failed = self.in_doubt = self.skipped = 0
            self.held = 0
            return values

    def summary(self, worker_id: str, elapsed: float) -> None:
        sent, retried, failed, in_doubt, skipped, held = self.take()
        if sent or retried or failed or in_doubt or skipped or held:
            logger.info(
                "%s: %d sent (%.1f/s), %d retried, %d failed, %d in doubt, "
                "%d stale ids skipped, %d held for a limit or a pause in %.0fs",
                worker_id,
                sent,
                sent / max(elapsed, 1e-9),
                retried,
                failed,
                in_doubt,
                skipped,
                held,
                elapsed,
            )


def announce(
    s: Settlement, changed: int, stats: Stats, worker_id: str, alarm: FailureAlarm | None = None
) -> None:
    """After the commit: counters, log lines and signals for one outcome."""
    delivery = s.delivery
    quiet = False
    if alarm is not None:
        alarm.observe(s)
        quiet = alarm.quiet(s.flight.email.mailer)
    if s.outcome == Outcome.SENT:
        if not changed:
            logger.error(
                "delivery %s (Message-ID %s) was accepted by the mail server, but its "
                "row was settled by someone else meanwhile (the sweeper?); it may need review",
                delivery.pk,
                delivery.message_id,
            )
            return
        stats.add("sent")
        if s.sent_to:  # the staging valve redirected it: say where it really went
            logger.debug(
                "sent delivery %s to %s (redirected from %s)",
                delivery.pk,
                s.sent_to,
                delivery.recipient,
            )
        else:
            logger.debug("sent delivery %s to %s", delivery.pk, delivery.recipient)
        signals.delivery_sent.send_robust(
            sender=Delivery, delivery_id=delivery.pk, worker_id=worker_id, by="worker"
        )
        fault("after_mark_sent")
    elif not changed or s.outcome == Outcome.RELEASED:
        return
    elif s.outcome == Outcome.CANCELLED:
        stats.add("skipped")
        logger.info("delivery %s to %s cancelled: %s", delivery.pk, delivery.recipient, s.error)
    elif s.outcome == Outcome.AMBIGUOUS:
        stats.add("in_doubt")
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "delivery %s to %s is in doubt (%s): the server may have Message-ID %s; "
            "marked abandoned for review",
            delivery.pk,
            delivery.recipient,
            s.error,
            delivery.message_id,
        )
    elif s.outcome == Outcome.FAILED:
        stats.add("failed")
        why = "permanent error" if s.permanent else f"{delivery.attempts} attempts"
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "delivery %s to %s failed (%s): %s",
            delivery.pk,
            delivery.recipient,
            why,
            s.error,
        )
        signals.delivery_failed.send_robust(
            sender=Delivery, delivery_id=delivery.pk, error=s.error, by="worker"
        )
    else:
        assert s.retry_at is not None
        stats.add("retried")
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "delivery %s: attempt %d of %d failed (%s); retrying at %s",
            delivery.pk,
            delivery.attempts,
            delivery.max_attempts,
            s.error,
            s.retry_at.isoformat(timespec="seconds"),
        )
