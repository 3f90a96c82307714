"""The sweeper, in process: dead workers, stuck rows, the mirror, the lock, retention."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Email
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def ready(queue, priority="normal") -> list[int]:
    return [int(x) for x in queue.redis.lrange(queue.ready_key(priority), 0, -1)]


def simulate_dead_worker(queue, worker_id: str, n_claim: int, mark: int) -> list:
    """A worker claims `n_claim` ids, marks the first `mark` processing, then dies."""
    register_stale(queue, worker_id, 3600)
    claimed = queue.claim(worker_id, n_claim).items
    now = timezone.now() - timedelta(hours=1)
    for item in claimed[:mark]:
        Delivery.objects.filter(pk=item.id).update(
            status=Status.PROCESSING,
            worker_id=worker_id,
            claim_token=uuid.uuid4(),
            attempts=1,
            processing_started_at=now,
        )
    return claimed


def test_dead_worker_review_policy(queue):
    deliveries = enqueue_email("s", "b", None, ["a@x.com", "b@x.com", "c@x.com", "d@x.com"])
    claimed = simulate_dead_worker(queue, "dead-1", 3, mark=1)
    Delivery.objects.filter(pk=claimed[2].id).update(status=Status.SENT)  # finished, not acked
    report = Sweeper(policy="review").run_pass()
    assert (report.reaped, report.returned, report.abandoned) == (1, 1, 1)
    assert Delivery.objects.get(pk=claimed[0].id).status == Status.ABANDONED
    assert Delivery.objects.get(pk=claimed[1].id).status == Status.QUEUED
    assert Delivery.objects.get(pk=claimed[2].id).status == Status.SENT
    assert sorted(ready(queue)) == sorted([claimed[1].id, deliveries[3].pk])
    assert queue.redis.exists(queue.processing_key("dead-1")) == 0
    assert queue.live_workers() == {} and queue.dead_workers() == []
    log = list(Attempt.objects.filter(delivery_id=claimed[0].id).values_list("outcome", "actor"))
    assert log == [("abandoned", "sweeper")]
    row = Delivery.objects.get(pk=claimed[0].id)
    assert "dead-1" in row.last_error and "Message-ID" in row.last_error


def test_dead_worker_requeue_policy_counts_attempts(queue):
    enqueue_email("s", "b", None, ["a@x.com", "b@x.com"], max_attempts=1)
    enqueue_email("s", "b", None, ["c@x.com"], max_attempts=3)
    claimed = simulate_dead_worker(queue, "dead-2", 3, mark=3)
    report = Sweeper(policy="requeue").run_pass()
    # Rows with attempts left go back; rows that used their last attempt fail.
    assert (report.requeued, report.failed, report.abandoned) == (1, 2, 0)
    statuses = {item.id: Delivery.objects.get(pk=item.id).status for item in claimed}
    assert sorted(statuses.values()) == ["failed", "failed", "queued"]
    requeued = next(pk for pk, s in statuses.items() if s == "queued")
    assert ready(queue) == [requeued]


def test_live_worker_is_left_alone(queue):
    enqueue_email("s", "b", None, ["a@x.com"])
    queue.register("alive")
    claimed = queue.claim("alive", 1).items
    Delivery.objects.filter(pk=claimed[0].id).update(
        status=Status.PROCESSING,
        worker_id="alive",
        processing_started_at=timezone.now() - timedelta(hours=1),
    )
    report = Sweeper().run_pass()
    assert report.reaped == 0 and report.abandoned == 0
    assert Delivery.objects.get().status == Status.PROCESSING
    assert queue.processing_ids("alive") == [claimed[0].id]


def test_stuck_rows_are_settled_even_when_redis_lost_everything(queue):
    deliveries = enqueue_email("s", "b", None, ["a@x.com", "b@x.com", "c@x.com"])
    old = timezone.now() - timedelta(hours=1)
    Delivery.objects.filter(pk=deliveries[0].pk).update(
        status=Status.PROCESSING, worker_id="gone", processing_started_at=old
    )
    Delivery.objects.filter(pk=deliveries[1].pk).update(
        status=Status.PROCESSING, worker_id="gone", processing_started_at=timezone.now()
    )
    queue.redis.flushall()
    report = Sweeper(policy="review").run_pass()
    assert report.abandoned == 1 and report.full_mirror_check
    assert Delivery.objects.get(pk=deliveries[0].pk).status == Status.ABANDONED
    # Too recent to judge: still processing.
    assert Delivery.objects.get(pk=deliveries[1].pk).status == Status.PROCESSING
    # The queued row is back in Redis.
    assert ready(queue) == [deliveries[2].pk]


def test_flushall_then_one_sweep_restores_every_queued_row_once(queue):
    now = enqueue_email("s", "b", None, [f"u{i}@x.com" for i in range(30)])
    high = enqueue_email("s", "b", None, ["h@x.com"], priority="high")
    later = enqueue_email("s", "b", None, ["l@x.com"], send_at=timezone.now() + timedelta(hours=1))
    Sweeper().run_pass()
    queue.redis.flushall()
    report = Sweeper().run_pass()
    assert report.full_mirror_check and report.remirrored == 32
    assert sorted(ready(queue)) == sorted(d.pk for d in now)
    assert ready(queue, "high") == [high[0].pk]
    assert queue.scheduled_length() == 1
    assert queue.redis.zscore(queue.scheduled_key, f"{later[0].pk}:2")
    # A second sweep adds nothing.
    assert Sweeper().run_pass().remirrored == 0
    assert len(ready(queue)) == 30


def test_repeated_sweeps_never_grow_redis_beyond_the_backlog(queue):
    enqueue_email("s", "b", None, [f"u{i}@x.com" for i in range(2000)])
    for _ in range(10):
        Sweeper().run_pass(full_mirror_check=True)
    assert queue.redis.llen(queue.ready_key("normal")) == 2000


def test_incremental_pass_does_not_rescan_old_rows(queue, django_assert_max_num_queries):
    enqueue_email("s", "b", None, [f"u{i}@x.com" for i in range(50)])
    Sweeper().run_pass()  # full: sets the marker
    # Age the rows past the margin: nothing changed since, so nothing to check.
    Delivery.objects.update(updated_at=timezone.now() - timedelta(hours=1))
    queue.redis.delete(queue.ready_key("normal"), queue.queued_key)  # lost, silently
    report = Sweeper().run_pass()
    assert not report.full_mirror_check and report.remirrored == 0
    # ...until the periodic (or forced) full check finds them.
    assert Sweeper().run_pass(full_mirror_check=True).remirrored == 50


def test_redis_down_at_enqueue_is_mirrored_by_the_incremental_pass(queue, settings):
    Sweeper().run_pass()  # marker present: the next pass is incremental
    good_caches = settings.CACHES
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.3},
        }
    }
    lost = enqueue_email("s", "b", None, ["a@x.com"])
    settings.CACHES = good_caches
    assert ready(queue) == []
    report = Sweeper().run_pass()
    assert not report.full_mirror_check and report.remirrored == 1
    assert ready(queue) == [lost[0].pk]


def test_sweeper_promotes_due_scheduled_ids(queue):
    at = timezone.now() + timedelta(milliseconds=200)
    delivery = enqueue_email("s", "b", None, ["a@x.com"], send_at=at)[0]
    Sweeper().run_pass()
    wait_until(lambda: timezone.now() >= at, 5)
    assert Sweeper().run_pass().promoted == 1
    assert ready(queue) == [delivery.pk]


def test_lock_lets_one_sweeper_act(queue):
    assert queue.acquire_lock("someone-else", 30)
    report = Sweeper().run_pass()
    assert report.lock_held_elsewhere and "another sweeper" in report.line()
    queue.release_lock("someone-else")


def test_concurrent_sweeps_do_not_double_act(queue):
    enqueue_email("s", "b", None, [f"u{i}@x.com" for i in range(20)])
    simulate_dead_worker(queue, "dead-3", 20, mark=10)
    reports = []
    barrier = threading.Barrier(3)

    def sweep() -> None:
        from django.db import connection

        barrier.wait()
        reports.append(Sweeper(policy="review").run_pass())
        connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acted = [r for r in reports if not r.lock_held_elsewhere]
    assert sum(r.abandoned for r in reports) == 10
    assert sum(r.returned for r in reports) == 10
    assert len(acted) >= 1
    assert Attempt.objects.filter(actor="sweeper").count() == 10
    assert len(ready(queue)) == 10


def test_two_sweepers_ignoring_the_lock_still_change_each_row_once(queue):
    enqueue_email("s", "b", None, [f"u{i}@x.com" for i in range(5)])
    old = timezone.now() - timedelta(hours=1)
    Delivery.objects.update(status=Status.PROCESSING, worker_id="gone", processing_started_at=old)
    first = Sweeper(policy="review")
    second = Sweeper(policy="review")
    from outbox.sweeper import SweepReport

    r1, r2 = SweepReport(), SweepReport()
    first._settle_stuck_rows(r1)
    second._settle_stuck_rows(r2)
    assert (r1.abandoned, r2.abandoned) == (5, 0)


def test_purge_sent_older_than(queue):
    old = enqueue_email("old", "b", None, ["a@x.com", "b@x.com"])
    new = enqueue_email("new", "b", None, ["c@x.com"])
    Delivery.objects.update(status=Status.SENT, sent_at=timezone.now())
    Delivery.objects.filter(pk__in=[d.pk for d in old]).update(
        sent_at=timezone.now() - timedelta(days=40)
    )
    report = Sweeper().run_pass(purge_sent_older_than=30)
    assert report.purged == 2
    assert list(Delivery.objects.values_list("pk", flat=True)) == [new[0].pk]
    assert list(Email.objects.values_list("subject", flat=True)) == ["new"]


def test_command_prints_one_line_and_json(queue, capsys):
    enqueue_email("s", "b", None, ["a@x.com"])
    call_command("outbox_sweep")
    out = capsys.readouterr().out
    assert out.startswith("sweep: returned to queue 0, marked abandoned 0, requeued 0")
    assert "dead workers reaped 0" in out
    import json

    call_command("outbox_sweep", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["reaped"] == 0 and data["lock_held_elsewhere"] is False


def test_a_pass_without_redis_fails_the_command(settings, capsys):
    """Exit 75 (try again later), and the line says so and where (cron mails it)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.3},
        }
    }
    with pytest.raises(SystemExit) as exited:
        call_command("outbox_sweep", skip_checks=True)
    assert exited.value.code == 75
    out = capsys.readouterr().out
    assert out.startswith("sweep failed: ")
    assert "Redis (cache 'default' at redis://127.0.0.1:1/0) is unreachable: ConnectionError" in out


def test_requeued_abandoned_row_is_delivered_by_a_worker(queue, outbox_mail):
    enqueue_email("s", "b", None, ["a@x.com"])
    simulate_dead_worker(queue, "dead-4", 1, mark=1)
    Sweeper(policy="requeue").run_pass()
    Worker(burst=True).run(install_signal_handlers=False)
    assert len(outbox_mail) == 1
    row = Delivery.objects.get()
    assert row.status == Status.SENT and row.attempts == 2


def test_a_row_locked_by_a_frozen_worker_does_not_stall_the_sweep(queue):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (SQLite locks the whole database)")
    deliveries = enqueue_email("s", "b", None, ["a@x.com", "b@x.com"])
    old = timezone.now() - timedelta(hours=1)
    Delivery.objects.update(status=Status.PROCESSING, worker_id="gone", processing_started_at=old)
    locked, released = threading.Event(), threading.Event()

    def frozen_worker() -> None:
        from django.db import connection as conn
        from django.db import transaction

        with transaction.atomic():
            Delivery.objects.filter(pk=deliveries[0].pk).update(last_error="mid-settle")
            locked.set()
            released.wait(30)
        conn.close()

    holder = threading.Thread(target=frozen_worker)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        report = Sweeper(policy="review").run_pass()
        assert time.monotonic() - started < 10
        assert report.abandoned == 1
        assert Delivery.objects.get(pk=deliveries[0].pk).status == Status.PROCESSING
        assert Delivery.objects.get(pk=deliveries[1].pk).status == Status.ABANDONED
    finally:
        released.set()
        holder.join(10)
    assert Sweeper(policy="review").run_pass().abandoned == 1
    assert Delivery.objects.get(pk=deliveries[0].pk).status == Status.ABANDONED


def register_stale(queue, worker_id: str, age: float) -> None:
    """Register a worker whose last heartbeat was `age` seconds ago, by Redis time."""
    queue.redis.zadd(queue.workers_key, {worker_id: queue.time() - age})
