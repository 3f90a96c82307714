"""Automatic settlement of ``abandoned`` rows: the sweeper asks the reconcilers.

Each sweep pass (see :mod:`outbox.sweeper`) takes up to ``RECONCILE_BATCH``
abandoned rows, oldest first, and asks every class of
``OUTBOX["RECONCILERS"]`` about all of them at once
(:mod:`outbox.reconcilers`). The answers are combined per row:

- any reconciler says **sent**: the row becomes ``sent``. "Sent" wins over
  "not sent": sending twice is the one mistake the outbox must not make.
- otherwise one says **not sent**: the row is requeued, if the policy allows
  it: under ``ABANDONED_POLICY`` "review" only when that reconciler is *sure*,
  and only while the row has attempts left (else it stays for a person).
- otherwise (or a reconciler raised: logged, taken as "unknown"): the row is
  left for a person.

Each settlement is one transaction with one conditional UPDATE
(``WHERE status = 'abandoned' AND claim_token = <the token the row had when
asked>``), through :func:`outbox.operations.transition`, which the admin's
actions use too, plus one Attempt row whose actor is
``reconciler:<dotted path>`` and whose error is the reconciler's evidence. A
row an operator settled (or requeued, and a worker abandoned again)
meanwhile no longer matches and is left alone. Requeued rows are pushed to
Redis after the commit.

Not asking forever: a row left unsettled is remembered in the Redis sorted
set ``{p}:reconcile-asked`` (id -> Redis time) and not asked again for
``RECONCILE_RETRY_AFTER`` seconds; rows abandoned more than
``RECONCILE_MAX_AGE`` seconds ago are not asked at all (the logs that could
settle them have rotated away; a person does). If Redis loses the set, the
rows are merely asked again: answers change nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, cast

from django.db.models import F, Q
from django.utils.module_loading import import_string

from .. import operations, transitions
from ..conf import outbox_settings
from ..models import Attempt, Delivery
from ..queue.clock import from_timestamp
from ..queue.reliable import RedisQueue
from ..reconcilers import UNKNOWN, Answer, Question, Verdict

logger = logging.getLogger("outbox.sweeper.reconcile")

Status = Delivery.Status
Outcome = Attempt.Outcome

_PAGE = 500


@dataclass
class ReconcileReport:
    asked: int = 0
    sent: int = 0
    requeued: int = 0
    left: int = 0  # unknown, not sure enough, or settled elsewhere meanwhile
    errors: list[str] = field(default_factory=list)


@cache
def _load(path: str) -> Any:
    return import_string(path)


def reconcile(queue: RedisQueue, policy: str) -> ReconcileReport:
    """Ask the reconcilers about the oldest abandoned rows and settle what they know."""
    report = ReconcileReport()
    if not outbox_settings.RECONCILERS:
        return report
    now = queue.time()
    rows = _candidates(queue, now)
    if not rows:
        return report
    questions = [Question(**{name: row[name] for name in _QUESTION}) for row in rows]
    answers = _ask_all(questions, report)
    tokens = {row["delivery_id"]: row["claim_token"] for row in rows}
    unsettled: list[int] = []
    for question in questions:
        path, answer = combine(answers, question.delivery_id)
        if not _settle(
            question.delivery_id, tokens[question.delivery_id], path, answer, policy, now, report
        ):
            unsettled.append(question.delivery_id)
    report.asked = len(questions)
    report.left = len(unsettled)
    if unsettled:
        queue.redis.zadd(queue.reconcile_key, dict.fromkeys((str(pk) for pk in unsettled), now))
    return report


# The Question's fields, each the name of a column _candidates() reads.
_QUESTION = tuple(f.name for f in fields(Question))


def _candidates(queue: RedisQueue, now: float) -> list[Mapping[str, Any]]:
    """Up to RECONCILE_BATCH abandoned rows, oldest first, not asked recently."""
    queue.redis.zremrangebyscore(
        queue.reconcile_key, "-inf", now - outbox_settings.RECONCILE_RETRY_AFTER
    )
    recent = {int(i) for i in cast(list[bytes], queue.redis.zrange(queue.reconcile_key, 0, -1))}
    rows = Delivery.objects.abandoned().filter(
        updated_at__gte=from_timestamp(now - outbox_settings.RECONCILE_MAX_AGE)
    )
    # The Question's fields by name, and the claim token. An abandoned row
    # keeps its worker_id (only a return to queued clears it).
    columns = rows.values(
        "message_id",
        "recipient",
        "worker_id",
        "server_host",
        "server_address",
        "claim_token",
        delivery_id=F("pk"),
        started_at=F("processing_started_at"),
        abandoned_at=F("updated_at"),
        mailer=F("email__mailer"),
    )
    chosen: list[Mapping[str, Any]] = []
    after: tuple[Any, int] | None = None
    limit = outbox_settings.RECONCILE_BATCH
    while len(chosen) < limit:
        page_rows = columns.order_by("updated_at", "pk")
        if after is not None:
            page_rows = page_rows.filter(
                Q(updated_at__gt=after[0]) | Q(updated_at=after[0], pk__gt=after[1])
            )
        page = list(page_rows[:_PAGE])
        if not page:
            break
        after = (page[-1]["abandoned_at"], page[-1]["delivery_id"])
        chosen += [row for row in page if row["delivery_id"] not in recent][: limit - len(chosen)]
    return chosen


def _ask_all(
    questions: Sequence[Question], report: ReconcileReport
) -> list[tuple[str, dict[int, Answer]]]:
    answers: list[tuple[str, dict[int, Answer]]] = []
    for path in outbox_settings.RECONCILERS:
        try:
            reconciler = _load(path)()
            answers.append((path, dict(reconciler.answer_many(questions))))
        except Exception as exc:  # a broken reconciler must not stop the sweep
            logger.exception("reconciler %s raised; its answers count as unknown", path)
            report.errors.append(f"reconciler {path}: {type(exc).__name__}: {exc}")
    return answers


def combine(answers: list[tuple[str, dict[int, Answer]]], delivery_id: int) -> tuple[str, Answer]:
    """The deciding ``(reconciler path, answer)`` for one row: sent > not sent (sure first) > unknown."""
    best: tuple[str, Answer] = ("", UNKNOWN)
    rank = {Verdict.UNKNOWN: 0, Verdict.NOT_SENT: 1}
    for path, by_id in answers:
        answer = by_id.get(delivery_id, UNKNOWN)
        if not isinstance(answer, Answer):
            logger.error("reconciler %s gave %r, not an Answer: taken as unknown", path, answer)
            continue
        if answer.verdict is Verdict.SENT:
            if best[1].verdict is Verdict.NOT_SENT:
                logger.warning(
                    "delivery %s: %s says sent, %s says not sent: settled as sent",
                    delivery_id,
                    path,
                    best[0],
                )
            return path, answer
        score = rank[answer.verdict] + (0.5 if answer.sure else 0)
        best_score = rank.get(best[1].verdict, 0) + (0.5 if best[1].sure else 0)
        if score > best_score:
            best = (path, answer)
    return best


def _settle(
    pk: int,
    token: Any,
    path: str,
    answer: Answer,
    policy: str,
    now: float,
    report: ReconcileReport,
) -> bool:
    """One conditional transition for one row; True if the row was settled."""
    actor = f"reconciler:{path}"
    same_claim = Q(claim_token=token) if token is not None else Q(claim_token__isnull=True)
    when = from_timestamp(now)
    if answer.verdict is Verdict.SENT:
        result = operations.transition(
            [pk],
            transitions.MARK_SENT,
            actor=actor,
            error=answer.evidence,
            condition=same_claim,
            now=when,
        )
        report.sent += len(result.changed)
        return bool(result.changed)
    if answer.verdict is Verdict.NOT_SENT and (answer.sure or policy == "requeue"):
        result = operations.transition(
            [pk],
            transitions.REQUEUE_NOT_SENT,
            actor=actor,
            error=answer.evidence,
            condition=same_claim & Q(attempts__lt=F("max_attempts")),
            now=when,
        )
        report.requeued += len(result.changed)
        return bool(result.changed)
    return False
