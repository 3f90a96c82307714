"""A pool of relays behind one address: one relay's log is no proof for another's hand-over.

Two real SMTP servers on loopback greet as ``relay-a.test`` and
``relay-b.test``, and each writes its own Postfix-style mail log under its
name. A round-robin TCP balancer (``tests/proxy.py``, ``pool=``) in front of
them hands each new connection to the next one, as several A records, a load
balancer or a Kubernetes Service do. A real worker delivers to the balancer's
address and is SIGKILLed mid-send; the sweeper abandons the row and asks
``PostfixLogReconciler`` with one relay's log.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from tests.cells import slow_processes
from tests.proxy import FaultProxy
from tests.servers import SMTPRecorder, wait_until

pytestmark = slow_processes(
    ("6.1:postgres",),
    why="real worker processes and SMTP servers; the relays are the same under every cell",
)

Status = Delivery.Status
POSTFIX = "outbox.reconcilers.PostfixLogReconciler"
SEND_TIMEOUT = 1.0  # the reconciler's: how long past an attempt's start a hand-over may come


class Pool:
    """Relays A and B, each with its own log, behind one round-robin address."""

    def __init__(self, tmp_path: Path, *, b_after_data: str) -> None:
        self.a = SMTPRecorder(greeting_host="relay-a.test", log=tmp_path / "a" / "mail.log")
        self.b = SMTPRecorder(
            greeting_host="relay-b.test", log=tmp_path / "b" / "mail.log", after_data=b_after_data
        )
        for relay in (self.a, self.b):
            assert relay.log is not None
            relay.log.parent.mkdir()
            relay.start()
        self.balancer = FaultProxy(self.a.port, pool=[self.b.port]).start()

    def env(self) -> dict[str, str]:
        """A worker that delivers through the balancer, with the log reconciler configured."""
        return {
            "OUTBOX_TEST_SMTP_PORT": str(self.balancer.port),
            "OUTBOX_TEST_ABANDONED_POLICY": "review",
            "OUTBOX_TEST_POSTFIX_LOG": str(self.a.log),
        }

    def logs_go_on_past(self, row: Delivery) -> None:
        """Both logs get a line after the attempt's whole window (start + SEND_TIMEOUT)."""
        assert row.processing_started_at is not None
        end = max(row.updated_at, row.processing_started_at + timedelta(seconds=SEND_TIMEOUT))
        wait_until(lambda: timezone.now() > end, SEND_TIMEOUT + 5)
        self.a.log_tick()
        self.b.log_tick()

    def close(self) -> None:
        self.balancer.close()
        self.a.stop()
        self.b.stop()


@pytest.fixture
def pool_of(tmp_path: Path) -> Iterator:
    made: list[Pool] = []

    def make(b_after_data: str = "reply") -> Pool:
        made.append(Pool(tmp_path, b_after_data=b_after_data))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


def reconcile_with(settings, log: Path | None) -> Sweeper:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "RECONCILERS": [POSTFIX],
        "POSTFIX_LOG": str(log),
        "SEND_TIMEOUT": SEND_TIMEOUT,
    }
    # Asked before and left unsettled: ask again now, not after RECONCILE_RETRY_AFTER.
    queue = RedisQueue()
    queue.redis.delete(queue.reconcile_key)
    return Sweeper(policy="review")


def abandon(row: Delivery) -> Delivery:
    """The killed worker's row, after the sweeper saw its incarnation dead."""
    wait_until(lambda: Sweeper(policy="review", timeout=0.5).run_pass().abandoned == 1, 10)
    row.refresh_from_db()
    assert row.status == Status.ABANDONED and row.worker_id
    return row


def test_one_relays_log_does_not_requeue_what_another_relay_took(settings, pool_of, worker_process):
    """S goes to relay A; its connection closes idle; X goes to relay B over a new one.

    The worker dies before it reads B's 250. A's log covers X's window and
    holds S, another message of the same incarnation through the same mailer,
    but not X: before the fix the reconciler answered "not sent, sure" and
    requeued X, which B already has (delivered twice).
    """
    pool = pool_of(b_after_data="stall")
    [s] = enqueue_email("s", "b", None, ["s@example.org"])
    worker = worker_process("--concurrency", "1", **pool.env())
    wait_until(lambda: Delivery.objects.get(pk=s.pk).status == Status.SENT, 30)
    # The worker closes a connection that idled (outbox.worker.attempt.KEEP_OPEN_SECONDS).
    wait_until(lambda: pool.balancer.open_connections == 0, 10)

    [x] = enqueue_email("x", "b", None, ["x@example.org"])
    wait_until(lambda: pool.b.count() == 1, 30)  # B has X; its 250 never comes
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    x = abandon(x)
    s.refresh_from_db()
    assert s.worker_id == x.worker_id and pool.a.by_message_id() == {s.message_id: 1}
    pool.logs_go_on_past(x)

    report = reconcile_with(settings, pool.a.log).run_pass()
    x.refresh_from_db()
    assert (report.reconciled_requeued, x.status) == (0, Status.ABANDONED)
    assert not Attempt.objects.filter(delivery=x, outcome="requeued").exists()
    assert (s.server_host, x.server_host) == ("relay-a.test", "relay-b.test")
    # Behind the balancer both connections had the same peer: the greeting tells them apart.
    assert s.server_address == x.server_address == f"127.0.0.1:{pool.balancer.port}"

    # B's own log shows X accepted: settled as sent, and never sent again.
    assert reconcile_with(settings, pool.b.log).run_pass().reconciled_sent == 1
    x.refresh_from_db()
    assert x.status == Status.SENT
    assert pool.a.by_message_id().get(x.message_id) is None
    assert pool.b.by_message_id() == {x.message_id: 1}
