"""A project that routes the outbox to a database of its own: every process follows its routers.

tests/routers.py writes the outbox's tables to the second PostgreSQL database,
"routed", and sends reads of them to "default", as a router may send reads to
a replica. "default" has the outbox's tables (the suite migrates both) but
must never hold one of its rows, and nothing the outbox decides may be read
from it: enqueue, a real worker process, a real sweeper process, an admin
action, ``outbox_status``, the metrics and the database checks all work on
"routed" (``outbox.models.outbox_alias``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.checks import Tags, run_checks
from django.core.management import call_command
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Email, outbox_alias
from outbox.queue import RedisQueue
from tests.cells import only_in_cells
from tests.paths import ROOT
from tests.routers import OUTBOX_DATABASE, REPLICA
from tests.servers import SMTPRecorder, subprocess_env, wait_until

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("OUTBOX_TEST_DB") != "postgres",
        reason="the second database is PostgreSQL's (tests/settings.py)",
    ),
    pytest.mark.django_db(transaction=True, databases=[REPLICA, OUTBOX_DATABASE]),
    pytest.mark.slow,
    only_in_cells("6.1:postgres", why="routing is the same in every cell; one PostgreSQL cell"),
]

Status = Delivery.Status
CHANGELIST = "admin:outbox_delivery_changelist"


@pytest.fixture
def routed(settings) -> dict[str, str]:
    """The router on, in this process; returns the environment that turns it on in a subprocess."""
    settings.DATABASE_ROUTERS = ["tests.routers.OutboxRouter"]
    assert outbox_alias() == OUTBOX_DATABASE
    return {
        "OUTBOX_TEST_ROUTED": "1",
        "OUTBOX_TEST_ROUTED_DB_NAME": str(connections[OUTBOX_DATABASE].settings_dict["NAME"]),
    }


def rows(alias: str) -> dict[str, int]:
    """How many rows each outbox table has on ``alias``."""
    return {
        model.__name__: model.objects.using(alias).count() for model in (Email, Delivery, Attempt)
    }


def run_command(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", name, *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def statuses() -> dict[int, str]:
    return dict(Delivery.objects.using(OUTBOX_DATABASE).values_list("pk", "status"))


def test_every_process_uses_the_outbox_database(routed, worker_process, admin_client, queue):
    smtp = SMTPRecorder().start()
    try:
        sent = [enqueue_email("s", "b", None, [f"r{i}@example.com"])[0].pk for i in range(3)]
        assert rows(REPLICA) == {"Email": 0, "Delivery": 0, "Attempt": 0}
        assert rows(OUTBOX_DATABASE)["Delivery"] == 3

        # A real worker: it claims, sends and records on "routed".
        proc = worker_process("--burst", OUTBOX_TEST_SMTP_PORT=str(smtp.port), **routed)
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        wait_until(lambda: smtp.count() == 3, timeout=10)
        assert statuses() == dict.fromkeys(sent, Status.SENT)
    finally:
        smtp.stop()

    # A real sweeper pass, after Redis lost everything: it re-mirrors the queued
    # row and cancels the expired one, both read and written on "routed".
    kept, expired = (enqueue_email("s", "b", None, [f"{n}@example.com"])[0].pk for n in "kx")
    Delivery.objects.filter(pk=expired).update(expires_at=timezone.now() - timedelta(minutes=1))
    queue.redis.flushdb()
    swept = run_command("outbox_sweep", "--json", "--full-mirror-check", env=routed)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    report = json.loads(swept.stdout.strip().splitlines()[-1])
    assert (report["expired"], report["remirrored"]) == (1, 1), report
    assert statuses()[expired] == Status.CANCELLED
    assert [int(pk) for pk in queue.redis.lrange(queue.ready_key("normal"), 0, -1)] == [kept]

    # An admin action: the changelist lists the rows, and the action changes "routed".
    page = admin_client.get(reverse(CHANGELIST))
    assert page.status_code == 200 and f'value="{kept}"' in page.content.decode()
    done = admin_client.post(
        reverse(CHANGELIST), {"action": "cancel", "_selected_action": [str(kept)], "index": "0"}
    )
    assert done.status_code == 302
    assert statuses()[kept] == Status.CANCELLED

    # outbox_status and the metrics count the rows of "routed".
    call_command("outbox_status", "--json", stdout=(out := StringIO()))
    by_status = json.loads(out.getvalue())["database"]["by_status"]
    assert (by_status["sent"], by_status["cancelled"]) == (3, 2), by_status
    scraped = admin_client.get(
        "/outbox/metrics", headers={"Authorization": "Bearer tests-only-metrics-token"}
    ).content.decode()
    assert 'outbox_deliveries{status="sent"} 3' in scraped

    # The database checks ask the outbox's database, and the worker runs them there.
    errors = run_checks(
        tags=[Tags.database], databases=[OUTBOX_DATABASE], include_deployment_checks=True
    )
    assert [e.id for e in errors if e.id and e.id.startswith("outbox.")] == []
    checked = run_command("check", "--database", OUTBOX_DATABASE, "--deploy", env=routed)
    assert "outbox." not in checked.stdout + checked.stderr

    assert rows(REPLICA) == {"Email": 0, "Delivery": 0, "Attempt": 0}
    assert RedisQueue().live_workers() == {}
