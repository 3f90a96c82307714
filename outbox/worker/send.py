"""Step 3 of a sender thread: hand one message to its mailer, under the lease.

A message goes out only while the worker's heartbeat lease is live, checked
right before the send and again right before SMTP's final dot (the fence,
``mail/handover.py``): a worker frozen mid-send and declared dead meanwhile
releases the row instead of handing it over. The staging valve looks at the
copy as built. The thread's mail connections live here too: opened on first
use, kept open while mail trickles in, closed once the thread has idled.
"""

from __future__ import annotations

import logging
import time

from django.core.mail.backends.base import BaseEmailBackend

from ..exceptions import DeliveryError, SendFencedError
from ..mail import valve
from ..mail.message import build_message
from ..models import Attempt
from .connections import Connections
from .faults import fault
from .gate import Gate
from .host import WorkerHost
from .outcomes import Settlement, Started, failure

logger = logging.getLogger("outbox.worker")

Outcome = Attempt.Outcome

# An idle thread keeps its mail connections open this long after its last
# send: mail that trickles in then does not pay a new connection (TCP, the
# greeting, EHLO) per message. The connection waits at most this plus one
# BLOCK_TIMEOUT, far below the minutes servers allow an idle client (RFC 5321
# section 4.5.3.2.7: at least 5), so no server times it out under a send.
KEEP_OPEN_SECONDS = 1.0


class Sender:
    """One sender thread's mail connections and its sends."""

    def __init__(self, worker: WorkerHost, gate: Gate, backend: BaseEmailBackend) -> None:
        self.worker = worker
        self.gate = gate  # told of send errors (slowed domains)
        # The default connection (``backend``) and, created on first use, one per mailer.
        self.connections = Connections(backend, fence=self.may_hand_over)
        self.sending_generation = worker.generation  # of the row being sent
        self.last_send = 0.0  # time.monotonic() when a send last ended

    def deliver(self, started: Started) -> Settlement:
        """Hand the message to its mailer's backend; returns the outcome to write."""
        try:
            link = self.connections.get(started.email.mailer)
            link.ensure_open()
        except Exception as exc:
            # Cannot reach the mail server (or this host has no such mailer):
            # nothing was handed over.
            self.gate.on_send_error(started, exc, connecting=True)
            return failure(started, exc, self.worker.clock.now())
        settlement = self.send(started, link.backend)
        self.last_send = time.monotonic()
        if settlement.outcome not in (Outcome.SENT, Outcome.CANCELLED):
            link.close()
        return settlement

    def may_hand_over(self) -> bool:
        """The fence asked right before SMTP's final dot: the same as before the send."""
        return self.sending_generation == self.worker.generation and self.worker.lease_left() > 0

    def send(self, started: Started, backend: BaseEmailBackend) -> Settlement:
        """Send one copy on ``backend`` (open), under a live lease."""
        if started.generation != self.worker.generation or self.worker.lease_left() <= 0:
            # Declared dead since the claim, or no heartbeat has renewed the
            # lease lately (we were frozen, or Redis is away): the sweeper may
            # already have acted on this row, or may before the send ends.
            logger.warning(
                "delivery %s: no live lease before sending; releasing it", started.delivery.pk
            )
            return Settlement(started, Outcome.RELEASED, "lease expired before sending")
        self.sending_generation = started.generation
        try:
            built = self.worker.emails.builds(started.email)
            message = build_message(started.delivery, started.email, started.attachments, built)
            # The staging valve's guarantee is given here, on the copy as built (mail/valve.py).
            message, note = valve.admit(message, started.delivery.recipient)
            if backend.send_messages([message]) != 1:
                raise DeliveryError("the email backend reported the message as not sent")
        except valve.NotAllowedRecipient as exc:
            return Settlement(started, Outcome.CANCELLED, str(exc))
        except SendFencedError as exc:
            logger.warning("delivery %s: %s; releasing it", started.delivery.pk, exc)
            return Settlement(started, Outcome.RELEASED, str(exc))
        except Exception as exc:
            self.gate.on_send_error(started, exc, connecting=False)
            return failure(started, exc, self.worker.clock.now())
        fault("after_send")
        # A redirected copy went to its one envelope address, not the row's recipient.
        sent_to = ", ".join(message.recipients()) if note else ""
        return Settlement(started, Outcome.SENT, note, sent_to=sent_to)

    def idle(self, paused: bool) -> None:
        """The thread is about to idle: close connections that have idled a while."""
        # Rather than let the server time us out mid-send.
        if paused or time.monotonic() - self.last_send >= KEEP_OPEN_SECONDS:
            self.connections.close_open()

    def close_mailers(self) -> None:
        """The thread stops: close the mailers' connections (its owner closes the default)."""
        self.connections.close_mailers()
