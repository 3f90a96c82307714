"""The worker's step: step 4 (success) of the message in hand plus step 2 (mark) of the next.

On PostgreSQL the worker runs it through the PL/pgSQL function ``outbox_step``
(several threads' steps through ``outbox_steps``), which migration 0017
creates; on SQLite as two statements on the DB-API connection. Each case puts
two identical rows in the same state, steps one way and the other (the
worker's statements one by one, the transitions SENT and MARK and ``EMAIL``, in Django's
atomic()), and compares what came back and what the rows hold afterwards.
(The plain-statement form of the step on PostgreSQL was retired after the
measurement in ``tests/benchmark/results/paths-postgres.md``.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Delivery, Email
from outbox.worker import rows, sql

Status = Delivery.Status
TOKEN = uuid.UUID(int=1)
OTHER_TOKEN = uuid.UUID(int=2)
BEFORE = timezone.now() - timedelta(hours=1)

# The columns a step may change, compared row against row.
COLUMNS = (
    "status",
    "attempts",
    "worker_id",
    "claim_token",
    "processing_started_at",
    "sent_at",
    "updated_at",
    "last_error",
)


def _row(
    state: str,
    *,
    due: bool = True,
    attachments: bool = False,
    expired: bool = False,
    mailer: str = "",
) -> Delivery:
    """A fresh delivery in ``state``, claimed with TOKEN when processing."""
    kwargs: dict[str, Any] = {}
    if attachments:
        kwargs["attachments"] = [("a.txt", b"x", "text/plain")]
    if not due:
        kwargs["send_at"] = timezone.now() + timedelta(days=1)
    (delivery,) = enqueue_email("s", "b", "from@example.com", ["to@example.com"], **kwargs)
    extra: dict[str, Any] = {}
    if expired:  # enqueue refuses a past expires_at; a row may still wait past it
        extra["expires_at"] = BEFORE
    if mailer:  # the statements carry any name; enqueue's validation is tested elsewhere
        Email.objects.filter(pk=delivery.email_id).update(mailer=mailer)
    # The same updated_at on every row, so that an untouched row compares equal.
    Delivery.objects.filter(pk=delivery.pk).update(
        **extra,
        status=state,
        claim_token=TOKEN if state == Status.PROCESSING else None,
        worker_id="w#old" if state == Status.PROCESSING else "",
        updated_at=BEFORE,
    )
    return delivery


def _outcome(result: tuple[int, rows.MarkedRow | None]) -> tuple[Any, ...]:
    settled, claimed = result
    if claimed is None:
        return (settled, None)
    d, email = claimed.delivery, claimed.email
    content = None
    if email is not None:
        content = (
            email.subject,
            email.body,
            email.from_email,
            email.reply_to,
            email.headers,
            email.mailer,
        )
    return (
        settled,
        (d.recipient, d.priority, d.attempts, d.max_attempts, d.email_id is not None),
        content,
        claimed.has_attachments,
        claimed.expired,
    )


def _state(pk: int) -> dict[str, Any]:
    return Delivery.objects.filter(pk=pk).values(*COLUMNS).get()


# Each case: (name, how to build the rows, the step to run: (settle row, claim row) -> args)
Setup = Callable[[], tuple[Delivery | None, Delivery | None]]


def _claim(state: str, **kw: Any) -> Setup:
    return lambda: (None, _row(state, **kw))


def _settle(state: str) -> Setup:
    return lambda: (_row(state), None)


CASES: list[tuple[str, Setup, uuid.UUID, bool]] = [
    ("claim a due queued row", _claim(Status.QUEUED), TOKEN, False),
    ("claim a due row whose email is cached", _claim(Status.QUEUED), TOKEN, True),
    ("claim a due row with attachments", _claim(Status.QUEUED, attachments=True), TOKEN, False),
    ("claim a row not yet due", _claim(Status.QUEUED, due=False), TOKEN, False),
    ("claim a due row past its expiry", _claim(Status.QUEUED, expired=True), TOKEN, False),
    ("claim a due row with a mailer", _claim(Status.QUEUED, mailer="bulk"), TOKEN, False),
    (
        "settle one row and claim the next, with a mailer",
        lambda: (_row(Status.PROCESSING), _row(Status.QUEUED, mailer="bulk")),
        TOKEN,
        False,
    ),
    (
        "settle one row and claim the next, expired",
        lambda: (_row(Status.PROCESSING), _row(Status.QUEUED, expired=True)),
        TOKEN,
        False,
    ),
    *[
        (f"claim a {state} row", _claim(state), TOKEN, False)
        for state in (
            Status.PROCESSING,
            Status.SENT,
            Status.FAILED,
            Status.ABANDONED,
            Status.CANCELLED,
        )
    ],
    ("settle our processing row", _settle(Status.PROCESSING), TOKEN, False),
    ("settle with another attempt's token", _settle(Status.PROCESSING), OTHER_TOKEN, False),
    *[
        (f"settle a row that is {state}", _settle(state), TOKEN, False)
        for state in (Status.QUEUED, Status.ABANDONED, Status.SENT, Status.FAILED)
    ],
    (
        "settle one row and claim the next",
        lambda: (_row(Status.PROCESSING), _row(Status.QUEUED)),
        TOKEN,
        False,
    ),
    (
        "settle a stolen row and claim the next",
        lambda: (_row(Status.ABANDONED), _row(Status.QUEUED)),
        TOKEN,
        False,
    ),
]


def _step(fast: bool, settle, claim_id, token, now, known):
    """One step as the worker runs it (fast), or its statements one by one; as the worker sees it."""
    if fast:
        return sql.run_steps([sql.Step(settle, claim_id, "w#new", token, now, known)])[0]
    with transaction.atomic():
        settled = sql.mark_sent(settle[0], settle[1], now) if settle is not None else 0
        claimed = sql.mark_row(claim_id, "w#new", token, now) if claim_id else None
    if claimed is not None and not claimed.expired and claimed.delivery.email_id != known:
        email, attachments = sql.load_email(claimed.delivery.email_id)
        claimed = rows.MarkedRow(claimed.delivery, email, attachments, claimed.expired)
    return settled, claimed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("setup", "settle_token", "cached"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_step_and_its_statements_one_by_one_agree(request, setup, settle_token, cached):
    # A little ahead, so that rows created below are due on SQLite too (where
    # the worker's clock, passed in, decides what is due).
    now = timezone.now() + timedelta(seconds=5)
    results = []
    for fast in (True, False):
        settle, claim = setup()
        known = claim.email_id if (claim is not None and cached) else 0
        result = _step(
            fast,
            (settle.pk, settle_token) if settle is not None else None,
            claim.pk if claim is not None else None,
            TOKEN,
            now,
            known,
        )
        rows = [_state(r.pk) if r is not None else None for r in (settle, claim)]
        results.append((_outcome(result), rows))
    (by_fast, fast_rows), (by_plain, plain_rows) = results
    assert by_fast == by_plain
    if "claim a due" in request.node.name or "claim the next" in request.node.name:
        assert by_fast[1] is not None  # the case really claimed
    if "with a mailer" in request.node.name:
        assert by_fast[2][-1] == "bulk"  # the mailer came back with the content
    assert fast_rows == plain_rows


@pytest.mark.django_db(transaction=True)
def test_steps_written_together_give_each_step_its_result_alone():
    """The group commit's batch: every case of CASES in one transaction.

    Each step's result and rows must be what the same step gives alone; a row
    two steps of one batch both claim goes to one of them only.
    """
    # One clock for both runs, so that their rows compare equal; minutes ahead, so that
    # every row the second setup writes is due by it, however slow the machine.
    now = timezone.now() + timedelta(minutes=5)

    def steps_for_every_case() -> tuple[list[sql.Step], list[list[Delivery | None]]]:
        steps, rows = [], []
        for _name, setup, settle_token, cached in CASES:
            settle, claim = setup()
            known = claim.email_id if (claim is not None and cached) else 0
            steps.append(
                sql.Step(
                    (settle.pk, settle_token) if settle is not None else None,
                    claim.pk if claim is not None else None,
                    "w#new",
                    TOKEN,
                    now,
                    known,
                )
            )
            rows.append([settle, claim])
        return steps, rows

    steps, rows = steps_for_every_case()
    alone = [sql.run_steps([step])[0] for step in steps]
    alone_rows = [[_state(r.pk) if r else None for r in pair] for pair in rows]
    steps, rows = steps_for_every_case()
    together = sql.run_steps(steps)
    together_rows = [[_state(r.pk) if r else None for r in pair] for pair in rows]
    assert [_outcome(r) for r in together] == [_outcome(r) for r in alone]
    assert together_rows == alone_rows

    # Two steps of one batch claim the same queued row: one gets it.
    row = _row(Status.QUEUED)
    twice = sql.run_steps(
        [sql.Step(None, row.pk, f"w#{n}", uuid.UUID(int=10 + n), now, 0) for n in range(2)]
    )
    assert sorted(claimed is not None for _settled, claimed in twice) == [False, True]
    after = _state(row.pk)
    assert (after["status"], after["attempts"]) == (Status.PROCESSING, 1)


@pytest.mark.django_db(transaction=True)
def test_the_fast_step_settles_and_claims_in_one_go():
    """A success and a claim in one step; on PostgreSQL, through the function."""
    settle, claim = _row(Status.PROCESSING), _row(Status.QUEUED)
    now = timezone.now() + timedelta(seconds=5)
    settled, claimed = _step(True, (settle.pk, TOKEN), claim.pk, TOKEN, now, 0)
    assert settled == 1
    assert claimed is not None and claimed.email is not None
    assert claimed.email.subject == "s" and claimed.email.reply_to == []
    assert claimed.email.mailer == ""
    # Built without Model.__init__ (sql._instance): every field is set, none
    # deferred (a deferred one would be read back from the database later),
    # and the instances are loaded ones, not new rows.
    for instance in (claimed.delivery, claimed.email):
        assert instance.get_deferred_fields() == set()
        assert instance._state.adding is False and instance._state.db == "default"
    assert claimed.delivery.recipient == claim.recipient
    assert claimed.delivery.message_id == claim.message_id
    assert _state(settle.pk)["status"] == Status.SENT
    after = _state(claim.pk)
    assert (after["status"], after["attempts"], after["worker_id"]) == (
        Status.PROCESSING,
        1,
        "w#new",
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'outbox_step'")
            assert cursor.fetchone()[0] == 1
