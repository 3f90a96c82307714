"""The promise at its edges: faults aimed at single steps of the protocol.

Each test names the fault and the transition it covers (see outbox/PROTOCOL.md):

- Redis damage short of FLUSHALL: lists lost while the dedup set survives, a set
  entry whose list entry is gone, stale ids of settled rows (mirror repair);
- a requeue "send now" of a cancelled scheduled row (cancelled -> queued, due now);
- a worker restarted at once under the same ``--worker-id`` (incarnations);
- a worker whose clock is minutes behind (one clock);
- the worker's shutdown and crash paths.

The SMTP edges (a server that never answers, one that cuts after DATA) are in
tests/faults/test_send_timeout.py and tests/faults/test_ambiguous.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.core.mail.backends import locmem
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test import override_settings
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attachment, Delivery, Email
from outbox.operations import cancel, requeue_now
from outbox.queue import RedisQueue, control
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from outbox.worker.cache import EmailCache
from tests.paths import ROOT
from tests.processes import process_state
from tests.servers import SMTPRecorder, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def burst(**kwargs) -> Worker:
    worker = Worker(burst=True, **kwargs)
    worker.run(install_signal_handlers=False)
    return worker


def reachable(queue: RedisQueue) -> set[int]:
    """Ids a worker can still get to: ready, scheduled, or in a live worker's list."""
    ids = queue.waiting_ids()
    for worker_id in queue.live_workers():
        ids.update(queue.processing_ids(worker_id))
    return ids


def stranded(queue: RedisQueue) -> set[int]:
    queued = set(Delivery.objects.filter(status=Status.QUEUED).values_list("pk", flat=True))
    return queued - reachable(queue)


# -- 1. ids stranded by the dedup set ---------------------------------------------------


def test_lists_lost_while_the_set_survives_are_rebuilt_by_the_full_check(queue, outbox_mail):
    """Transition: queued (id lost from Redis) -> queued (id re-pushed), by the database."""
    rows = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(40)])
    queue.redis.delete(*queue.ready_keys)  # the lists go, the dedup set stays
    assert queue.queued_count() == 40 and len(stranded(queue)) == 40
    report = Sweeper().run_pass(full_mirror_check=True)
    assert report.remirrored == 40 and stranded(queue) == set()
    burst()
    assert len(outbox_mail) == 40
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT}
    assert {r.pk for r in rows} == set(Delivery.objects.values_list("pk", flat=True))


def test_a_set_entry_without_its_list_entry_is_found_by_a_plain_pass(queue, outbox_mail):
    """The old BLMOVE-then-SREM gap: the id left the list but not the set."""
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    Sweeper().run_pass()  # the first pass is a full one; this test is about the next
    queue.redis.lrem(queue.ready_key("normal"), 0, row.pk)
    assert stranded(queue) == {row.pk}
    report = Sweeper().run_pass()
    assert report.full_mirror_check  # the set counted more ids than the lists held
    assert stranded(queue) == set()
    burst()
    assert len(outbox_mail) == 1


def test_stale_set_entries_of_settled_rows_are_dropped_and_duplicates_send_once(queue, outbox_mail):
    sent, queued = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    Delivery.objects.filter(pk=sent.pk).update(status=Status.SENT)
    queue.redis.delete(*queue.ready_keys)
    queue.redis.lpush(queue.ready_key("low"), queued.pk, queued.pk)  # duplicates
    Sweeper().run_pass(full_mirror_check=True)
    assert sent.pk not in queue.queued_set()
    burst()
    assert [m.to for m in outbox_mail] == [["b@example.com"]]


def test_a_blocked_worker_waits_on_a_wake_token_and_claims_by_script(queue, outbox_mail):
    """No blocking move: after waking, the claim script takes the id and its set entry."""
    assert queue.wait(0.05) is False
    worker = Worker()
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        wait_until(lambda: queue.live_workers(), 5)
        # Until it blocks on the wake-up key (BLOCK_TIMEOUT is 0.2 s in the test settings).
        wait_until(lambda: any(c["cmd"] == "blpop" for c in queue.redis.client_list()), 5)
        [row] = enqueue_email("s", "b", None, ["a@example.com"])
        wait_until(lambda: len(outbox_mail) == 1, 5)
        assert queue.queued_count() == 0 and stranded(queue) == set()
        assert queue.redis.exists(queue.wake_key) == 0  # nothing left to wake anyone for
        wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.SENT, 5)
    finally:
        worker.stop()
        thread.join(10)


# -- 2. a requeue that waits for its old schedule ------------------------------------------


def test_requeue_of_a_cancelled_scheduled_row_is_due_now(queue, outbox_mail):
    """Transitions: queued (scheduled next week) -> cancelled -> queued (due now).

    A transition to queued that does not keep the schedule (the sweeper's, and
    "Requeue and send now", ``transitions.REQUEUE_NOW``) makes the row due now and
    replaces its old scheduled entry. An operator's plain requeue keeps a later send time instead
    (tests/faults/test_clocks.py).
    """
    [row] = enqueue_email(
        "s", "b", None, ["a@example.com"], send_at=timezone.now() + timedelta(days=7)
    )
    assert queue.scheduled_length() == 1
    cancel([row.pk], "t")
    requeue_now([row.pk], "t")
    assert queue.scheduled_length() == 0
    assert [int(i) for i in queue.redis.lrange(queue.ready_key("normal"), 0, -1)] == [row.pk]
    burst()
    assert len(outbox_mail) == 1


def test_a_push_moves_a_scheduled_id_to_the_rows_new_time(queue):
    later = timezone.now() + timedelta(days=7)
    [row] = enqueue_email("s", "b", None, ["a@example.com"], send_at=later)
    sooner = timezone.now() + timedelta(hours=1)
    Delivery.objects.filter(pk=row.pk).update(not_before=sooner)
    Sweeper().run_pass(full_mirror_check=True)  # the row did not change since: nothing to do
    from outbox.queue import QueueEntry
    from outbox.queue.publish import publish

    publish([QueueEntry(row.pk, "normal", sooner.timestamp())])
    [(member, score)] = queue.redis.zrange(queue.scheduled_key, 0, -1, withscores=True)
    assert member.decode() == f"{row.pk}:2" and abs(score - sooner.timestamp()) < 0.001


# -- 5. fenced worker identity ---------------------------------------------------------


def test_a_declared_dead_incarnation_cannot_claim(queue):
    enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    queue.declare_dead(timeout=-1)
    result = queue.claim("w#1", 10)
    assert result.registered is False and result.items == []
    assert queue.redis.llen(queue.ready_key("normal")) == 1
    assert queue.redis.exists(queue.processing_key("w#1")) == 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["review", "requeue"])
def test_restart_under_the_same_worker_id_does_not_hold_the_old_row(
    policy, worker_process, smtp_server
):
    """SIGKILL mid-send, then an immediate restart under the same --worker-id."""
    [victim] = enqueue_email("s", "b", None, ["victim@example.com"])
    env = {"OUTBOX_TEST_SMTP_PORT": str(smtp_server.port), "OUTBOX_TEST_ABANDONED_POLICY": policy}
    first = worker_process(
        "--worker-id", "mail-1", OUTBOX_FAULT_POINT="after_mark_processing", **env
    )
    wait_until(lambda: process_state(first) == "T", timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    row = Delivery.objects.get(pk=victim.pk)
    assert row.status == Status.PROCESSING and row.worker_id.startswith("mail-1#")
    second = worker_process("--worker-id", "mail-1", **env)
    queue = RedisQueue()
    wait_until(lambda: any(w != row.worker_id for w in queue.live_workers()), 20)
    assert next(iter(queue.live_workers())).startswith("mail-1#")

    def settled() -> bool:
        Sweeper(policy=policy).run_pass()
        return Delivery.objects.get(pk=victim.pk).status != Status.PROCESSING

    wait_until(settled, 30, interval=0.5)
    want = Status.ABANDONED if policy == "review" else Status.SENT
    wait_until(lambda: Delivery.objects.get(pk=victim.pk).status == want, 30)
    assert smtp_server.by_message_id().get(row.message_id, 0) == (0 if policy == "review" else 1)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0


# -- 3. no send held forever ------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_during_a_stalled_send_exits_within_send_timeout(worker_process):
    """A server that never answers the final dot: SIGTERM still ends the worker in time."""
    server = SMTPRecorder(after_data="stall").start()
    try:
        [row] = enqueue_email("s", "b", None, ["a@example.com"])
        proc = worker_process(
            OUTBOX_TEST_SMTP_PORT=str(server.port),
            OUTBOX_TEST_SEND_TIMEOUT="4",
            OUTBOX_TEST_ABANDONED_POLICY="review",
        )
        wait_until(lambda: server.count() == 1, 20)  # the body is handed over; no reply
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=4 + 10) == 0
        assert time.monotonic() - started < 4 + 5
        after = Delivery.objects.get(pk=row.pk)
        assert after.status == Status.ABANDONED and "in doubt" in after.last_error
    finally:
        server.stop()


# -- 6. one clock -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_whose_clock_is_minutes_behind_delivers_everything_once(smtp_server):
    """Heartbeats, claims and promotion use Redis TIME; due tests the database's clock."""
    from tests.chaos.faults.skew import libfaketime

    now_rows = enqueue_email("s", "b", None, [f"n{i}@example.com" for i in range(5)])
    send_at = timezone.now() + timedelta(seconds=4)
    [scheduled] = enqueue_email("s", "b", None, ["later@example.com"], send_at=send_at)
    # libfaketime with the wall clock 90 s behind; tests/chaos/worker_main.py
    # says why the monotonic clock stays real and how Python is kept working.
    env = {
        "OUTBOX_TEST_SMTP_PORT": str(smtp_server.port),
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": "-90s",
        "DONT_FAKE_MONOTONIC": "1",
        "OUTBOX_CHAOS_SLEEP_FIX": "1",
    }
    skewed = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.worker_main", "outbox_worker"],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        queue = RedisQueue()
        wait_until(lambda: queue.live_workers(), 20)
        [incarnation] = queue.live_workers()

        def all_sent() -> bool:
            report = Sweeper().run_pass()  # this process's clock is right
            assert report.abandoned == 0 and queue.dead_workers() == []
            return Delivery.objects.filter(status=Status.SENT).count() == 6

        wait_until(all_sent, 30, interval=0.5)
        assert list(queue.live_workers()) == [incarnation]  # never declared dead
        statuses = set(Delivery.objects.values_list("status", flat=True))
        assert statuses == {Status.SENT}
        counts = smtp_server.by_message_id()
        for row in [*now_rows, scheduled]:
            assert counts[row.message_id] == 1
        sent_at = Delivery.objects.get(pk=scheduled.pk).sent_at
        # Sent on Redis' clock, not 90 s late (nor early) by the worker's.
        assert send_at - timedelta(seconds=1) <= sent_at <= send_at + timedelta(seconds=15)
        assert abs((sent_at - timezone.now()).total_seconds()) < 60
    finally:
        skewed.send_signal(signal.SIGTERM)
        assert skewed.wait(timeout=30) == 0, skewed.stdout.read() if skewed.stdout else ""
        if skewed.stdout:
            skewed.stdout.close()


# -- 7. shutdown and crash paths --------------------------------------------------------


class ExplodingBackend(locmem.EmailBackend):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("this backend cannot be created")


def test_a_crashed_sender_thread_makes_the_worker_exit_non_zero():
    enqueue_email("s", "b", None, ["a@example.com"])
    with override_settings(
        OUTBOX={"EMAIL_BACKEND": "tests.faults.test_promise_edges.ExplodingBackend"}
    ):
        assert Worker(burst=True).run(install_signal_handlers=False) == 1


def test_the_last_outcome_and_the_pending_ids_are_written_when_the_loop_dies(queue, outbox_mail):
    rows = enqueue_email("s", "b", None, ["a@example.com", "b@example.com", "c@example.com"])

    def progress(delivered: int, at: float) -> None:
        raise RuntimeError("a bug after the first message")

    worker = Worker(burst=True, progress=progress)
    assert worker.run(install_signal_handlers=False) == 1
    statuses = dict(Delivery.objects.values_list("pk", "status"))
    assert sorted(statuses.values()) == [Status.QUEUED, Status.QUEUED, Status.SENT]
    assert len(outbox_mail) == 1
    back = {int(i) for i in queue.redis.lrange(queue.ready_key("normal"), 0, -1)}
    assert back == {pk for pk, s in statuses.items() if s == Status.QUEUED}
    assert queue.redis.exists(queue.processing_key(worker.worker_id)) == 0
    assert {r.pk for r in rows} == set(statuses)


# pg_terminate_backend cuts one PostgreSQL connection from another.
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="cuts a connection with pg_terminate_backend"
)


def burst_cutting_the_thread_connection(first: Delivery, outbox_mail: list) -> None:
    """Run a burst worker whose sender thread's own connection the server cuts once.

    The cut comes from the worker's ``progress`` hook, in the sender thread,
    once ``first`` was handed over; the worker must then end normally (exit
    status 1 means a sender thread crashed) with ``first`` sent.
    """
    cuts: list[int] = []

    def progress(delivered: int, at: float) -> None:
        if cuts:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        admin = connections.create_connection(DEFAULT_DB_ALIAS)
        try:
            with admin.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            admin.close()
        cuts.append(pid)

    worker = Worker(burst=True, concurrency=1, progress=progress)
    assert worker.run(install_signal_handlers=False) == 0
    assert len(cuts) == 1
    assert [m.to for m in outbox_mail] == [[first.recipient]]
    assert Delivery.objects.get(pk=first.pk).status == Status.SENT


@postgresql_only
def test_a_cut_thread_connection_after_the_step_is_a_retry_not_a_crash(queue, outbox_mail):
    """The step runs on the worker's step connection; what it claimed is read on the thread's.

    A stale id (its row processing under another claim) makes the sender
    thread read the row on its own connection, which the server cut after the
    first message. Found by the chaos run: the thread crashed and the worker
    exited 1.
    """
    sent, stale = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    Delivery.objects.filter(pk=stale.pk).update(
        status=Status.PROCESSING,
        claim_token=uuid.uuid4(),
        worker_id="other#1",
        processing_started_at=timezone.now(),
    )
    burst_cutting_the_thread_connection(sent, outbox_mail)
    assert Delivery.objects.get(pk=stale.pk).worker_id == "other#1"  # left alone


@postgresql_only
def test_a_cut_thread_connection_at_a_give_back_is_a_retry_not_a_crash(queue, outbox_mail):
    """A paused domain's row is given back on the thread's own connection, cut just before."""
    control.pause("hold.example", queue)
    sent, held = enqueue_email("s", "b", None, ["a@example.com", "b@hold.example"])
    burst_cutting_the_thread_connection(sent, outbox_mail)
    row = Delivery.objects.get(pk=held.pk)
    assert (row.status, row.attempts) == (Status.QUEUED, 0)  # given back once: not an attempt
    assert queue.waiting_ids() == {held.pk}


def test_deregistering_never_deletes_ids_it_could_not_give_back(queue, outbox_mail):
    enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    queue.register("w#1")
    assert len(queue.claim("w#1", 2).items) == 2
    queue.give_back("w#1", [], deregister=True)  # as at exit, with ids still held
    assert queue.processing_ids("w#1") and queue.dead_workers() == ["w#1"]
    report = Sweeper().run_pass()
    assert report.returned == 2 and queue.dead_workers() == []
    burst()
    assert len(outbox_mail) == 2


def test_a_claim_whose_reply_was_lost_is_answered_again(queue):
    rows = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(4)])
    queue.register("w#1")
    first = queue.claim("w#1", 2, thread=3, nonce="n1")
    again = queue.claim("w#1", 2, thread=3, nonce="n1")  # the retry after a lost reply
    assert again.items == first.items and len(first.items) == 2
    nxt = queue.claim("w#1", 2, thread=3, nonce="n2")
    assert {c.id for c in first.items + nxt.items} == {r.pk for r in rows}
    assert sorted(queue.processing_ids("w#1")) == sorted(r.pk for r in rows)


def test_the_email_cache_is_bounded_in_bytes():
    # An entry counts its attachments' bytes, and 2.5 times more while the
    # message built from them (base64), which the copies share, is kept.
    cache = EmailCache(max_bytes=5_000_000)
    for i in range(10):
        email = Email(pk=i + 1, subject="s", body="b", from_email="f@example.com")
        cache.put(email, [Attachment(name="a.bin", content=b"x" * 1_000_000)])
        cache.builds(email)
        assert cache.size <= 5_000_000
    assert len(cache) == 1 and cache.recent() == 10
    huge = Email(pk=99, subject="s", body="b" * 4_000_000, from_email="f@example.com")
    cache.put(huge, [])
    assert cache.get(99) is None and cache.recent() == 10
