"""Real worker processes: signals, SIGKILL at each point of the loop, then one sweep.

OUTBOX_FAULT_POINT makes the worker stop itself (SIGSTOP) at a named point of
its loop; the test then SIGKILLs it there, as an OOM kill or a lost host would.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from tests.cells import EACH_DJANGO_AND_DATABASE, slow_processes
from tests.processes import kill_at
from tests.servers import SMTPRecorder, wait_until

pytestmark = slow_processes(
    EACH_DJANGO_AND_DATABASE,
    why="signals reach a real process the same way in every cell; one per Django version and per database",
)

Status = Delivery.Status


def sweep_and_drain(worker_process, smtp: SMTPRecorder, policy: str) -> None:
    # The killed worker's heartbeat stops; a sweeper with a short timeout sees it dead.
    queue = RedisQueue()
    wait_until(lambda: Sweeper(policy=policy, timeout=0.5).run_pass().reaped == 1, 10)
    assert queue.live_workers() == {} and queue.dead_workers() == []
    drain = worker_process("--burst", OUTBOX_TEST_SMTP_PORT=str(smtp.port))
    assert drain.wait(timeout=60) == 0, drain.stdout.read()


CASES = [
    # point, policy, final status, copies received
    ("after_claim", "review", Status.SENT, 1),
    ("after_claim", "requeue", Status.SENT, 1),
    ("after_mark_processing", "review", Status.ABANDONED, 0),
    ("after_mark_processing", "requeue", Status.SENT, 1),
    ("after_send", "review", Status.ABANDONED, 1),
    ("after_send", "requeue", Status.SENT, 2),  # at least once: the documented duplicate
    ("after_mark_sent", "review", Status.SENT, 1),
    ("after_mark_sent", "requeue", Status.SENT, 1),
]


@pytest.mark.parametrize(("point", "policy", "final", "copies"), CASES)
def test_sigkill_at_each_point_then_one_sweep(
    point, policy, final, copies, worker_process, smtp_server
):
    victim = enqueue_email("s", "b", None, ["victim@example.com"])[0]
    kill_at(worker_process, point, smtp_server, policy)
    others = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    sweep_and_drain(worker_process, smtp_server, policy)

    row = Delivery.objects.get(pk=victim.pk)
    assert row.status == final
    assert smtp_server.by_message_id().get(row.message_id, 0) == copies
    for other in others:
        assert Delivery.objects.get(pk=other.pk).status == Status.SENT
        assert smtp_server.by_message_id()[other.message_id] == 1
    if final == Status.ABANDONED:
        outcomes = list(row.attempt_log.values_list("outcome", "actor"))
        assert outcomes[-1] == ("abandoned", "sweeper")
    assert not Delivery.objects.filter(status__in=[Status.QUEUED, Status.PROCESSING]).exists()
    assert RedisQueue().redis.keys("{outbox}:processing:*") == []


def test_sigterm_mid_send_finishes_the_message_and_exits_zero(worker_process):
    smtp = SMTPRecorder(delay=1.0).start()
    try:
        deliveries = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(5)])
        proc = worker_process(OUTBOX_TEST_SMTP_PORT=str(smtp.port))
        wait_until(lambda: Delivery.objects.filter(status=Status.PROCESSING).exists(), 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stdout.read()
        output = proc.stdout.read()
        assert "SIGTERM" in output
    finally:
        smtp.stop()
    statuses = [Delivery.objects.get(pk=d.pk).status for d in deliveries]
    # The message in hand was finished, not abandoned; nothing is left processing.
    assert statuses.count(Status.SENT) >= 1
    assert Status.PROCESSING not in statuses
    assert smtp.count() == statuses.count(Status.SENT)
    queue = RedisQueue()
    # Claimed-but-unstarted ids went back to the ready list; the worker deregistered.
    assert queue.redis.llen(queue.ready_key("normal")) == statuses.count(Status.QUEUED)
    assert queue.live_workers() == {}
    assert queue.redis.keys("{outbox}:processing:*") == []


def test_sigkill_leaves_the_row_processing_for_the_sweeper(worker_process, smtp_server):
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    kill_at(worker_process, "after_mark_processing", smtp_server, "review")
    row = Delivery.objects.get(pk=delivery.pk)
    assert row.status == Status.PROCESSING and row.worker_id
    assert RedisQueue().processing_ids(row.worker_id) == [delivery.pk]


def test_help_lists_the_options():
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "django", "outbox_worker", "--help"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        check=True,
    ).stdout
    for option in ("--burst", "--concurrency", "--max-messages", "--worker-id"):
        assert option in out
