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
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.queue import QueueEntry, RedisQueue
from outbox.status import COMPARE_LIMIT, collect
from tests.servers import subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
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
    assert set(report) == {"version", "time", "database", "redis", "agreement"}
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

    assert report["agreement"] == {
        "ready": {"agrees": True, "missing": 0, "stale": 0},
        "scheduled": {"agrees": True, "missing": 0, "stale": 0},
    }


def test_disagreement_is_counted(known_state, queue):
    # Redis lost the normal ready list, and a sent row's id came back as stale.
    queue.redis.delete(queue.ready_key("normal"))
    sent = known_state["done"][0]
    queue.push([QueueEntry(sent.pk, "normal", time.time())])
    queue.redis.zadd(queue.scheduled_key, {f"{known_state['done'][2].pk}:2": time.time() + 60})
    agreement = status_json()["agreement"]
    assert agreement["ready"] == {"agrees": False, "missing": 2, "stale": 1}
    assert agreement["scheduled"] == {"agrees": False, "missing": 0, "stale": 1}


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


def test_empty_outbox():
    report = status_json()
    assert report["database"]["by_status"] == counts()
    assert report["database"]["oldest_due_age"] is None
    assert report["redis"]["workers"] == []


def test_too_many_ids_are_not_compared(known_state, monkeypatch):
    monkeypatch.setattr("outbox.status.COMPARE_LIMIT", 1)
    assert COMPARE_LIMIT > 1
    report = collect()
    not_compared = {"agrees": None, "missing": None, "stale": None}
    assert report["agreement"] == {"ready": not_compared, "scheduled": not_compared}
    assert report["redis"]["ready"]["normal"] == 2


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
