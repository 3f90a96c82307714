"""``manage.py outbox_status``: a known state, read back as JSON and as text."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.queue import QueueEntry, RedisQueue
from outbox.queue.reliable import RELEASE_LEVEL
from outbox.status import collect, render
from outbox.status.snapshot import COMPARE_LIMIT
from tests.paths import ROOT
from tests.servers import subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

STATUSES = ["queued", "processing", "sent", "failed", "abandoned", "cancelled"]


def status_json() -> dict:
    out = StringIO()
    call_command("outbox_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def counts(**values: int) -> dict[str, int]:
    return {status: values.get(status, 0) for status in STATUSES}


@pytest.fixture
def known_state(queue: RedisQueue) -> dict:
    """Rows in every interesting state, and Redis agreeing with them.

    - sent 10 s ago and 30 min ago, and one failed (normal priority);
    - two due normal rows, one of them due for two minutes;
    - one high-priority row claimed by worker w1 and marked processing;
    - one low-priority row scheduled an hour from now;
    - worker w2, registered long ago and silent since.
    """
    now = timezone.now()
    done = enqueue_email("done", "b", None, ["s1@example.com", "s2@example.com", "f@example.com"])
    Delivery.objects.filter(pk=done[0].pk).update(
        status="sent", sent_at=now - timedelta(seconds=10)
    )
    Delivery.objects.filter(pk=done[1].pk).update(
        status="sent", sent_at=now - timedelta(minutes=30)
    )
    Delivery.objects.filter(pk=done[2].pk).update(status="failed", last_error="550")
    queue.redis.flushdb()  # their ids were acknowledged long ago

    due = enqueue_email("due", "b", None, ["a@example.com", "b@example.com"])
    Delivery.objects.filter(pk=due[0].pk).update(not_before=now - timedelta(minutes=2))
    [high] = enqueue_email("high", "b", None, ["h@example.com"], priority="high")
    [later] = enqueue_email(
        "later", "b", None, ["l@example.com"], priority="low", send_at=now + timedelta(hours=1)
    )
    queue.register("w1")
    assert [c.id for c in queue.claim("w1", 1).items] == [high.pk]  # high priority first
    Delivery.objects.filter(pk=high.pk).update(status="processing", worker_id="w1")
    register_stale(queue, "w2", 600)
    return {"done": done, "due": due, "high": high, "later": later}


def test_json_reports_the_known_state(known_state):
    report = status_json()
    assert set(report) == {"version", "time", "valve", "database", "redis", "agreement"}
    assert report["version"] == 1
    db = report["database"]
    assert db["ok"] is True and db["error"] is None
    assert db["by_status"] == counts(queued=3, processing=1, sent=2, failed=1)
    assert db["by_priority"] == {
        "high": counts(processing=1),
        "normal": counts(queued=2, sent=2, failed=1),
        "low": counts(queued=1),
    }
    assert (db["due"], db["scheduled"]) == (2, 1)
    assert 115 <= db["oldest_due_age"] <= 180
    assert (db["sent_last_minute"], db["sent_last_hour"]) == (1, 2)

    redis = report["redis"]
    assert redis["ok"] is True and redis["error"] is None
    assert redis["ready"] == {"high": 0, "normal": 2, "low": 0}
    assert redis["scheduled"] == 1
    workers = {w["id"]: w for w in redis["workers"]}
    assert sorted(workers) == ["w1", "w2"]
    assert workers["w1"]["held"] == [known_state["high"].pk]
    assert workers["w1"]["alive"] is True and 0 <= workers["w1"]["heartbeat_age"] < 60
    assert workers["w2"]["held"] == [] and workers["w2"]["alive"] is False
    assert 590 <= workers["w2"]["heartbeat_age"] <= 700
    assert redis["dead_workers"] == []

    assert db["estimated"] == []  # a small table is counted, on every database
    assert report["agreement"] == {
        "ready": {"agrees": True, "missing": 0, "stale": 0, "database": 2, "redis": 2},
        "scheduled": {"agrees": True, "missing": 0, "stale": 0, "database": 1, "redis": 1},
    }


def test_disagreement_is_counted(known_state, queue):
    # Redis lost the normal ready list, and a sent row's id came back as stale.
    queue.redis.delete(queue.ready_key("normal"))
    sent = known_state["done"][0]
    queue.push([QueueEntry(sent.pk, "normal", time.time())])
    queue.redis.zadd(queue.scheduled_key, {f"{known_state['done'][2].pk}:2": time.time() + 60})
    agreement = status_json()["agreement"]
    assert agreement["ready"] == {
        "agrees": False,
        "missing": 2,
        "stale": 1,
        "database": 2,
        "redis": 1,
    }
    assert agreement["scheduled"] == {
        "agrees": False,
        "missing": 0,
        "stale": 1,
        "database": 1,
        "redis": 2,
    }


def test_a_row_due_but_still_in_the_schedule_is_not_missing(queue):
    [row] = enqueue_email(
        "s", "b", None, ["a@example.com"], send_at=timezone.now() + timedelta(hours=1)
    )
    # Its time came: the database says due, Redis still has it scheduled until the next claim.
    Delivery.objects.filter(pk=row.pk).update(not_before=timezone.now() - timedelta(seconds=1))
    agreement = status_json()["agreement"]
    assert agreement["ready"]["agrees"] is True
    assert agreement["scheduled"]["agrees"] is True


def test_dead_workers_are_listed_with_what_they_hold(queue):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    register_stale(queue, "gone", 100)
    queue.claim("gone", 1)
    assert queue.declare_dead(timeout=10) == ["gone"]
    report = status_json()
    assert report["redis"]["workers"] == []
    assert report["redis"]["dead_workers"] == [{"id": "gone", "held": [row.pk]}]
    assert report["agreement"]["ready"]["agrees"] is True  # held by the dead worker


def test_a_worker_of_an_earlier_release_is_named_with_its_level(queue):
    """During a rolling upgrade: 0.1.0's workers announce no level (the README's "Upgrading")."""
    queue.register("new#1")
    queue.register("old#1")
    queue.redis.hdel(queue.releases_key, "old#1")  # as 0.1.0's registration leaves it
    report = status_json()
    levels = {w["id"]: w["release_level"] for w in report["redis"]["workers"]}
    assert levels == {"new#1": RELEASE_LEVEL, "old#1": 1}
    assert report["redis"]["release_level"] == RELEASE_LEVEL
    text = render(collect())
    [old] = [line for line in text.splitlines() if "old#1:" in line]
    [new] = [line for line in text.splitlines() if "new#1:" in line]
    assert "(an earlier release, level 1: content is kept)" in old
    assert "earlier release" not in new


def test_empty_outbox():
    report = status_json()
    assert report["database"]["by_status"] == counts()
    assert report["database"]["oldest_due_age"] is None
    assert report["redis"]["workers"] == []


def test_before_any_worker_has_run_status_says_so_in_words(queue):
    assert "Sending: no worker yet" in render(collect())
    queue.register("w#1")  # a worker, but the pause switches are gone
    assert "Sending: UNKNOWN (Redis lost the pause switches" in render(collect())


def test_too_many_ids_are_not_compared(known_state, monkeypatch, queue):
    with CaptureQueriesContext(connection) as captured:
        assert collect()["agreement"]["ready"]["agrees"] is True
    assert any("is_due" in q["sql"] for q in captured.captured_queries)  # ids compared
    monkeypatch.setattr("outbox.status.snapshot.COMPARE_LIMIT", 2)
    assert COMPARE_LIMIT > 2
    # 3 queued rows: over the limit; only the counts are read, on both sides.
    queue.redis.delete(queue.ready_key("normal"))
    with CaptureQueriesContext(connection) as captured:
        report = collect()
    # The query of every queued id (with whether it is due) is not run.
    assert not any("is_due" in q["sql"] for q in captured.captured_queries)
    not_compared = {"agrees": None, "missing": None, "stale": None, "limit": 2}
    assert report["agreement"] == {
        "ready": {**not_compared, "database": 2, "redis": 0},
        "scheduled": {**not_compared, "database": 1, "redis": 1},
    }
    out = StringIO()
    call_command("outbox_status", stdout=out)
    assert "ready vs database: not compared id by id (over 2 ids); database 2, Redis 0" in (
        out.getvalue()
    )


def test_redis_ids_over_the_limit_are_not_read(known_state, monkeypatch, queue):
    monkeypatch.setattr("outbox.status.snapshot.COMPARE_LIMIT", 3)
    # The database holds 3 queued rows (not over); Redis holds 4 ids.
    queue.redis.zadd(queue.scheduled_key, {"999999:2": time.time() + 60})
    report = collect()
    assert report["agreement"]["scheduled"] == {
        "agrees": None,
        "missing": None,
        "stale": None,
        "limit": 3,
        "database": 1,
        "redis": 2,
    }


def make_rows(status: str, n: int) -> None:
    rows = enqueue_email(status, "b", None, [f"{status}{i}@example.com" for i in range(n)])
    if status != "queued":
        Delivery.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=status, sent_at=timezone.now() if status == "sent" else None
        )


def test_sent_is_estimated_on_postgresql_and_counted_elsewhere(monkeypatch, queue):
    """Above ESTIMATE_ABOVE sent rows PostgreSQL reports the planner's estimate, marked as one;
    SQLite counts. The others are counted everywhere."""
    monkeypatch.setattr("outbox.status.snapshot.ESTIMATE_ABOVE", 20)
    make_rows("sent", 30)
    make_rows("failed", 2)
    make_rows("queued", 3)
    with connection.cursor() as cursor:
        # Fresh statistics: the estimate of a small, just analysed table is its size.
        cursor.execute("ANALYZE outbox_delivery")
    db = collect()["database"]
    assert db["by_status"] == counts(queued=3, sent=30, failed=2)
    out = StringIO()
    call_command("outbox_status", stdout=out)
    sent_line = next(line for line in out.getvalue().splitlines() if line.startswith("sent"))
    if connection.vendor == "postgresql":
        assert db["estimated"] == ["sent"]
        assert all(db["by_priority"][p]["sent"] is None for p in ("high", "normal", "low"))
        assert sent_line.split() == ["sent", "-", "-", "-", "≈30"]
        assert "≈ PostgreSQL's estimate, not a count" in out.getvalue()
    else:
        assert db["estimated"] == []
        assert db["by_priority"]["normal"]["sent"] == 30
        assert sent_line.split() == ["sent", "0", "30", "0", "30"]
        assert "≈" not in out.getvalue()
    assert db["by_priority"]["normal"]["failed"] == 2  # exact everywhere

    # Delete 10 sent rows. The table keeps its pages until a VACUUM, and its
    # statistics until an ANALYZE: the estimate does not move, the count does.
    Delivery.objects.filter(
        pk__in=Delivery.objects.filter(status="sent").values("pk")[:10]
    ).delete()
    Delivery.objects.filter(status="failed").delete()
    db = collect()["database"]
    assert db["by_status"]["failed"] == 0  # counted
    assert db["by_status"]["sent"] == (32 if connection.vendor == "postgresql" else 20)


def test_below_the_threshold_postgresql_counts_too(monkeypatch):
    monkeypatch.setattr("outbox.status.snapshot.ESTIMATE_ABOVE", 31)
    make_rows("sent", 30)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE outbox_delivery")
    db = collect()["database"]
    assert db["estimated"] == [] and db["by_status"]["sent"] == 30
    assert db["by_priority"]["normal"]["sent"] == 30


def test_redis_down(known_state, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }
    report = status_json()  # call_command raised nothing: exit status 0
    assert report["redis"]["ok"] is False
    assert "Connection" in report["redis"]["error"]
    assert set(report["redis"]) == {"ok", "error"}
    assert report["agreement"] is None
    assert report["database"]["by_status"] == counts(queued=3, processing=1, sent=2, failed=1)

    out = StringIO()
    call_command("outbox_status", stdout=out)
    text = out.getvalue()
    assert "Redis: unreachable" in text
    assert "Due now: 2" in text


def test_text_output(known_state):
    out = StringIO()
    call_command("outbox_status", stdout=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith("Outbox status at ")
    header = next(line for line in lines if line.startswith("Deliveries"))
    assert header.split() == ["Deliveries", "high", "normal", "low", "total"]
    assert next(line for line in lines if line.startswith("queued")).split() == [
        "queued",
        "0",
        "2",
        "1",
        "3",
    ]
    assert "Due now: 2 (oldest waiting 2m" in text
    assert "Sent: 1 in the last minute, 2 in the last hour" in text
    assert "Redis: ready high 0, normal 2, low 0; scheduled 1" in text
    assert "ready vs database: agree" in text
    assert "w1: heartbeat " in text and f"holding 1 ({known_state['high'].pk})" in text
    assert "w2: heartbeat" in text and "(no heartbeat: presumed dead)" in text


def test_watch_needs_a_positive_interval():
    with pytest.raises(CommandError):
        call_command("outbox_status", "--watch", "0")


@pytest.mark.parametrize("as_json", [False, True])
def test_watch_refreshes_until_ctrl_c(as_json):
    enqueue_email("s", "b", None, ["a@example.com"])
    args = [sys.executable, "-m", "django", "outbox_status", "--watch", "0.1"]
    if as_json:
        args.append("--json")
    with tempfile.TemporaryFile() as out:
        # A shell runs background jobs with SIGINT ignored, and a child inherits
        # that; Python then never raises KeyboardInterrupt. Ctrl-C is what is
        # tested, so give the child the default disposition.
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=subprocess_env(),
            stdout=out,
            stderr=out,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:

            def refreshes() -> int:
                out.seek(0)
                data = out.read()
                if as_json:
                    return sum(line.startswith(b"{") for line in data.splitlines())
                return data.count(b"\033[H\033[2J")

            wait_until(lambda: refreshes() >= 3, timeout=30)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        output = out.read().decode()
    assert "Traceback" not in output
    if as_json:
        documents = [json.loads(line) for line in output.splitlines() if line.strip()]
        assert len(documents) >= 3
        assert all(d["database"]["by_status"]["queued"] == 1 for d in documents)
    else:
        assert "Outbox status at" in output and "Due now: 1" in output


def register_stale(queue, worker_id: str, age: float) -> None:
    """Register a worker whose last heartbeat was `age` seconds ago, by Redis time."""
    queue.redis.zadd(queue.workers_key, {worker_id: queue.time() - age})
