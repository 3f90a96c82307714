"""Step 3 of a sender thread: hand one message to its mailer, under the lease.

A message goes out only while the worker's heartbeat lease is live, checked
right before the send and again right before SMTP's final dot (the fence,
``mail/handover.py``): a worker frozen mid-send and declared dead meanwhile
releases the row instead of handing it over. Every outcome names the server
the connection reached; with reconcilers configured, the row names it before
the hand-over too. The staging valve looks at the
copy as built. The thread's mail connections live here too: opened on first
use, kept open while mail trickles in, closed once the thread has idled.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError

from ..conf import outbox_settings
from ..exceptions import DeliveryError, SendFencedError
from ..mail import esp, request, valve
from ..mail.connection import Server
from ..mail.handover import handover_server
from ..mail.message import build_message
from ..models import Attempt
from .backoff import drop_db_connection
from .connections import Connections
from .faults import fault
from .gate import Gate
from .host import WorkerHost
from .outcomes import Settlement, Started, failure, from_answer
from .sql import mark_companions, note_server, release_companions

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

    def __init__(self, worker: WorkerHost, gate: Gate, backend: BaseEmailBackend | None) -> None:
        self.worker = worker
        self.gate = gate  # told of send errors (slowed domains)
        # The default connection (``backend``; None: created on first use, see
        # connections.py) and, created on first use, one per mailer.
        self.connections = Connections(backend, fence=self.may_hand_over)
        self.sending_as = worker.worker_id  # the incarnation the row being sent was marked under
        self.last_send = 0.0  # time.monotonic() when a send last ended

    def deliver(self, started: Started) -> Settlement:
        """Hand the message to its mailer's backend; returns the outcome to write."""
        try:
            link = self.connections.get(started.email.mailer)
            link.ensure_open()
        except Exception as exc:
            # Cannot reach the mail server, or the backend cannot be created
            # (this host has no such mailer, a setting is missing: the mailer
            # is paused): nothing was handed over.
            self.gate.on_send_error(started, exc, connecting=True)
            return self.gate.settled(failure(started, exc, self.worker.clock.now()))
        server = handover_server(link.backend)
        # A mailer whose ESP refused its credential is paused (gate.py).
        settlement = self.gate.settled(self.send(started, link.backend, server))
        settlement.server = server
        self.last_send = time.monotonic()
        if settlement.outcome not in (Outcome.SENT, Outcome.CANCELLED):
            link.close()
        return settlement

    def may_hand_over(self) -> bool:
        """The fence asked right before SMTP's final dot: the same as before the send."""
        return self.worker.lease_left(self.sending_as) > 0

    def send(
        self, started: Started, backend: BaseEmailBackend, server: Server | None = None
    ) -> Settlement:
        """Send one copy on ``backend`` (open, reaching ``server``), under a live lease."""
        if self.worker.lease_left(started.worker_id) <= 0:
            # Declared dead since the claim, or no heartbeat has renewed the
            # lease lately (we were frozen, or Redis is away): the sweeper may
            # already have acted on this row, or may before the send ends.
            logger.warning(
                "delivery %s: no live lease before sending; releasing it", started.delivery.pk
            )
            return Settlement(started, Outcome.RELEASED, "lease expired before sending")
        if server is not None and outbox_settings.RECONCILERS:
            refused = self.note_server(started, server)
            if refused is not None:
                return refused
        self.sending_as = started.worker_id
        if esp.is_anymail(backend) and request.one_request(started.email):
            return self.send_request(started, backend)
        try:
            over_http = esp.is_anymail(backend)
            if over_http and started.email.structure is not None:
                # The valve is on: the caller's message to this row's recipient alone.
                message = request.request_message(
                    started.email, started.attachments, [started.delivery]
                )
            else:
                built = self.worker.emails.builds(started.email)
                message = build_message(started.delivery, started.email, started.attachments, built)
            # The staging valve's guarantee is given here, on the copy as built (mail/valve.py).
            message, note = valve.admit(message, started.delivery.recipient)
            if over_http:
                esp.identify(message, started.delivery.pk, started.token)
            fault("before_send")
            if not self.may_hand_over():
                # The last moment a request can be called back: building the
                # copy took a while, or the process was frozen meanwhile.
                raise SendFencedError("the lease ran out before the request started")
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
        esp_id = esp.esp_message_id(message) if over_http else ""
        return Settlement(started, Outcome.SENT, note, sent_to=sent_to, esp_message_id=esp_id)

    def send_request(self, started: Started, backend: BaseEmailBackend) -> Settlement:
        """Send ``started``'s message to an ESP in one request, with its companions.

        The companions are marked under ``started``'s claim token right before
        the request (``sql.mark_companions``), so that the request is the
        rows' one hand-over: each row is then settled from its recipient's
        status in the answer, or all alike from a failed request. The outcome
        returned is ``started``'s, carrying the companions' (written together).
        """
        now = self.worker.clock.now()
        try:
            marked = mark_companions(started.delivery, started.worker_id, now)
            companions = [
                Started(
                    d,
                    started.email,
                    started.attachments,
                    started.token,
                    started.started,
                    started.worker_id,
                )
                for d in marked
            ]
            # A paused or slowed domain, or a rate limit, holds a companion as it
            # would hold the row alone (each recipient counts): it goes later.
            group = [started] + [c for c in companions if not self.gate.holds(c)]
        except DatabaseError as exc:
            return self.companions_not_marked(started, exc)
        fault("after_mark_companions")
        try:
            message = request.request_message(
                started.email, started.attachments, [s.delivery for s in group]
            )
            esp.identify(message, started.delivery.pk, started.token)
            fault("before_send")
            if not self.may_hand_over():
                raise SendFencedError("the lease ran out before the request started")
            if backend.send_messages([message]) != 1:
                raise DeliveryError("the email backend reported the message as not sent")
        except SendFencedError as exc:
            logger.warning("delivery %s: %s; releasing it", started.delivery.pk, exc)
            why = str(exc)
            return together(group, lambda s: Settlement(s, Outcome.RELEASED, why))
        except Exception as exc:
            self.gate.on_send_error(started, exc, connecting=False)
            return together(group, functools.partial(failure, exc=exc, now=self.worker.clock.now()))
        fault("after_send")
        answer = request.answer_of(message)
        return together(
            group, functools.partial(from_answer, answer=answer, now=self.worker.clock.now())
        )

    def companions_not_marked(self, started: Started, exc: DatabaseError) -> Settlement:
        """The companions' mark failed: nothing goes; what it may have marked goes back.

        Its reply may have been lost after the commit: the rows it marked are
        set back under the token. If that fails too, they stay ``processing``
        for the sweeper's stuck-rows pass (abandoned under "review", though
        never sent: the rare case a person looks at).
        """
        drop_db_connection()
        why = f"could not mark the rest of its message: {type(exc).__name__}: {exc}"
        try:
            release_companions(started.delivery, self.worker.clock.now())
        except DatabaseError as again:
            drop_db_connection()
            logger.warning(
                "delivery %s: %s; could not undo it: %s", started.delivery.pk, why, again
            )
        return Settlement(started, Outcome.RELEASED, why)

    def note_server(self, started: Started, server: Server) -> Settlement | None:
        """Write the server on the row before the hand-over; a release if that failed.

        Only a reconciler reads it (a log lacks the message: was that log the
        server's?), so it costs its one UPDATE per message only when
        ``OUTBOX["RECONCILERS"]`` is set. Nothing was handed over yet: a
        row that is not ours any more, or a database that refuses, releases
        the message unsent.
        """
        try:
            ours = note_server(started.delivery.pk, started.token, server.host, server.address)
        except DatabaseError as exc:
            return Settlement(started, Outcome.RELEASED, f"could not note the server: {exc}")
        if not ours:
            return Settlement(started, Outcome.RELEASED, "settled elsewhere before the send")
        fault("after_note_server")
        return None

    def idle(self, paused: bool) -> None:
        """The thread is about to idle: close connections that have idled a while."""
        # Rather than let the server time us out mid-send.
        if paused or time.monotonic() - self.last_send >= KEEP_OPEN_SECONDS:
            self.connections.close_open()

    def close_mailers(self) -> None:
        """The thread stops: close the mailers' connections (its owner closes the default)."""
        self.connections.close_mailers()


def together(group: list[Started], outcome: Callable[[Started], Settlement]) -> Settlement:
    """The outcome of each row of one request: the first's, carrying the others'.

    The rows retried are due again at one time (the first's backoff), so that
    the retry is again one request for all of them.
    """
    lead, *companions = outcomes = [outcome(s) for s in group]
    retry_at = next((s.retry_at for s in outcomes if s.outcome == Outcome.RETRY), None)
    for s in outcomes:
        if s.outcome == Outcome.RETRY:
            s.retry_at = retry_at
    lead.companions = companions
    return lead
