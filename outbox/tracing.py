"""Traces with OpenTelemetry, optional: the request that enqueues and the worker's send, one trace.

Installed with the extra (``pip install django-email-outbox[opentelemetry]``,
the API package only: the site brings its SDK and exporter), and without a
setting: what is traced follows the site's TracerProvider. Without the
package every function here is one constant check.

- **Enqueue** (:func:`carrier`): when the code that enqueues runs in a span
  that records, its trace context (W3C ``traceparent``/``tracestate``, as the
  configured propagator writes it, ``baggage`` left out: it is the
  application's data, not the trace's) is stored on the email
  (``Email.trace_context``); otherwise nothing is stored.
- **Send** (:func:`sending`): the worker's hand-over of a delivery is a span
  ``outbox send`` of kind CLIENT, a child of the stored context: a request
  to a mail server or an ESP answered before the span ends, whose server does
  not carry the context further (the message's creation context is the
  enqueuing request's, stored with it; so not PRODUCER, by OpenTelemetry's
  messaging conventions). Its attributes, under ``outbox.``: ``delivery.id``,
  ``email.id``, ``mailer`` ("" is the worker's default), ``attempt``,
  ``recipient.domain`` (never the address) and ``outcome``; and
  ``server.address``. An outcome other than ``sent`` (a retry, a failure, in
  doubt, ...) is also an event on it, a retry's with its ``retry_at``.
- **Settlements** (:func:`settled`): a change made outside the worker (the
  sweeper's abandonment of a worker gone mid-send, and the settlement by an
  operator, a reconciler or an ESP's event: ``operations.transition``) is a
  short span ``outbox <outcome>`` (``outbox abandoned``,
  ``outbox marked_sent``, ...), a child of the stored context, with
  ``actor`` (its kind: ``admin``, ``sweeper``, ``reconciler``,
  ``esp``). A span, not a span event: an event needs a live span, and the
  request's and the send's ended long before, in other processes. Emails
  stored without a context get none.

The worker reads the stored context with one query per email (cached), only
while its TracerProvider is a real one: the step's statements do not return it.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from django.db import DatabaseError, connections

from .models import Delivery, Email, outbox_alias
from .statements import postgresql, sqlite
from .validation.addresses import bare_address

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: nothing is traced
    trace = None  # type: ignore[assignment]
    _TRACER: Any = None
else:
    # A proxy until the site sets its TracerProvider, then that provider's tracer.
    _TRACER = trace.get_tracer("outbox")

# The context keys stored; those of the default propagators are "traceparent"
# and "tracestate" (W3C Trace Context) and "baggage", which is left out.
_LEFT_OUT = ("baggage",)


def carrier() -> dict[str, str] | None:
    """The current trace context as the propagator writes it; None outside a recording span."""
    if trace is None or not trace.get_current_span().is_recording():
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    for key in _LEFT_OUT:
        headers.pop(key, None)
    return headers or None


class Settled(Protocol):
    """What :meth:`Send.settled` reads of the worker's outcome."""

    outcome: str
    retry_at: datetime | None
    server: Any  # outbox.mail.connection.Server (host, address) or None


class Send:
    """The span of one hand-over, current while it runs; nothing when not traced."""

    def __init__(self, delivery: Delivery | None = None, email: Email | None = None) -> None:
        self.delivery = delivery
        self.email = email
        self.scope: Any = None
        self.span: Any = None

    def __enter__(self) -> Send:
        if self.delivery is None or self.email is None:
            return self
        self.scope = _TRACER.start_as_current_span(
            "outbox send",
            context=propagate.extract(_context(self.email.pk) or {}),
            kind=trace.SpanKind.CLIENT,
            attributes={
                **_delivery_attributes(self.delivery.pk, self.delivery.recipient),
                "outbox.email.id": self.email.pk,
                "outbox.mailer": self.email.mailer,
                "outbox.attempt": self.delivery.attempts,
            },
        )
        self.span = self.scope.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.scope is not None:
            self.scope.__exit__(kind, exc, tb)

    def settled(self, settlement: Settled) -> None:
        """Name the hand-over's outcome on the span (and, unless sent, as an event)."""
        if self.span is None:
            return
        outcome = str(settlement.outcome)
        self.span.set_attribute("outbox.outcome", outcome)
        if settlement.server is not None and settlement.server.host:
            self.span.set_attribute("server.address", settlement.server.host)
        if outcome != "sent":
            at = settlement.retry_at
            self.span.add_event(
                f"outbox {outcome}", {"outbox.retry_at": at.isoformat()} if at else {}
            )


_UNTRACED = Send()


def sending(delivery: Delivery, email: Email) -> Send:
    """``with sending(delivery, email) as span:`` the hand-over; then ``span.settled(outcome)``."""
    if trace is None or not _provided():
        return _UNTRACED
    return Send(delivery, email)


def settled(ids: list[int], outcome: str, actor: str) -> None:
    """A short span per row of ``ids`` settled ``outcome`` by ``actor``, on its email's trace.

    Called after the commit (``operations.transition``); one query for the
    rows' stored contexts, and only while a TracerProvider is set.
    """
    if trace is None or not ids or not _provided():
        return
    rows = (
        Delivery.objects.filter(pk__in=ids, email__trace_context__isnull=False)
        .values_list("pk", "recipient", "attempts", "email__mailer", "email__trace_context")
        .iterator()
    )
    kind = actor.split(":", 1)[0]  # "admin:<user>": the user's name stays out
    for pk, recipient, attempts, mailer, context in rows:
        _TRACER.start_span(
            f"outbox {outcome}",
            context=propagate.extract(context),
            kind=trace.SpanKind.INTERNAL,
            attributes={
                **_delivery_attributes(pk, recipient),
                "outbox.mailer": mailer,
                "outbox.attempt": attempts,
                "outbox.outcome": outcome,
                "outbox.actor": kind,
            },
        ).end()


def _delivery_attributes(pk: int, recipient: str) -> dict[str, Any]:
    address = bare_address(recipient)
    return {"outbox.delivery.id": pk, "outbox.recipient.domain": address.rpartition("@")[2]}


def _provided() -> bool:
    """Whether a TracerProvider is set: the API's own ones record nothing."""
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def _context(email_id: int) -> dict[str, str] | None:
    try:
        return _stored(email_id)
    except DatabaseError:  # a trace is never worth a send: that one goes untraced
        return None


@functools.lru_cache(maxsize=4096)
def _stored(email_id: int) -> dict[str, str] | None:
    """An email's stored trace context; it never changes once written.

    One plain statement (``TRACE_CONTEXT``): the ORM's building of the same
    query cost the worker more than running it.
    """
    connection = connections[outbox_alias()]
    statements = postgresql if connection.vendor == "postgresql" else sqlite
    with connection.cursor() as cursor:
        cursor.execute(statements.TRACE_CONTEXT, [email_id])
        row = cursor.fetchone()
    value = row[0] if row else None
    # A plain cursor returns JSON columns as text (Django's loader on PostgreSQL).
    return json.loads(value) if isinstance(value, str | bytes) else value
