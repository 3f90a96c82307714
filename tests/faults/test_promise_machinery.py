"""The promise inside the worker's newest machinery: replayed claims, give-backs, the fence.

Each test names the fault and the rule it checks (see outbox/PROTOCOL.md):

- a claim whose reply was lost is replayed: the acks added meanwhile are
  applied, and none is applied twice (also when the claim was paused);
- the mirror check does not trust a live worker's processing list for ever,
  and finds a row whose ack came late;
- a row whose claim committed without the thread learning it is set back to
  ``queued`` before its id is given back (pause, shutdown, a new incarnation);
- a send needs a live lease: a heartbeat sent less than the timeout ago;
- a sender reads the incarnation's name and lease as one: never the new
  incarnation's lease with the old incarnation's name;
- heartbeats go on until the last message in hand is settled, at shutdown too;
- a ``BLOCK_TIMEOUT`` longer than the Redis client's socket timeout works.

Faults on the network between a worker and its servers are in
tests/faults/test_network_faults.py.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import redis
from django.db import connection, transaction

from outbox import enqueue_email
from outbox.mail.targets import get_delivery_connection
from outbox.models import Attempt, Delivery
from outbox.queue import Claimed, RedisQueue, control
from outbox.sweeper import Sweeper
from outbox.worker import InFlight, Worker
from outbox.worker import sql as worker_sql
from outbox.worker.loop import SenderLoop
from outbox.worker.outcomes import Settlement
from tests.delivery import use_smtp
from tests.processes import process_state
from tests.servers import SMTPRecorder, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL's row locks and server-side commit"
)


def ids(rows: list[Delivery]) -> list[int]:
    return [r.pk for r in rows]


# -- replayed claims ----------------------------------------------------------------


def test_acks_added_after_a_lost_claim_reply_are_applied_by_the_replay(queue):
    """A retry outcome in hand, the claim's reply lost, the retry written alone: its ack must land.

    Before, the replay returned before applying any ack and the thread then
    cleared them: the id stayed in the live worker's list for its lifetime.
    """
    a, b = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    queue.register("w#1")
    assert [c.id for c in queue.claim("w#1", 1, thread=0, nonce="n0").items] == [a.pk]
    lost = queue.claim("w#1", 1, thread=0, nonce="n1")  # reached Redis; its reply is lost
    # The thread writes a's outcome alone and adds its ack, then retries the claim.
    again = queue.claim("w#1", 1, thread=0, nonce="n1", acks=[a.pk])
    assert again.items == lost.items == [Claimed(b.pk, "normal")]
    assert queue.processing_ids("w#1") == [b.pk]


def test_a_replayed_ack_is_applied_once(queue):
    """The processing list may hold an id twice (a duplicate claimed by two threads).

    An ack applied again by a second replay would remove the other thread's copy.
    """
    [a] = enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    queue.claim("w#1", 1, thread=0, nonce="n0")
    queue.redis.lpush(queue.ready_key("normal"), a.pk)  # a duplicate id, as Redis may hold
    queue.claim("w#1", 1, thread=1, nonce="m0")
    assert queue.processing_ids("w#1") == [a.pk, a.pk]
    for _ in range(3):  # the first try and two replays, each reply lost
        queue.claim("w#1", 1, thread=0, nonce="n1", acks=[a.pk])
    assert queue.processing_ids("w#1") == [a.pk]


def test_a_paused_claim_is_recorded_so_its_replay_does_not_apply_acks_again(queue):
    [a] = enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    queue.claim("w#1", 1, thread=0, nonce="n0")
    queue.redis.lpush(queue.ready_key("normal"), a.pk)
    queue.claim("w#1", 1, thread=1, nonce="m0")
    control.pause(None, queue)
    first = queue.claim("w#1", 1, thread=0, nonce="n1", acks=[a.pk])
    again = queue.claim("w#1", 1, thread=0, nonce="n1", acks=[a.pk])  # after a lost reply
    assert first.items == again.items == []
    assert queue.processing_ids("w#1") == [a.pk]  # thread 1's copy is still there


# -- the mirror check and live workers' lists ------------------------------------------


def test_a_queued_row_held_in_a_live_list_past_the_grace_is_pushed_again(queue, outbox_mail):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    queue.claim("w#1", 1)  # claimed, and the worker never marks it (its ack went astray)
    assert Sweeper().run_pass().remirrored == 0  # held by a live worker: trusted, for now
    assert queue.held_watch().keys() == {row.pk}
    # As if the grace period had passed since the first pass saw it.
    queue.set_held_watch({row.pk: queue.time() - 3600})
    queue.register("w#1")  # still alive
    assert Sweeper().run_pass().remirrored == 1
    Worker(burst=True).run(install_signal_handlers=False)
    assert len(outbox_mail) == 1
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT


def test_a_row_whose_ack_came_late_is_found_by_the_next_plain_pass(queue, outbox_mail):
    """A retry whose push failed, its ack applied long after: the incremental check must see it."""
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    queue.claim("w#1", 1)
    Sweeper().run_pass()  # the first (full) pass: held by a live worker
    # The row was retried an hour ago and its push failed; only now its ack lands.
    an_hour_ago = Delivery.objects.get(pk=row.pk).updated_at - timedelta(hours=1)
    Delivery.objects.filter(pk=row.pk).update(updated_at=an_hour_ago)
    queue.redis.lrem(queue.processing_key("w#1"), 0, row.pk)
    report = Sweeper().run_pass()
    assert not report.full_mirror_check and report.remirrored == 1
    Worker(burst=True).run(install_signal_handlers=False)
    assert len(outbox_mail) == 1


# -- giving back a claim that committed -------------------------------------------------


def committed_claim(worker: Worker, loop: SenderLoop, row: Delivery) -> uuid.UUID:
    """The state after a step committed but its reply (or the read-back) was lost."""
    [item] = worker.queue.claim(worker.worker_id, 1).items
    token = uuid.uuid4()
    with transaction.atomic():
        assert worker_sql.mark_row(row.pk, worker.worker_id, token, worker.clock.now())
    flight = InFlight(item.id, item.priority, worker.worker_id)
    flight.draw_token(lambda: token)  # the mark was tried: its token is on the flight
    loop.pending.append(flight)
    return token


@pytest.mark.parametrize("how", ["pause", "shutdown"])
def test_a_committed_claim_is_set_back_before_its_id_is_given_back(how, queue, outbox_mail):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker()
    worker.queue.register(worker.worker_id)
    loop = SenderLoop(worker, 0, None)  # type: ignore[arg-type]
    committed_claim(worker, loop, row)
    assert Delivery.objects.get(pk=row.pk).status == Status.PROCESSING
    if how == "pause":
        control.pause(None, queue)
        assert loop.gate.paused()
        loop._hold_while_paused()
        control.resume(None, queue)
    else:
        loop._give_back()  # the finally of SenderLoop.run() after SIGTERM
    after = Delivery.objects.get(pk=row.pk)
    assert (after.status, after.attempts, after.claim_token) == (Status.QUEUED, 0, None)
    assert queue.processing_ids(worker.worker_id) == [] and loop.pending == deque()
    Worker(burst=True).run(install_signal_handlers=False)
    assert len(outbox_mail) == 1


def test_a_new_incarnation_sets_back_the_committed_claims_of_the_old_one(queue, outbox_mail):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker()
    worker.queue.register(worker.worker_id)
    loop = SenderLoop(worker, 0, None)  # type: ignore[arg-type]
    committed_claim(worker, loop, row)
    worker.reincarnate(worker.worker_id)
    loop._forget_claims_of_a_dead_incarnation()
    assert Delivery.objects.get(pk=row.pk).status == Status.QUEUED
    assert row.pk in queue.waiting_ids()


# -- the fence --------------------------------------------------------------------------


def test_no_send_without_a_live_lease(queue, outbox_mail):
    """The lease counts from the last heartbeat that was sent, not from the claim's reply."""
    enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker(burst=True)
    worker.lease_from = time.monotonic() - 3600  # frozen since its last heartbeat
    worker.queue.register(worker.worker_id)
    loop = SenderLoop(worker, 0, get_delivery_connection())
    assert loop._claim()
    flight = loop._mark(loop.pending.popleft())
    assert flight is not None
    settlement = loop.sender.send(flight, None)  # type: ignore[arg-type]
    assert isinstance(settlement, Settlement) and settlement.outcome == "released"
    assert outbox_mail == []
    worker.beat()  # a heartbeat renews the lease
    assert worker.lease_left(worker.worker_id) > 0
    assert loop.sender.send(flight, loop.sender.connections.get("").backend).outcome == "sent"
    assert len(outbox_mail) == 1


def test_without_a_lease_a_worker_claims_and_marks_nothing(queue, outbox_mail):
    """Heartbeats failing, claims working: no churn of rows through released, no flagged row."""
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker()
    worker.queue.register(worker.worker_id)
    worker.lease_from = float("-inf")  # no heartbeat has renewed it, and none will here
    loop = SenderLoop(worker, 0, get_delivery_connection())
    thread = threading.Thread(target=loop.run)
    thread.start()
    try:
        wait_until(lambda: loop.pause.delay >= 0.4, 10)  # it has waited twice
    finally:
        worker.stop()
        thread.join(10)
    assert queue.processing_ids(worker.worker_id) == []
    after = Delivery.objects.get(pk=row.pk)
    assert (after.status, after.attempts) == (Status.QUEUED, 0)
    assert not Attempt.objects.exists() and outbox_mail == []


class PausingWorker(Worker):
    """A worker that lets ``between_writes`` run right after the next attribute it sets."""

    between_writes: Callable[[], None] | None = None

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        hook = self.__dict__.get("between_writes")
        if hook is not None and name != "between_writes":
            self.__dict__["between_writes"] = None
            hook()


def test_a_sender_never_reads_the_new_lease_with_the_old_name(queue, outbox_mail):
    """A thread marks and sends right after reincarnate's first write: one snapshot or none.

    ``reincarnate`` used to bump a generation, then replace the name, then
    renew the lease, each read apart by the sender threads. A thread that came
    in between read the new generation with the old, dead name: it marked its
    row under the incarnation the sweeper was settling and sent it (under
    "requeue", a second copy; under "review", a row flagged that was sent).
    Now the name and the lease are one snapshot, replaced in one write under
    the lock the sender reads it with: the thread waits for that write, then
    marks and sends as the new incarnation.
    """
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    worker = PausingWorker(burst=True)
    old = worker.worker_id
    queue.register(old)
    loop = SenderLoop(worker, 0, get_delivery_connection())
    assert loop._claim()
    item = loop.pending.popleft()
    queue.redis.delete(queue.workers_key)  # declared dead meanwhile (Redis forgot it)
    seen: dict[str, object] = {}

    def mark_and_send() -> None:
        try:
            flight = loop._mark(item)
            assert flight is not None
            seen["outcome"] = loop.sender.deliver(flight).outcome
            seen["marked_as"] = Delivery.objects.get(pk=row.pk).worker_id
        finally:
            connection.close()

    sender = threading.Thread(target=mark_and_send)

    def a_sender_thread_runs_now() -> None:
        sender.start()
        # A sender that reads under the writer's lock waits for it: give up
        # waiting then, and let the writer finish.
        sender.join(2)

    worker.between_writes = a_sender_thread_runs_now
    worker.reincarnate(old)
    sender.join(10)
    assert sender.is_alive() is False and worker.worker_id != old
    assert seen["outcome"] == "sent" and len(outbox_mail) == 1
    assert seen["marked_as"] == worker.worker_id, (
        f"sent a row marked under the dead incarnation {seen['marked_as']}"
    )


@postgresql_only
@pytest.mark.slow
def test_a_worker_frozen_while_its_step_waits_on_a_row_lock_does_not_send(
    worker_process, smtp_server
):
    """SIGSTOP while the claim step waits on a lock; the step commits server-side meanwhile.

    The sweeper declares the frozen worker dead and flags the row; after
    SIGCONT the worker must not send it.
    """
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    proc = None
    with transaction.atomic():
        Delivery.objects.select_for_update().get(pk=row.pk)
        proc = worker_process("--concurrency", "1", OUTBOX_TEST_SMTP_PORT=str(smtp_server.port))
        wait_until(lambda: lock_waiters() > 0, 30)
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: process_state(proc) == "T", 10)
    # The lock is gone: the frozen worker's step commits without it.
    wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.PROCESSING, 10)
    wait_until(lambda: Sweeper(policy="review").run_pass().abandoned == 1, 20)
    proc.send_signal(signal.SIGCONT)
    queue = RedisQueue()
    wait_until(lambda: len(queue.live_workers()) == 1, 20)  # carries on as a new incarnation
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert smtp_server.count() == 0, out
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
    assert "no live lease before sending" in out or "declared dead" in out


def smtp_backend(settings, port: int):
    """Django's SMTP backend to ``port``, configured as a project would (any Django version)."""
    use_smtp(settings, port)
    return get_delivery_connection()


@pytest.fixture(params=[False, True], ids=["one-at-a-time", "pipelined"])
def either_server(request) -> Iterator[SMTPRecorder]:
    """An SMTP server on loopback; once offering PIPELINING (MAIL, RCPT and DATA come at once)."""
    server = SMTPRecorder(pipelining=request.param).start()
    yield server
    server.stop()


@pytest.mark.parametrize("may", [True, False])
def test_the_fence_is_asked_before_smtps_final_dot(may, settings, either_server):
    """Without the dot the server never takes the message: a 'no' there hands nothing over."""
    from django.core.mail import EmailMessage

    from outbox.exceptions import SendFencedError
    from outbox.mail.handover import watch_handover

    asked: list[int] = []
    backend = smtp_backend(settings, either_server.port)
    backend.open()
    watch_handover(backend, fence=lambda: asked.append(either_server.count()) or may)
    message = EmailMessage("s", "body\n" * 1000, "shop@example.com", ["a@example.com"])
    if may:
        assert backend.send_messages([message]) == 1
        wait_until(lambda: either_server.count() == 1, 5)
    else:
        with pytest.raises(SendFencedError):
            backend.send_messages([message])
        backend.close()
        # The server saw the body but no end to it; a new connection works.
        again = get_delivery_connection()
        assert again.send_messages([EmailMessage("t", "b", "shop@example.com", ["b@x.org"])]) == 1
        wait_until(lambda: either_server.count() == 1, 5)
        assert [r.rcpt_tos for r in either_server.received] == [["b@x.org"]]
    assert asked == [0]  # asked once, with the body written and nothing accepted yet


def test_the_fenced_dot_is_not_held_back_by_nagle(settings, smtp_server):
    """The dot is a write of its own after the body's: it must leave at once.

    With Nagle's algorithm on, the kernel holds that small write until the
    body is acknowledged, and the server acknowledges late (delayed ACK,
    about 40 ms on Linux) because it answers only after the dot.
    """
    import socket

    from outbox.mail.handover import watch_handover

    unfenced = smtp_backend(settings, smtp_server.port)
    unfenced.open()
    watch_handover(unfenced)  # no fence: one write, the socket as smtplib made it
    assert unfenced.connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    unfenced.close()
    backend = smtp_backend(settings, smtp_server.port)
    backend.open()
    watch_handover(backend, fence=lambda: True)
    assert backend.connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    backend.close()


def test_a_lease_that_runs_out_mid_send_releases_the_row(settings, smtp_server, outbox_mail):
    """Frozen after the check before the send, declared dead meanwhile: the dot is never sent."""
    enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker(burst=True)
    worker.queue.register(worker.worker_id)
    loop = SenderLoop(worker, 0, smtp_backend(settings, smtp_server.port))
    assert loop._claim()
    flight = loop._mark(loop.pending.popleft())
    assert flight is not None
    link = loop.sender.connections.get("")
    link.ensure_open()
    answers = iter([100.0, -1.0])  # alive at the check before the send, gone at the dot
    worker.lease_left = lambda worker_id: next(answers)  # type: ignore[method-assign]
    settlement = loop.sender.send(flight, link.backend)
    assert settlement.outcome == "released"
    assert smtp_server.count() == 0


def lock_waiters() -> int:
    with connection.cursor() as cursor:
        # Inside a transaction the view is a snapshot taken at first use.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.slow
def test_heartbeats_go_on_through_a_long_send_after_sigterm(worker_process):
    """SIGTERM during a send slower than HEARTBEAT_TIMEOUT: the row ends sent, never flagged."""
    smtp = SMTPRecorder(delay=5.0).start()  # the test settings' timeout is 3 s
    try:
        [row] = enqueue_email("s", "b", None, ["a@example.com"])
        proc = worker_process(OUTBOX_TEST_SMTP_PORT=str(smtp.port))
        wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.PROCESSING, 30)
        proc.send_signal(signal.SIGTERM)
        flagged: list[int] = []

        def swept_until_it_exits() -> bool:
            flagged.append(Sweeper(policy="review").run_pass().abandoned)
            return proc.poll() is not None

        wait_until(swept_until_it_exits, 30, interval=0.3)
        out = proc.stdout.read()
        assert proc.returncode == 0, out
        assert sum(flagged) == 0 and len(flagged) > 3  # swept past the timeout
        assert Delivery.objects.get(pk=row.pk).status == Status.SENT
        assert smtp.count() == 1
    finally:
        smtp.stop()


# -- BLOCK_TIMEOUT and the client's socket timeout ---------------------------------------


def test_an_idle_wait_longer_than_the_socket_timeout_returns_instead_of_failing(queue):
    kwargs = queue.redis.connection_pool.connection_kwargs
    client = redis.Redis(
        host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0), socket_timeout=1.5
    )
    short = RedisQueue(client)
    began = time.monotonic()
    assert short.wait(5.0) is False  # before: redis.TimeoutError after 1.5 s
    assert time.monotonic() - began < 1.5
