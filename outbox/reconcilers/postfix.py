"""``PostfixLogReconciler``: settle abandoned rows from Postfix's own mail log."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from ..conf import outbox_settings
from .base import UNKNOWN, Answer, Question, Reconciler
from .evidence import Handover, handovers, log_host_matches, same_server
from .postfix_log import LogScan, host_zone, scan

logger = logging.getLogger("outbox.sweeper.reconcile")


class PostfixLogReconciler(Reconciler):
    """Answers from Postfix's mail log (``OUTBOX["POSTFIX_LOG"]``, rotated copies too).

    For projects that deliver through the local Postfix (``sendmail`` or SMTP
    to localhost). For each abandoned row, by its Message-ID and recipient:

    - A ``cleanup`` line names the Message-ID and a delivery agent (``smtp``,
      ``lmtp``, ``local``, ``virtual``, ``pipe``) logged ``status=...`` for the
      recipient under that queue id: **sent**, whatever the status.
      ``status=sent`` is plain. ``status=bounced`` means Postfix took the
      message and the far end refused it: the outbox's handover succeeded,
      and a bounce is no reason to send again. ``status=deferred`` means the
      message sits in Postfix's queue, which owns it from now on.
    - A ``cleanup`` line and a ``qmgr`` "(queue active)" line, but no line for
      the recipient yet: **sent** (committed to Postfix's queue).
    - A ``cleanup`` line only: **unknown** (the submission may have been cut
      before Postfix committed the message).
    - No ``cleanup`` line for the Message-ID: **not sent**, but only if the
      log is shown to be the log of the server the attempt went to: the row
      names that server (its greeting host name and peer address), the log's
      syslog host field is that name, and some other delivery the same
      worker incarnation handed over through the same mailer to that same
      server is in it (:mod:`outbox.reconcilers.evidence`). Otherwise
      **unknown**: the sweeper may read another host's log, the worker may
      hand over to a remote relay, or the mailer's host name may stand for a
      pool of relays. *Sure* only if, besides, the log holds
      Postfix lines from before the attempt started until after the row was
      abandoned and after ``SEND_TIMEOUT`` past the start (an orphaned
      sendmail child may still hand the message over until then); otherwise
      not sure (under "review" the row then waits for a person).
    - The log does not reach back to the attempt, or cannot be read:
      **unknown**.

    The files are read once per sweep pass for all asked rows, oldest first,
    only as far back as the oldest attempt or sibling handover. Traditional
    syslog timestamps (``Nov 23 12:00:01``) are read in
    ``OUTBOX["POSTFIX_LOG_TIME_ZONE"]``, by default this host's zone (not
    ``settings.TIME_ZONE``); RFC 3339 ones carry their zone.
    """

    def __init__(self, path: str | None = None) -> None:
        configured = path or outbox_settings.POSTFIX_LOG
        self.path = Path(configured) if configured else None

    def answer_many(self, questions: Sequence[Question]) -> dict[int, Answer]:
        if not questions:
            return {}
        if self.path is None:
            return {
                q.delivery_id: Answer.unknown("OUTBOX['POSTFIX_LOG'] is not set") for q in questions
            }
        now = timezone.now()
        siblings = handovers(questions)
        handed = [h for group in siblings.values() for h in group]
        since = min(
            [q.started_at or q.abandoned_at for q in questions] + [h.sent_at for h in handed]
        )
        wanted = {q.message_id for q in questions} | {h.message_id for h in handed}
        try:
            log = scan(self.path, wanted, since, now, log_zone())
        except OSError as exc:
            logger.error("cannot read the Postfix log %s: %s", self.path, exc)
            return {q.delivery_id: UNKNOWN for q in questions}
        return {
            q.delivery_id: decide(q, log, siblings.get((q.worker_id, q.mailer), []))
            for q in questions
        }


def log_zone() -> tzinfo:
    """The zone of the log's zone-less timestamps: the setting, else the host's."""
    name = outbox_settings.POSTFIX_LOG_TIME_ZONE
    if not name:
        return host_zone()
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ImproperlyConfigured(
            f"OUTBOX['POSTFIX_LOG_TIME_ZONE'] is {name!r}, not a zone this host knows"
        ) from exc


def decide(question: Question, log: LogScan, siblings: Sequence[Handover] = ()) -> Answer:
    """The rules of :class:`PostfixLogReconciler`, for one row.

    ``siblings``: the other rows the row's incarnation handed over through
    its mailer (:func:`outbox.reconcilers.evidence.handovers`).
    """
    recipient = question.recipient.lower()
    queue_ids = log.queue_ids.get(question.message_id, [])
    for qid in queue_ids:
        for line in log.statuses.get(qid, []):
            if recipient in (line.recipient, line.original):
                return Answer.sent(
                    f"Postfix {line.agent} {qid}: to=<{line.recipient}>, "
                    f"status={line.status} {line.text}".strip()
                )
    for qid in queue_ids:
        if qid in log.committed:
            return Answer.sent(
                f"Postfix queued {question.message_id} as {qid} "
                f"({log.committed[qid].isoformat()}); no delivery line for the recipient yet"
            )
    if queue_ids:
        return Answer.unknown(
            f"Postfix cleanup saw {question.message_id} as {', '.join(queue_ids)}, "
            "but never committed it to its queue"
        )
    return _absent(question, log, siblings)


def _absent(question: Question, log: LogScan, siblings: Sequence[Handover]) -> Answer:
    start = question.started_at or question.abandoned_at
    if log.first is None or log.last is None:
        return Answer.unknown("the Postfix log holds no Postfix lines")
    settled_by = max(question.abandoned_at, start + timedelta(seconds=outbox_settings.SEND_TIMEOUT))
    window = f"the log covers {_iso(log.first)} .. {_iso(log.last)}"
    if not (log.first <= question.abandoned_at and log.last >= start):
        return Answer.unknown(f"{window}, not the attempt's time ({_iso(start)})")
    absent = f"no Postfix cleanup line for {question.message_id}"
    same_server, why = _same_server(question, log, siblings)
    if not same_server:
        return Answer.unknown(f"{absent}, but {why}; {window}")
    if log.first <= start and log.last >= settled_by:
        return Answer.not_sent(
            f"{absent}; {why}; {window}, the attempt {_iso(start)} .. {_iso(settled_by)}",
            sure=True,
        )
    return Answer.not_sent(
        f"{absent}; {why}; but {window}, not the whole attempt {_iso(start)} .. {_iso(settled_by)}",
        sure=False,
    )


def _same_server(
    question: Question, log: LogScan, siblings: Sequence[Handover]
) -> tuple[bool, str]:
    """Whether this log is the one of the server the attempt went to, and why (or why not).

    Three things must hold: the row names the server it was being handed to
    (greeting host name, peer address); every Postfix line of the log comes
    from a host of that name (its syslog host field); and the same
    incarnation handed other messages, through the same mailer, to that same
    server (same host name, same peer address where known), and this log
    shows them accepted. One host name may stand for a pool of relays: a
    relay's log says nothing about the mail another relay took.
    """
    worker = question.worker_id
    via = f"mailer {question.mailer!r}" if question.mailer else "the default mailer"
    if not worker:
        return False, "the row names no worker, so nothing shows this is its server's log"
    if not question.server_host:
        return False, (
            "the row names no server it was handed to (a worker without "
            "OUTBOX['RECONCILERS'], or of an older release), so nothing shows this is "
            "that server's log"
        )
    server = question.server_host + (
        f" ({question.server_address})" if question.server_address else ""
    )
    others = sorted(h for h in log.hosts if not log_host_matches(h, question.server_host))
    if others:
        return False, (
            f"the attempt went to {server}, and this log holds lines of "
            f"{', '.join(others[:3])}: it is not that server's log"
        )
    if not siblings:
        return False, (
            f"worker {worker} marked nothing else sent through {via} near the attempt, "
            "so nothing shows this is the log of the server it handed over to"
        )
    same = [
        h
        for h in siblings
        if same_server(
            h.server_host, h.server_address, question.server_host, question.server_address
        )
    ]
    if not same:
        return False, (
            f"none of the {len(siblings)} other messages worker {worker} sent through "
            f"{via} went to {server}, so nothing shows this is that server's log"
        )
    found = [h.message_id for h in same if log.accepted(h.message_id)]
    if not found:
        return False, (
            f"none of the {len(same)} other messages worker {worker} sent through "
            f"{via} to {server} is in this log: it is not the log of the server it "
            "handed over to"
        )
    return True, (
        f"{len(found)} of {len(same)} other messages worker {worker} sent through {via} "
        f"to {server} are in this log (e.g. {found[0]})"
    )


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")
