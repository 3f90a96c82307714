"""One delivery's attempt in a sender thread: from its marked row to the outcome in hand.

The loop (``loop.SenderLoop``) claims ids and marks a row; what follows is here, top
to bottom, in the order it happens, for one delivery in flight
(:class:`~outbox.worker.inflight.InFlight`):

1. :func:`take_marked_row` puts the row the mark returned on the flight (its
   email and attachments too), or drops a stale id.
2. :meth:`Sender.deliver` takes the mailer's connection and sends: alone
   (:meth:`Sender.send`), or to an ESP with its companions in one request
   (:meth:`Sender.send_request`; each companion a flight of its own,
   :meth:`InFlight.companion`).
3. :meth:`Sender.hand_over` is the hand-over, fenced: a message goes out only
   while the worker's heartbeat lease is live, checked right before the send
   and again right before SMTP's final dot (:func:`~outbox.mail.handover.watch_handover`). A worker
   frozen mid-send and declared dead meanwhile releases the row instead.
4. The outcome (:class:`~outbox.worker.outcomes.Settlement`, naming its flight)
   goes back to the loop as its outcome in hand, settled with the next row's
   mark (:func:`~outbox.worker.outcomes.write_outcome`,
   :class:`~outbox.worker.settling.Settling`); the id is acked with the next claim.

Every outcome names the server the connection reached; with reconcilers
configured, the row names it before the hand-over too. The staging valve looks
at the copy as built. The thread's mail connections live here too: opened on
first use, kept open while mail trickles in, closed once the thread has idled.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from django.core.mail import EmailMessage
from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError, transaction

from .. import tracing
from ..conf import outbox_settings
from ..exceptions import DeliveryError, SendFencedError
from ..mail import esp, request, valve
from ..mail.connection import Server
from ..mail.handover import handover_server
from ..mail.message import build_message
from ..models import Attempt, Delivery, outbox_alias
from . import rows, sql
from .backoff import drop_db_connection
from .connections import Connections
from .faults import fault
from .gate import Gate
from .host import WorkerHost
from .inflight import InFlight
from .outcomes import Settlement, failure, from_answer

logger = logging.getLogger("outbox.worker")

Outcome = Attempt.Outcome
Status = Delivery.Status

# An idle thread keeps its mail connections open this long after its last
# send: mail that trickles in then does not pay a new connection (TCP, the
# greeting, EHLO) per message. The connection waits at most this plus one
# BLOCK_TIMEOUT, far below the minutes servers allow an idle client (RFC 5321
# section 4.5.3.2.7: at least 5), so no server times it out under a send.
KEEP_OPEN_SECONDS = 1.0


def take_marked_row(worker: WorkerHost, flight: InFlight, claimed: rows.MarkedRow | None) -> bool:
    """Put on ``flight`` the row its mark returned; False means a stale id: drop it.

    The mark (its UPDATE) left the row naming the incarnation, the claim
    token and the start time: all the evidence the sweeper needs if we die
    before the settle. ``claimed`` is None when it found nothing to mark: a
    retry whose earlier try committed unseen finds the row ours by its token.
    """
    # No close_old_connections() here: with CONN_MAX_AGE=0 it would open a
    # new connection for every email. The connection lives as long as the
    # thread and is dropped only after a DatabaseError.
    if claimed is None:
        owned = Delivery.objects.filter(
            pk=flight.id, status=Status.PROCESSING, claim_token=flight.token
        ).first()
        if owned is None:
            # A queued row not due yet was pushed early: put it in `scheduled`.
            entry = sql.early_entry(flight.id, worker.clock.now())
            if entry is not None:
                transaction.on_commit(lambda: worker.push_quietly([entry]), using=outbox_alias())
            worker.stats.add("skipped")
            return False
        # Our earlier UPDATE committed; its reply was lost.
        claimed = rows.MarkedRow(owned, None, False)
    if claimed.expired:
        # The mark found it past its expires_at and cancelled it.
        logger.info("delivery %s expired before it was sent; cancelled", flight.id)
        worker.stats.add("skipped")
        return False
    delivery = claimed.delivery
    if claimed.email is not None:
        email, attachments = worker.emails.remember(claimed.email, claimed.has_attachments)
    else:
        email, attachments = worker.emails.content(delivery.email_id)
    flight.take_row(delivery, email, attachments)
    return True


class Sender:
    """One sender thread's mail connections and its sends."""

    def __init__(self, worker: WorkerHost, gate: Gate, backend: BaseEmailBackend | None) -> None:
        self.worker = worker
        self.gate = gate  # told of send errors (slowed domains)
        # The default connection (``backend``; None: created on first use, see
        # connections.Connections) and, created on first use, one per mailer.
        self.connections = Connections(backend, fence=self.may_hand_over)
        self.sending_as = worker.worker_id  # the incarnation the row being sent was marked under
        self.last_send = 0.0  # time.monotonic() when a send last ended

    def deliver(self, flight: InFlight) -> Settlement:
        """Hand the message to its mailer's backend; returns the outcome to write."""
        # A span on the enqueuing request's trace, when OpenTelemetry records (outbox.tracing.sending).
        with tracing.sending(flight.delivery, flight.email) as span:
            settlement = self.deliver_untraced(flight)
            span.settled(settlement)
        return settlement

    def deliver_untraced(self, flight: InFlight) -> Settlement:
        """:meth:`deliver` without its span."""
        try:
            link = self.connections.get(flight.email.mailer)
            link.ensure_open()
        except Exception as exc:
            # Cannot reach the mail server, or the backend cannot be created
            # (this host has no such mailer, a setting is missing: the mailer
            # is paused): nothing was handed over.
            self.gate.on_send_error(flight, exc, connecting=True)
            return self.gate.settled(failure(flight, exc, self.worker.clock.now()))
        server = handover_server(link.backend)
        # A mailer whose ESP refused its credential is paused (gate.Gate.settled).
        settlement = self.gate.settled(self.send(flight, link.backend, server))
        settlement.server = server
        self.last_send = time.monotonic()
        if settlement.outcome not in (Outcome.SENT, Outcome.CANCELLED):
            link.close()
        return settlement

    def may_hand_over(self) -> bool:
        """The fence asked right before SMTP's final dot: the same as before the send."""
        return self.worker.lease_left(self.sending_as) > 0

    def send(
        self, flight: InFlight, backend: BaseEmailBackend, server: Server | None = None
    ) -> Settlement:
        """Send one copy on ``backend`` (open, reaching ``server``), under a live lease."""
        if self.worker.lease_left(flight.worker_id) <= 0:
            # Declared dead since the claim, or no heartbeat has renewed the
            # lease lately (we were frozen, or Redis is away): the sweeper may
            # already have acted on this row, or may before the send ends.
            logger.warning(
                "delivery %s: no live lease before sending; releasing it", flight.delivery.pk
            )
            return Settlement(flight, Outcome.RELEASED, "lease expired before sending")
        if server is not None and outbox_settings.RECONCILERS:
            refused = self.note_server(flight, server)
            if refused is not None:
                return refused
        self.sending_as = flight.worker_id
        if esp.is_anymail(backend) and request.one_request(flight.email):
            return self.send_request(flight, backend)
        try:
            over_http = esp.is_anymail(backend)
            if over_http and flight.email.structure is not None:
                # The valve is on: the caller's message to this row's recipient alone.
                message = request.request_message(
                    flight.email, flight.attachments, [flight.delivery]
                )
            else:
                built = self.worker.emails.builds(flight.email)
                message = build_message(flight.delivery, flight.email, flight.attachments, built)
            # The staging valve's guarantee is given here, on the copy as built (valve.admit).
            message, note = valve.admit(message, flight.delivery.recipient)
            if over_http:
                esp.identify(message, flight.delivery.pk, flight.token)
            self.hand_over(backend, message)
        except valve.NotAllowedRecipient as exc:
            return Settlement(flight, Outcome.CANCELLED, str(exc))
        except SendFencedError as exc:
            logger.warning("delivery %s: %s; releasing it", flight.delivery.pk, exc)
            return Settlement(flight, Outcome.RELEASED, str(exc))
        except Exception as exc:
            self.gate.on_send_error(flight, exc, connecting=False)
            return failure(flight, exc, self.worker.clock.now())
        fault("after_send")
        # A redirected copy went to its one envelope address, not the row's recipient.
        sent_to = ", ".join(message.recipients()) if note else ""
        esp_id = esp.esp_message_id(message) if over_http else ""
        return Settlement(flight, Outcome.SENT, note, sent_to=sent_to, esp_message_id=esp_id)

    def hand_over(self, backend: BaseEmailBackend, message: EmailMessage) -> None:
        """Give ``message`` to ``backend``, fenced; raises if it did not take it.

        The fence here is the last moment a request can be called back:
        building the copy took a while, or the process was frozen meanwhile.
        Over SMTP the connection asks it once more before the final dot
        (:meth:`may_hand_over`, passed to ``Connections``).
        """
        fault("before_send")
        if not self.may_hand_over():
            raise SendFencedError("the lease ran out before the request started")
        if backend.send_messages([message]) != 1:
            raise DeliveryError("the email backend reported the message as not sent")

    def send_request(self, flight: InFlight, backend: BaseEmailBackend) -> Settlement:
        """Send ``flight``'s message to an ESP in one request, with its companions.

        The companions are marked under ``flight``'s claim token right before
        the request (``sql.mark_companions``), so that the request is the
        rows' one hand-over: each row is then settled from its recipient's
        status in the answer, or all alike from a failed request. The outcome
        returned is ``flight``'s, carrying the companions' (written together).
        """
        now = self.worker.clock.now()
        try:
            marked = sql.mark_companions(flight.delivery, flight.worker_id, now)
            companions = [flight.companion(d) for d in marked]
            # A paused or slowed domain, or a rate limit, holds a companion as it
            # would hold the row alone (each recipient counts): it goes later.
            group = [flight] + [c for c in companions if not self.gate.holds(c)]
        except DatabaseError as exc:
            return self.companions_not_marked(flight, exc)
        fault("after_mark_companions")
        try:
            message = request.request_message(
                flight.email, flight.attachments, [f.delivery for f in group]
            )
            esp.identify(message, flight.delivery.pk, flight.token)
            self.hand_over(backend, message)
        except SendFencedError as exc:
            logger.warning("delivery %s: %s; releasing it", flight.delivery.pk, exc)
            why = str(exc)
            return together(group, lambda f: Settlement(f, Outcome.RELEASED, why))
        except Exception as exc:
            self.gate.on_send_error(flight, exc, connecting=False)
            return together(group, functools.partial(failure, exc=exc, now=self.worker.clock.now()))
        fault("after_send")
        answer = request.answer_of(message)
        return together(
            group, functools.partial(from_answer, answer=answer, now=self.worker.clock.now())
        )

    def companions_not_marked(self, flight: InFlight, exc: DatabaseError) -> Settlement:
        """The companions' mark failed: nothing goes; what it may have marked goes back.

        Its reply may have been lost after the commit: the rows it marked are
        set back under the token. If that fails too, they stay ``processing``
        for the sweeper's stuck-rows pass (abandoned under "review", though
        never sent: the rare case a person looks at).
        """
        drop_db_connection()
        why = f"could not mark the rest of its message: {type(exc).__name__}: {exc}"
        try:
            sql.release_companions(flight.delivery, self.worker.clock.now())
        except DatabaseError as again:
            drop_db_connection()
            logger.warning("delivery %s: %s; could not undo it: %s", flight.delivery.pk, why, again)
        return Settlement(flight, Outcome.RELEASED, why)

    def note_server(self, flight: InFlight, server: Server) -> Settlement | None:
        """Write the server on the row before the hand-over; a release if that failed.

        Only a reconciler reads it (a log lacks the message: was that log the
        server's?), so it costs its one UPDATE per message only when
        ``OUTBOX["RECONCILERS"]`` is set. Nothing was handed over yet: a
        row that is not ours any more, or a database that refuses, releases
        the message unsent.
        """
        try:
            ours = sql.note_server(flight.delivery.pk, flight.token, server.host, server.address)
        except DatabaseError as exc:
            return Settlement(flight, Outcome.RELEASED, f"could not note the server: {exc}")
        if not ours:
            return Settlement(flight, Outcome.RELEASED, "settled elsewhere before the send")
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


def together(group: list[InFlight], outcome: Callable[[InFlight], Settlement]) -> Settlement:
    """The outcome of each row of one request: the first's, carrying the others'.

    The rows retried are due again at one time (the first's backoff), so that
    the retry is again one request for all of them.
    """
    lead, *companions = outcomes = [outcome(f) for f in group]
    retry_at = next((s.retry_at for s in outcomes if s.outcome == Outcome.RETRY), None)
    for s in outcomes:
        if s.outcome == Outcome.RETRY:
            s.retry_at = retry_at
    lead.companions = companions
    return lead
