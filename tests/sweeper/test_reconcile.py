"""Automatic settlement of abandoned rows: the sweeper asks OUTBOX["RECONCILERS"].

Real database and Redis; the reconcilers here are scripted classes on the
real base class, and the end-to-end test uses PostfixLogReconciler on a mail
log after a real worker was SIGKILLed mid-send.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Email
from outbox.reconcilers import UNKNOWN, Answer, Question, Reconciler
from outbox.sweeper import Sweeper
from tests.checking import outbox_checks
from tests.processes import kill_at
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
SCRIPTED = "tests.sweeper.test_reconcile.Scripted"


class Scripted(Reconciler):
    """Answers what the test put in ``answers`` (by Message-ID); records what it was asked."""

    answers: dict[str, Answer] = {}
    asked: list[list[int]] = []

    def answer_many(self, questions):
        type(self).asked.append([q.delivery_id for q in questions])
        return {q.delivery_id: type(self).answers.get(q.message_id, UNKNOWN) for q in questions}


class Second(Scripted):
    answers: dict[str, Answer] = {}
    asked: list[list[int]] = []


class Broken(Reconciler):
    def answer_many(self, questions):
        raise RuntimeError("the mail log is on fire")


class NotAReconciler:
    pass


class Recording(Reconciler):
    """Knows nothing; keeps the questions it was asked."""

    questions: list[Question] = []

    def answer_many(self, questions):
        type(self).questions += questions
        return {}


class ReclaimedMeanwhile(Reconciler):
    """Says "sent", but first the row is requeued and abandoned again (a new claim token)."""

    def answer_many(self, questions):
        for q in questions:
            Delivery.objects.filter(pk=q.delivery_id).update(claim_token=uuid.uuid4())
        return {q.delivery_id: Answer.sent("postfix says so") for q in questions}


@pytest.fixture(autouse=True)
def _fresh_scripts():
    for cls in (Scripted, Second):
        cls.answers, cls.asked = {}, []
    Recording.questions = []


def reconcilers(settings, *paths: str, **more) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "RECONCILERS": list(paths), **more}


def abandoned(
    n: int, *, age: timedelta = timedelta(minutes=5), attempts: int = 1
) -> list[Delivery]:
    """``n`` rows as the sweeper leaves them after a worker died mid-send."""
    rows = enqueue_email("s", "b", None, [f"r{i}@example.org" for i in range(n)])
    started = timezone.now() - age
    for i, row in enumerate(rows):
        Delivery.objects.filter(pk=row.pk).update(
            status=Status.ABANDONED,
            claim_token=uuid.uuid4(),
            worker_id="dead-worker",
            server_host="mx",  # the host field of the log lines below
            server_address="192.0.2.25:25",
            attempts=attempts,
            processing_started_at=started,
            updated_at=started + timedelta(seconds=30 + i),  # oldest first = creation order
        )
    return [Delivery.objects.get(pk=row.pk) for row in rows]


def log_of(row: Delivery) -> list[tuple[str, str, str]]:
    return list(Attempt.objects.filter(delivery=row).values_list("outcome", "actor", "error"))


def test_sent_settles_the_row_with_an_attempt_naming_the_reconciler(settings, queue):
    reconcilers(settings, SCRIPTED)
    [row] = abandoned(1)
    Scripted.answers[row.message_id] = Answer.sent("status=sent (250 ok)")
    report = Sweeper(policy="review").run_pass()
    assert report.reconciled_sent == 1 and "settled by reconcilers: 1 sent" in report.line()
    row.refresh_from_db()
    assert row.status == Status.SENT and row.sent_at is not None and row.last_error == ""
    assert log_of(row) == [("marked_sent", f"reconciler:{SCRIPTED}", "status=sent (250 ok)")]
    assert queue.redis.zcard(queue.reconcile_key) == 0


def test_not_sent_requeues_under_review_only_when_sure(settings, queue):
    reconcilers(settings, SCRIPTED)
    sure, unsure = abandoned(2)
    Scripted.answers[sure.message_id] = Answer.not_sent("no cleanup line", sure=True)
    Scripted.answers[unsure.message_id] = Answer.not_sent("log ends early", sure=False)
    report = Sweeper(policy="review").run_pass()
    assert (report.reconciled_sent, report.reconciled_requeued) == (0, 1)
    sure.refresh_from_db()
    unsure.refresh_from_db()
    assert sure.status == Status.QUEUED and sure.attempts == 1  # the lost attempt still counts
    assert log_of(sure) == [("requeued", f"reconciler:{SCRIPTED}", "no cleanup line")]
    # Pushed to Redis after the commit, like the admin's requeue.
    assert sure.pk in [int(i) for i in queue.redis.lrange(queue.ready_key("normal"), 0, -1)]
    assert unsure.status == Status.ABANDONED and log_of(unsure) == []


def test_not_sent_unsure_requeues_under_the_requeue_policy(settings):
    reconcilers(settings, SCRIPTED)
    [row] = abandoned(1)
    Scripted.answers[row.message_id] = Answer.not_sent("log ends early", sure=False)
    assert Sweeper(policy="requeue").run_pass().reconciled_requeued == 1
    assert Delivery.objects.get(pk=row.pk).status == Status.QUEUED


def test_not_sent_without_attempts_left_stays_for_a_person(settings):
    reconcilers(settings, SCRIPTED)
    [row] = abandoned(1, attempts=5)
    Scripted.answers[row.message_id] = Answer.not_sent("no cleanup line", sure=True)
    assert Sweeper(policy="review").run_pass().reconciled_requeued == 0
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED


def test_unknown_is_left_and_not_asked_again_until_the_retry_interval(settings, queue):
    reconcilers(settings, SCRIPTED, RECONCILE_RETRY_AFTER=600)
    [row] = abandoned(1)
    Sweeper(policy="review").run_pass()
    Sweeper(policy="review").run_pass()
    assert Scripted.asked == [[row.pk]]  # once, not every pass
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
    assert queue.redis.zscore(queue.reconcile_key, str(row.pk)) is not None
    reconcilers(settings, SCRIPTED, RECONCILE_RETRY_AFTER=0.2)
    Scripted.answers[row.message_id] = Answer.sent("found it later")
    wait_until(lambda: Sweeper(policy="review").run_pass().reconciled_sent == 1, timeout=10)
    assert Scripted.asked[-1] == [row.pk]


def test_a_pass_asks_about_the_oldest_rows_up_to_the_batch(settings):
    reconcilers(settings, SCRIPTED, RECONCILE_BATCH=2)
    rows = abandoned(3)
    Sweeper(policy="review").run_pass()
    assert Scripted.asked == [[rows[0].pk, rows[1].pk]]
    Sweeper(policy="review").run_pass()  # the first two are remembered as asked
    assert Scripted.asked[-1] == [rows[2].pk]


def test_rows_abandoned_too_long_ago_are_left_to_a_person(settings):
    reconcilers(settings, SCRIPTED, RECONCILE_MAX_AGE=3600)
    abandoned(1, age=timedelta(hours=2))
    Sweeper(policy="review").run_pass()
    assert Scripted.asked == []


def test_a_reconciler_that_raises_is_logged_and_counts_as_unknown(settings, caplog):
    reconcilers(settings, "tests.sweeper.test_reconcile.Broken", SCRIPTED)
    first, second = abandoned(2)
    Scripted.answers[first.message_id] = Answer.sent("postfix: status=sent")
    with caplog.at_level(logging.ERROR, logger="outbox.sweeper.reconcile"):
        report = Sweeper(policy="review").run_pass()
    assert "the mail log is on fire" in caplog.text
    assert any("Broken" in e and "on fire" in e for e in report.errors)
    assert Delivery.objects.get(pk=first.pk).status == Status.SENT
    assert Delivery.objects.get(pk=second.pk).status == Status.ABANDONED


def test_sent_wins_over_not_sent(settings, caplog):
    reconcilers(settings, SCRIPTED, "tests.sweeper.test_reconcile.Second")
    [row] = abandoned(1)
    Scripted.answers[row.message_id] = Answer.not_sent("not in my log", sure=True)
    Second.answers[row.message_id] = Answer.sent("in mine")
    with caplog.at_level(logging.WARNING, logger="outbox.sweeper.reconcile"):
        Sweeper(policy="review").run_pass()
    assert "says sent" in caplog.text
    row.refresh_from_db()
    assert row.status == Status.SENT
    assert log_of(row) == [
        ("marked_sent", "reconciler:tests.sweeper.test_reconcile.Second", "in mine")
    ]


def test_the_question_names_the_incarnation_and_the_mailer(settings):
    reconcilers(settings, "tests.sweeper.test_reconcile.Recording")
    [row] = abandoned(1)
    Email.objects.filter(pk=row.email_id).update(mailer="bulk")
    Sweeper(policy="review").run_pass()
    [question] = Recording.questions
    assert (question.delivery_id, question.worker_id, question.mailer) == (
        row.pk,
        "dead-worker",
        "bulk",
    )
    assert question.started_at == row.processing_started_at
    assert question.abandoned_at == row.updated_at
    assert (question.server_host, question.server_address) == ("mx", "192.0.2.25:25")


def postfix_lines(at, mid: str, qid: str) -> str:
    stamp = at.isoformat(timespec="microseconds")
    return (
        f"{stamp} mx postfix/cleanup[812]: {qid}: message-id={mid}\n"
        f"{stamp} mx postfix/qmgr[600]: {qid}: from=<outbox-tests@example.com>, "
        "size=702, nrcpt=1 (queue active)\n"
    )


@pytest.mark.parametrize("in_log", [True, False], ids=["this-servers-log", "another-log"])
def test_not_sent_needs_the_incarnations_other_handovers_in_the_log(settings, tmp_path, in_log):
    """A log covering the attempt settles "not sent" only if it shows the worker's other mail."""
    [row, other] = abandoned(2)
    started = row.processing_started_at
    # The same incarnation sent `other` through the same mailer a minute before.
    Delivery.objects.filter(pk=other.pk).update(
        status=Status.SENT, sent_at=started - timedelta(minutes=1)
    )
    log = tmp_path / "mail.log"
    log.write_text(
        f"{(started - timedelta(hours=2)).isoformat()} mx postfix/anvil[7]: statistics: x\n"
        + (
            postfix_lines(started - timedelta(minutes=1), other.message_id, "7A7A")
            if in_log
            else ""
        )
        + f"{timezone.now().isoformat()} mx postfix/anvil[7]: statistics: y\n"
    )
    reconcilers(settings, "outbox.reconcilers.PostfixLogReconciler", POSTFIX_LOG=str(log))
    report = Sweeper(policy="review").run_pass()
    row.refresh_from_db()
    if in_log:
        assert report.reconciled_requeued == 1 and row.status == Status.QUEUED
        [(outcome, _actor, evidence)] = log_of(row)
        assert outcome == "requeued" and other.message_id in evidence
    else:
        assert report.reconciled_requeued == 0 and row.status == Status.ABANDONED
        assert log_of(row) == []


def test_a_row_claimed_again_meanwhile_is_not_settled(settings):
    reconcilers(settings, "tests.sweeper.test_reconcile.ReclaimedMeanwhile")
    [row] = abandoned(1)
    assert Sweeper(policy="review").run_pass().reconciled_sent == 0
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
    assert not Attempt.objects.filter(delivery_id=row.pk).exists()


@pytest.mark.parametrize(
    ("values", "check_id", "fragment"),
    [
        ({"RECONCILERS": "outbox.reconcilers.PostfixLogReconciler"}, "outbox.E015", "list"),
        ({"RECONCILERS": ["tests.sweeper.test_reconcile.Missing"]}, "outbox.E015", "cannot import"),
        (
            {"RECONCILERS": ["tests.sweeper.test_reconcile.NotAReconciler"]},
            "outbox.E015",
            "subclass",
        ),
        ({"RECONCILERS": ["tests.sweeper.test_reconcile.abandoned"]}, "outbox.E015", "subclass"),
        ({"RECONCILE_BATCH": 0}, "outbox.E016", "RECONCILE_BATCH"),
        ({"RECONCILE_RETRY_AFTER": 0}, "outbox.E016", "RECONCILE_RETRY_AFTER"),
        ({"RECONCILE_MAX_AGE": "a week"}, "outbox.E016", "wrong type"),
        (
            {"RECONCILERS": ["outbox.reconcilers.PostfixLogReconciler"]},
            "outbox.E017",
            "POSTFIX_LOG",
        ),
        (
            {
                "RECONCILERS": ["outbox.reconcilers.PostfixLogReconciler"],
                "POSTFIX_LOG": "/nonexistent/mail.log",
            },
            "outbox.W007",
            "/nonexistent/mail.log",
        ),
    ],
)
def test_checks(settings, values, check_id, fragment):
    settings.OUTBOX = {**settings.OUTBOX, **values}
    [message] = outbox_checks()
    assert message.id == check_id and fragment in message.msg


def test_a_readable_postfix_log_passes_the_checks(settings, tmp_path):
    log = tmp_path / "mail.log"
    log.write_text("")
    reconcilers(settings, "outbox.reconcilers.PostfixLogReconciler", POSTFIX_LOG=str(log))
    assert outbox_checks() == []


@pytest.mark.slow
def test_worker_sigkilled_mid_send_then_the_postfix_log_settles_it(
    settings, tmp_path, worker_process, smtp_server
):
    """A real worker dies after the handover; Postfix's log says sent; outbox_sweep settles it."""
    [row] = enqueue_email("s", "b", None, ["victim@example.org"])
    kill_at(worker_process, "after_send", smtp_server, "review")
    wait_until(lambda: Sweeper(policy="review", timeout=0.5).run_pass().abandoned == 1, 10)
    row.refresh_from_db()
    assert row.status == Status.ABANDONED and smtp_server.by_message_id() == {row.message_id: 1}

    start = row.processing_started_at
    stamp = (start + timedelta(milliseconds=300)).isoformat(timespec="microseconds")
    later = (start + timedelta(seconds=1)).isoformat(timespec="microseconds")
    log = tmp_path / "mail.log"
    log.write_text(
        f"{(start - timedelta(hours=1)).isoformat()} mx postfix/anvil[7]: statistics: max cache size 1\n"
        f"{stamp} mx postfix/pickup[811]: 4Bx0Yz1abcz: uid=1000 from=<outbox-tests@example.com>\n"
        f"{stamp} mx postfix/cleanup[812]: 4Bx0Yz1abcz: message-id={row.message_id}\n"
        f"{stamp} mx postfix/qmgr[600]: 4Bx0Yz1abcz: from=<outbox-tests@example.com>, "
        "size=702, nrcpt=1 (queue active)\n"
        f"{later} mx postfix/smtp[813]: 4Bx0Yz1abcz: to=<victim@example.org>, "
        "relay=mx.example.org[203.0.113.5]:25, delay=0.7, delays=0.1/0/0.3/0.3, dsn=2.0.0, "
        "status=sent (250 2.0.0 Ok: queued as 9F8E7D)\n"
        f"{later} mx postfix/qmgr[600]: 4Bx0Yz1abcz: removed\n"
    )
    reconcilers(settings, "outbox.reconcilers.PostfixLogReconciler", POSTFIX_LOG=str(log))
    call_command("outbox_sweep")
    row.refresh_from_db()
    assert row.status == Status.SENT
    outcome, actor, evidence = log_of(row)[-1]
    assert (outcome, actor) == ("marked_sent", "reconciler:outbox.reconcilers.PostfixLogReconciler")
    # The admin shows the outcome next to its actor: it must not claim an operator.
    assert Attempt(outcome=outcome).get_outcome_display() == "marked sent"
    assert "status=sent" in evidence and "4Bx0Yz1abcz" in evidence
    assert smtp_server.by_message_id() == {row.message_id: 1}  # settled, never sent again
