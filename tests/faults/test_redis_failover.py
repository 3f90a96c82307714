"""Redis Sentinel and Redis Cluster: SIGKILL the outbox's primary mid-delivery.

Real topologies on loopback (tests/topologies.py), real worker and sweeper
subprocesses, a real SMTP server. A few hundred emails are enqueued, the
workers start sending, and the primary that holds the outbox's hash slot is
SIGKILLed. Every email must arrive exactly once and end ``sent``; the time to
recover is printed (``-s``) and recorded as a test property.

HEARTBEAT_TIMEOUT is set above the failover time, as the README asks of
production: a sweeper must not take a failover for dead workers.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from django.test import override_settings

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.queue import RedisQueue
from outbox.status import snapshot as status
from tests.cells import slow_processes
from tests.servers import SMTPRecorder, wait_until
from tests.topologies import ClusterSetup, SentinelSetup

pytestmark = slow_processes(
    ("6.1:postgres",),
    why="Sentinel and Cluster are on the Redis side, not in Django or the SQL dialect",
)

EMAILS = 300


def _writable() -> bool:
    """The outbox's slot takes a write again (through the cache's own client)."""
    try:
        queue = RedisQueue()
        queue.time()
        queue.redis.set("{outbox}:probe", "1")
    except Exception:
        return False
    return True


def fail_over_mid_delivery(
    topology: Any,
    kill: Callable[[], None],
    worker_process: Callable[..., subprocess.Popen[str]],
    sweeper_process: Callable[..., subprocess.Popen[str]],
    record_property: Callable[[str, Any], None],
    name: str,
) -> None:
    smtp = SMTPRecorder(delay=0.02).start()
    try:
        with override_settings(CACHES={"default": topology.cache()}):
            deliveries = enqueue_email(
                "Failover", "b", None, [f"u{i}@example.com" for i in range(EMAILS)]
            )
            env = {
                **topology.env(),
                "OUTBOX_TEST_SMTP_PORT": str(smtp.port),
                "OUTBOX_TEST_HEARTBEAT_TIMEOUT": "20",
            }
            workers = [worker_process("--concurrency", "2", **env) for _ in range(2)]
            sweeper = sweeper_process("--loop", "1", **env)
            wait_until(lambda: smtp.count() >= EMAILS // 4, timeout=60)
            sent_at_kill = smtp.count()
            killed = time.monotonic()
            kill()
            wait_until(_writable, timeout=30, interval=0.05)
            writable = time.monotonic() - killed
            wait_until(
                lambda: Delivery.objects.filter(status=Delivery.Status.SENT).count() == EMAILS,
                timeout=45,
                interval=0.1,
            )
            drained = time.monotonic() - killed
            # outbox_status reads the topology too (its MULTI is single-slot), and
            # sees both workers registered there, not in the cell's own Redis.
            snapshot = status.collect()
            assert snapshot["redis"]["ok"], snapshot["redis"]["error"]
            assert len([w for w in snapshot["redis"]["workers"] if w["alive"]]) == 2
            for proc in [*workers, sweeper]:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    finally:
        smtp.stop()
    print(
        f"\n{name}: primary SIGKILLed after {sent_at_kill}/{EMAILS} emails; "
        f"the outbox's slot took writes again after {writable:.2f} s; "
        f"all {EMAILS} sent {drained:.2f} s after the kill"
    )
    record_property(f"{name}_writable_after_s", round(writable, 2))
    record_property(f"{name}_all_sent_after_s", round(drained, 2))
    counts = smtp.by_message_id()
    assert sent_at_kill < EMAILS  # the kill really was mid-delivery
    assert sorted(counts) == sorted(d.message_id for d in deliveries)
    assert set(counts.values()) == {1}, {m: n for m, n in counts.items() if n != 1}
    assert smtp.count() == EMAILS
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.SENT}


def test_sentinel_failover_mid_delivery(worker_process, sweeper_process, record_property):
    setup = SentinelSetup().start()
    try:
        before = setup.current_primary_port()
        assert before == setup.primary.port
        fail_over_mid_delivery(
            setup,
            setup.primary.kill,
            worker_process,
            sweeper_process,
            record_property,
            "sentinel",
        )
        # The sentinels moved the service to the replica (all of them agree soon).
        wait_until(lambda: setup.current_primary_port() == setup.replica.port, timeout=10)
    finally:
        setup.close()


def test_cluster_failover_mid_delivery(worker_process, sweeper_process, record_property):
    setup = ClusterSetup().start()
    try:
        holder = setup.node_holding("{outbox}:queued")
        fail_over_mid_delivery(
            setup, holder.kill, worker_process, sweeper_process, record_property, "cluster"
        )
        # A replica took the slot over.
        assert setup.node_holding("{outbox}:queued") is not holder
    finally:
        setup.close()
