"""PostfixLogReconciler against a real Postfix and its real log.

A private Postfix (tests/postfix.py) listens on 127.0.0.1 and relays to an
aiosmtpd sink; real worker processes deliver to it and are SIGKILLed at a
fault point; the sweeper abandons the row and asks the reconciler, which
reads the log Postfix wrote. Skipped where Postfix cannot run (not root, or
not installed: tests/run.sh installs it).
"""

from __future__ import annotations

import signal
import smtplib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import RedisQueue
from outbox.reconcilers import PostfixLogReconciler, Question, Verdict
from outbox.reconcilers.postfix_log import scan
from outbox.sweeper import Sweeper
from tests.cells import only_in_cells
from tests.postfix import PostfixServer, other_zone, unavailable
from tests.processes import kill_at, process_state
from tests.servers import SMTPRecorder, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    only_in_cells("6.1:sqlite", why="Postfix's log reads the same in every cell"),
]

Status = Delivery.Status
POSTFIX = "outbox.reconcilers.PostfixLogReconciler"
SEND_TIMEOUT = "2"  # the worker's and the reconciler's: the send window to cover


@pytest.fixture(scope="module")
def sink():
    server = SMTPRecorder().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def postfix(sink):
    why = unavailable()
    if why:
        pytest.skip(why)
    server = PostfixServer(sink.port).start()
    yield server
    server.stop()


def env(postfix: PostfixServer, **more: str) -> dict[str, str]:
    return {
        "OUTBOX_TEST_SMTP_PORT": str(postfix.port),
        "OUTBOX_TEST_ABANDONED_POLICY": "review",
        "OUTBOX_TEST_SEND_TIMEOUT": SEND_TIMEOUT,
        **more,
    }


def delivered(log: Path, message_id: str) -> bool:
    """Whether Postfix logged a delivery line for the message (so it is in its log for good)."""
    found = scan(log, {message_id}, datetime(2000, 1, 1, tzinfo=UTC), timezone.now())
    return any(found.statuses.get(qid) for qid in found.queue_ids.get(message_id, []))


def reconcile_with(settings, log: Path) -> Sweeper:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "RECONCILERS": [POSTFIX],
        "POSTFIX_LOG": str(log),
        "SEND_TIMEOUT": float(SEND_TIMEOUT),
    }
    RedisQueue().redis.delete(RedisQueue().reconcile_key)  # ask again at once
    return Sweeper(policy="review")


def abandon(row: Delivery) -> Delivery:
    """The killed worker's row, after the sweeper saw its incarnation dead."""
    wait_until(lambda: Sweeper(policy="review", timeout=0.5).run_pass().abandoned == 1, 10)
    row.refresh_from_db()
    # The question needs the incarnation: the abandoned row keeps its worker_id.
    assert row.status == Status.ABANDONED and row.worker_id
    return row


def test_a_delivery_through_postfix_reaches_the_sink(postfix, sink, worker_process):
    [row] = enqueue_email("s", "b", None, ["through@example.org"])
    drain = worker_process("--burst", **env(postfix))
    assert drain.wait(timeout=60) == 0, drain.stdout.read()
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT
    wait_until(lambda: sink.by_message_id().get(row.message_id) == 1, 30)
    wait_until(lambda: delivered(postfix.log, row.message_id), 10)


def test_killed_after_postfix_accepted_is_settled_sent_from_its_log(
    settings, postfix, sink, worker_process
):
    [row] = enqueue_email("s", "b", None, ["accepted@example.org"])
    kill_at(worker_process, "after_send", postfix, "review")
    row = abandon(row)
    wait_until(lambda: delivered(postfix.log, row.message_id), 30)
    assert reconcile_with(settings, postfix.log).run_pass().reconciled_sent == 1
    row.refresh_from_db()
    assert row.status == Status.SENT
    [(outcome, evidence)] = Attempt.objects.filter(
        delivery=row, actor=f"reconciler:{POSTFIX}"
    ).values_list("outcome", "error")
    assert outcome == "marked_sent" and "status=sent" in evidence
    assert sink.by_message_id()[row.message_id] == 1  # settled, never sent again


def kill_second(worker_process, postfix) -> tuple[Delivery, Delivery]:
    """One incarnation sends a first email through Postfix, then dies before sending the second."""
    first = enqueue_email("s", "b", None, ["sibling@example.org"])[0]
    enqueue_email("s", "b", None, ["victim@example.org"])
    # The victim names its server (a reconciler is configured), then dies before its DATA.
    proc = worker_process(
        **env(
            postfix,
            OUTBOX_FAULT_POINT="after_note_server",
            OUTBOX_FAULT_COUNT="2",
            OUTBOX_TEST_POSTFIX_LOG=str(postfix.log),
        )
    )
    wait_until(lambda: process_state(proc) == "T", 30)
    [sibling] = Delivery.objects.filter(status=Status.PROCESSING)
    assert sibling.pk == first.pk
    proc.send_signal(signal.SIGCONT)
    wait_until(lambda: Delivery.objects.get(pk=sibling.pk).status == Status.SENT, 30)
    wait_until(lambda: process_state(proc) == "T", 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    [victim] = Delivery.objects.filter(status=Status.PROCESSING)
    return Delivery.objects.get(pk=sibling.pk), victim


def log_past(postfix: PostfixServer, moment: datetime) -> None:
    """Make Postfix log a line after ``moment`` (whole seconds: syslog's resolution)."""
    wait_until(lambda: timezone.now() > moment + timedelta(seconds=1.2), 10)
    with smtplib.SMTP("127.0.0.1", postfix.port, timeout=10) as client:
        client.sendmail(
            "probe@example.com",
            ["probe@example.org"],
            f"Message-ID: <probe-{moment.timestamp()}@example.com>\r\nSubject: p\r\n\r\np\r\n",
        )
    wait_until(lambda: delivered(postfix.log, f"<probe-{moment.timestamp()}@example.com>"), 30)


def without(log: Path, message_id: str, into: Path) -> Path:
    """The log with every line of the message's queue id taken out: another server's log."""
    found = scan(log, {message_id}, datetime(2000, 1, 1, tzinfo=UTC), timezone.now())
    qids = found.queue_ids[message_id]
    lines = log.read_text().splitlines(keepends=True)
    into.write_text("".join(line for line in lines if not any(f" {q}:" in line for q in qids)))
    return into


@pytest.mark.parametrize("site_zone", [None, "differs"], ids=["host-zone", "site-zone-differs"])
def test_never_seen_by_postfix_is_not_sent_only_from_the_handover_log(
    settings, tmp_path, postfix, sink, worker_process, site_zone
):
    """Sure "not sent" from Postfix's own log (its other mail is there), "unknown" from another."""
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": float(SEND_TIMEOUT)}
    if site_zone:
        # Django sets the process's TZ from TIME_ZONE; Postfix wrote the host's zone.
        settings.TIME_ZONE = other_zone()
    sibling, victim = kill_second(worker_process, postfix)
    victim = abandon(victim)
    assert victim.worker_id == sibling.worker_id
    wait_until(lambda: delivered(postfix.log, sibling.message_id), 30)
    start = victim.processing_started_at
    log_past(postfix, max(victim.updated_at, start + timedelta(seconds=float(SEND_TIMEOUT))))

    elsewhere = without(postfix.log, sibling.message_id, tmp_path / "other-host.log")
    assert victim.server_host == sibling.server_host == "outbox-tests.localdomain"
    question = Question(
        victim.pk,
        victim.message_id,
        victim.recipient,
        start,
        victim.updated_at,
        victim.worker_id,
        server_host=victim.server_host,
        server_address=victim.server_address,
    )
    answer = PostfixLogReconciler(str(elsewhere)).answer_many([question])[victim.pk]
    assert answer.verdict is Verdict.UNKNOWN and "none of the 1 other messages" in answer.evidence
    assert reconcile_with(settings, elsewhere).run_pass().reconciled_requeued == 0
    assert Delivery.objects.get(pk=victim.pk).status == Status.ABANDONED

    assert reconcile_with(settings, postfix.log).run_pass().reconciled_requeued == 1
    victim.refresh_from_db()
    assert victim.status == Status.QUEUED
    [evidence] = Attempt.objects.filter(
        delivery=victim, actor=f"reconciler:{POSTFIX}", outcome="requeued"
    ).values_list("error", flat=True)
    assert sibling.message_id in evidence
    drain = worker_process("--burst", **env(postfix))
    assert drain.wait(timeout=60) == 0, drain.stdout.read()
    wait_until(lambda: sink.by_message_id().get(victim.message_id) == 1, 30)
    assert sink.by_message_id()[sibling.message_id] == 1
