"""Poison messages: an email whose sending kills its worker every time.

Real worker subprocesses deliver to a real SMTP server through
:class:`PoisonBackend`, which SIGKILLs its own process when asked to send a
message with the subject "POISON" (as a segfaulting library or an OOM kill on
one huge message would). A supervisor loop in the test restarts the worker
whenever it dies and runs sweeper passes, until every row is terminal.

The poison must end ``failed`` (policy "requeue", after ``max_attempts``
deaths) or ``abandoned`` (policy "review", after one), after a bounded number
of worker deaths, while every other message is delivered exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

import pytest
from django.core.mail.backends import smtp

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.cells import slow_processes
from tests.servers import wait_until

pytestmark = slow_processes(
    ("5.2:sqlite",),
    why="worker processes that crash on a message; the crash is the process's, not the cell's",
)

Status = Delivery.Status
POISON_SUBJECT = "POISON"
PORT_ENV = "OUTBOX_TEST_POISON_SMTP_PORT"


class PoisonBackend(smtp.EmailBackend):
    """SMTP to 127.0.0.1:$OUTBOX_TEST_POISON_SMTP_PORT; a "POISON" message kills the process.

    Selected in worker subprocesses with OUTBOX_TEST_EMAIL_BACKEND (and without
    OUTBOX_TEST_SMTP_PORT, which would replace it with the plain SMTP backend).
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("port", int(os.environ[PORT_ENV]))
        super().__init__(**kwargs)

    def send_messages(self, email_messages: Any) -> int:
        for message in email_messages:
            if message.subject == POISON_SUBJECT:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().send_messages(email_messages)


def supervise(
    worker_process, smtp_port: int, policy: str, deadline: float = 120.0
) -> tuple[int, list[str]]:
    """Keep one worker running and sweep until no row is live; returns (deaths, logs)."""
    env = {
        "OUTBOX_TEST_EMAIL_BACKEND": "tests.faults.test_poison.PoisonBackend",
        PORT_ENV: str(smtp_port),
        "OUTBOX_TEST_ABANDONED_POLICY": policy,
    }
    # Well above the worker's 0.5 s heartbeat, so a live worker is never declared dead.
    sweeper = Sweeper(policy=policy, timeout=3.0)
    deaths = 0
    logs: list[str] = []
    proc: subprocess.Popen[str] = worker_process(**env)
    started = time.monotonic()

    def live() -> bool:
        return Delivery.objects.filter(status__in=Delivery.LIVE_STATUSES).exists()

    try:
        while live():
            assert time.monotonic() - started < deadline, (
                f"rows still live after {deadline}s: "
                f"{list(Delivery.objects.values_list('recipient', 'status', 'attempts'))}"
            )
            if proc.poll() is not None:
                assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
                logs.append(proc.stdout.read())
                deaths += 1
                proc = worker_process(**env)
            sweeper.run_pass()
            # Wait (at most half a second) for the worker to die or the work to end.
            pause = time.monotonic() + 0.5
            wait_until(
                lambda p=proc, until=pause: (
                    p.poll() is not None or not live() or time.monotonic() >= until
                ),
                timeout=5,
            )
    finally:
        # A replacement may still be starting: SIGTERM before its handlers are
        # installed would kill it outright. It registers after installing them.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: proc.poll() is not None or registered(proc.pid), 30)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        logs.append(proc.stdout.read())
    assert code in (0, -signal.SIGKILL), logs[-1]
    if code == -signal.SIGKILL:
        deaths += 1
    return deaths, logs


def registered(pid: int) -> bool:
    """Whether the worker process ``pid`` (default id ``host:pid``) has registered."""
    return any(f":{pid}#" in worker for worker in RedisQueue().live_workers())


@pytest.mark.parametrize(
    ("policy", "final", "tries"),
    [("requeue", Status.FAILED, 3), ("review", Status.ABANDONED, 1)],
)
def test_poison_message_ends_terminal_and_the_queue_still_flows(
    policy, final, tries, worker_process, smtp_server
):
    before = enqueue_email("hello", "b", None, [f"before{i}@example.com" for i in range(10)])
    poison = enqueue_email(POISON_SUBJECT, "b", None, ["victim@example.com"], max_attempts=3)[0]
    after = enqueue_email("hello", "b", None, [f"after{i}@example.com" for i in range(10)])
    high = enqueue_email("urgent", "b", None, ["boss@example.com"], priority="high")

    deaths, logs = supervise(worker_process, smtp_server.port, policy)

    row = Delivery.objects.get(pk=poison.pk)
    assert row.status == final, logs
    assert row.attempts == tries
    assert deaths == tries, logs
    outcomes = list(row.attempt_log.order_by("number", "pk").values_list("outcome", flat=True))
    if policy == "requeue":
        assert outcomes.count(Attempt.Outcome.REQUEUED) == tries - 1
        assert outcomes[-1] == Attempt.Outcome.FAILED
    else:
        assert outcomes[-1] == Attempt.Outcome.ABANDONED
    # The poison never reached the mail server; everything else did, exactly once.
    received = smtp_server.by_message_id()
    assert row.message_id not in received
    others = [*before, *after, *high]
    for delivery in others:
        assert Delivery.objects.get(pk=delivery.pk).status == Status.SENT
        assert received.get(delivery.message_id) == 1, delivery.recipient
    assert smtp_server.count() == len(others)
    # No claim is left behind: the last worker gave its ids back and went, the
    # dead ones were reaped.
    queue = RedisQueue()
    assert queue.redis.keys("{outbox}:processing:*") == []
    # Ids of finished rows may still wait: the sweeper pushed a dead worker's
    # ids on top of the mirror's pushes of them, and the last worker gave back,
    # unexamined, what it held at SIGTERM. They are only hints: one burst pass
    # drops every one and sends nothing.
    drain = Worker(burst=True)
    assert drain.run(install_signal_handlers=False) == 0
    assert drain.delivered_total == 0
    assert queue.queued_count() == 0
    assert sum(queue.ready_lengths().values()) == queue.scheduled_length() == 0
    assert queue.redis.keys("{outbox}:processing:*") == []
