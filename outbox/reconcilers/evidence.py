"""Which server's record can answer for an abandoned row: its worker's other handovers.

A sweeper may run on any host, and a worker may hand its mail to a remote
relay, so a mail log that lacks a Message-ID proves nothing by itself: it
may be another server's log. Within one worker incarnation a mailer's
settings are fixed (read once per process), but its host name may stand for
a pool of relays (several A records, a load balancer, a Kubernetes Service):
each new connection may reach another server. So each row names the server
its attempt was handing it to (``Delivery.server_host``/``server_address``,
written before SMTP's final dot: ``outbox.worker.sql.note_server``), and
only the incarnation's other rows that went through the same mailer *to that
same server* count. A log that shows some of them is that server's log; one
that shows none of them, or a worker that handed nothing else to that
server, proves nothing (:mod:`outbox.reconcilers.postfix` says the rest).

One query per sweep pass, over the ``sent_at`` index: no per-email work, and
nothing on the worker's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber

from ..models import Delivery
from .base import Question

# How far before an attempt a sibling handover may lie, and how many of the
# latest an incarnation's mailer contributes: one found in the log is enough.
LOOKBACK = timedelta(hours=1)
PER_MAILER = 10


@dataclass(frozen=True)
class Handover:
    """A delivery the same incarnation marked sent through the same mailer."""

    message_id: str
    sent_at: datetime
    server_host: str = ""  # where it was handed over; "" if the row does not say
    server_address: str = ""


Key = tuple[str, str]  # (worker incarnation, mailer)


def handovers(
    questions: Sequence[Question], lookback: timedelta = LOOKBACK, per_mailer: int = PER_MAILER
) -> dict[Key, list[Handover]]:
    """The latest sent rows of each asked incarnation and mailer, newest first.

    Only rows sent from ``lookback`` before the incarnation's first asked
    attempt until its last abandonment: near the attempt, so the log read for
    the attempt holds them if it is the right log.
    """
    windows: dict[str, tuple[datetime, datetime]] = {}
    for q in questions:
        if not q.worker_id:
            continue
        lo = (q.started_at or q.abandoned_at) - lookback
        old_lo, old_hi = windows.get(q.worker_id, (lo, q.abandoned_at))
        windows[q.worker_id] = (min(old_lo, lo), max(old_hi, q.abandoned_at))
    if not windows:
        return {}
    match = Q()
    for worker_id, (lo, hi) in windows.items():
        match |= Q(worker_id=worker_id, sent_at__gte=lo, sent_at__lte=hi)
    rows = (
        Delivery.objects.filter(match, status=Delivery.Status.SENT)
        .annotate(
            via=F("email__mailer"),
            rank=Window(
                RowNumber(),
                partition_by=[F("worker_id"), F("email__mailer")],
                order_by=F("sent_at").desc(),
            ),
        )
        .filter(rank__lte=per_mailer)
        .order_by("-sent_at")
        .values_list("worker_id", "via", "message_id", "sent_at", "server_host", "server_address")
    )
    found: dict[Key, list[Handover]] = {}
    for worker_id, mailer, message_id, sent_at, host, address in rows:
        if sent_at is None:  # excluded by the filter; for the type checker
            continue
        found.setdefault((worker_id, mailer or ""), []).append(
            Handover(message_id, sent_at, host, address)
        )
    return found


def same_server(a_host: str, a_address: str, b_host: str, b_address: str) -> bool:
    """Two handovers went to one server: the same greeting host name (required), and
    the same peer address where both are known."""
    if not a_host or not b_host or _name(a_host) != _name(b_host):
        return False
    return not a_address or not b_address or a_address == b_address


def log_host_matches(log_host: str, server_host: str) -> bool:
    """Whether a syslog host field names the server that greeted as ``server_host``.

    Syslog writes the short host name by default, a server greets with its
    full one: ``mx1`` matches ``mx1.example.com``; ``mx2`` does not.
    """
    log, server = _name(log_host), _name(server_host)
    if not log or not server:
        return False
    return log == server or log == server.split(".", 1)[0] or server == log.split(".", 1)[0]


def _name(host: str) -> str:
    return host.strip().rstrip(".").lower()
