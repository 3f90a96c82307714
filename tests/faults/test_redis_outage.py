"""Redis unavailable for a while, during enqueue and during delivery.

The app is pointed at a private redis-server that the test stops and starts
again (empty: it keeps no data). The database stays the truth throughout:
enqueue keeps working with Redis away, the sweeper re-mirrors what Redis
never got or lost, and every email arrives exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import pytest

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


@pytest.fixture
def private_redis(redis_server, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_server.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 1},
        }
    }
    return redis_server


def delivered_once(outbox_mail, deliveries) -> None:
    """Each delivery is sent and its Message-ID was delivered exactly once."""
    counts = Counter(m.extra_headers["Message-ID"] for m in outbox_mail)
    for delivery in deliveries:
        assert Delivery.objects.get(pk=delivery.pk).status == Status.SENT
        assert counts[delivery.message_id] == 1, delivery.recipient
    assert len(outbox_mail) == len(deliveries)


def all_sent(deliveries) -> bool:
    return Delivery.objects.filter(
        pk__in=[d.pk for d in deliveries], status=Status.SENT
    ).count() == len(deliveries)


def test_enqueue_while_redis_is_down_then_sweep_and_deliver(private_redis, outbox_mail, caplog):
    private_redis.stop()
    caplog.set_level(logging.WARNING, logger="outbox")
    deliveries = []
    for i in range(5):
        deliveries += enqueue_email(
            f"during outage {i}", "b", None, [f"u{i}@example.com", f"v{i}@example.com"]
        )
    # Returned normally: the rows are committed and queued, only the push failed.
    assert len(deliveries) == 10
    assert Delivery.objects.filter(status=Status.QUEUED).count() == 10
    assert caplog.text.count("Redis is unreachable") == 5

    # A sweep with Redis away changes nothing and does not raise.
    report = Sweeper().run_pass()
    assert report.errors and report.remirrored == 0

    private_redis.start()  # same port, empty
    queue = RedisQueue()
    assert queue.queued_count() == 0
    report = Sweeper().run_pass()
    assert report.remirrored == 10 and report.full_mirror_check
    assert queue.queued_count() == 10

    worker = Worker(burst=True)
    assert worker.run(install_signal_handlers=False) == 0
    assert worker.delivered_total == 10
    delivered_once(outbox_mail, deliveries)
    assert queue.queued_count() == 0 and queue.live_workers() == {}
    # A second sweep finds nothing left to do.
    report = Sweeper().run_pass()
    assert report.remirrored == 0 and not report.errors


def test_a_failed_push_is_one_warning_line(private_redis, caplog):
    """A web request during an outage logs one line: the error, not its traceback."""
    private_redis.stop()
    caplog.set_level(logging.WARNING, logger="outbox")
    enqueue_email("one", "b", None, ["one@example.com"])
    enqueue_email("two", "b", None, ["a@example.com", "b@example.com"])
    one, two = [r for r in caplog.records if "Redis is unreachable" in r.getMessage()]
    assert one.exc_info is None and two.exc_info is None
    assert "\n" not in one.getMessage()
    assert "(ConnectionError: " in one.getMessage()
    assert "1 queued delivery stays in the database until outbox_sweep mirrors it." in (
        one.getMessage()
    )
    assert "2 queued deliveries stay in the database until outbox_sweep mirrors them." in (
        two.getMessage()
    )


def test_worker_rides_out_a_redis_outage(private_redis, outbox_mail, caplog):
    caplog.set_level(logging.INFO, logger="outbox")
    worker = Worker()
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:  # the thread must never die
            crashed.append(exc)
            raise

    thread = threading.Thread(target=run, name="outbox-test-worker")
    thread.start()
    try:
        before = enqueue_email("before", "b", None, [f"before{i}@example.com" for i in range(3)])
        wait_until(lambda: all_sent(before), 15)

        private_redis.stop()
        down_since = time.monotonic()
        during = []
        for i in range(3):
            during += enqueue_email(f"during {i}", "b", None, [f"during{i}@example.com"])
        assert Delivery.objects.filter(status=Status.QUEUED).count() == 3
        # The worker notices (its claim or heartbeat fails) and keeps going.
        wait_until(lambda: "Redis is unavailable" in caplog.text, 10)
        wait_until(lambda: time.monotonic() - down_since >= 2.0, 5)
        assert thread.is_alive()

        private_redis.start()  # restarted empty: the "during" ids were never pushed
        after = enqueue_email("after", "b", None, [f"after{i}@example.com" for i in range(3)])
        report = Sweeper().run_pass()
        assert not report.errors
        wait_until(lambda: all_sent(before + during + after), 30)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()
    assert crashed == []
    assert "sender thread crashed" not in caplog.text
    delivered_once(outbox_mail, before + during + after)
    assert Delivery.objects.exclude(status=Status.SENT).count() == 0
    queue = RedisQueue()
    assert queue.queued_count() == 0
    assert queue.redis.keys("{outbox}:processing:*") == []
