"""Whose clock a row's times come from: settings without time zones, and the web host's clock.

- ``USE_TZ = False``: the worker and the sweeper time rows by Redis (``outbox/queue/clock.py``)
  and must write those times the way Django stores them, naive.
- A row due now is due by the database's clock on PostgreSQL, not by the clock of the
  host that enqueued or requeued it; so are its ``created_at`` and ``updated_at``.
- A web host whose clock is slow and whose push after the commit failed: its rows are
  found by the sweeper's next plain pass, on PostgreSQL (the database's clock) and on
  SQLite (the ids), with real processes under libfaketime.
- An operator's requeue keeps a later send time, unless asked to send now.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from outbox import enqueue_email, enqueue_many, operations, transitions
from outbox.models import Attempt, Delivery, Email
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.cells import BOTH_DATABASES, only_in_cells
from tests.paths import ROOT
from tests.servers import SMTPRecorder, free_port, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def run_worker() -> None:
    Worker(burst=True).run(install_signal_handlers=False)


@override_settings(USE_TZ=False)
def test_without_time_zone_support_mail_is_enqueued_swept_and_sent():
    # The API still takes aware times; the rows hold them naive, as Django does.
    now = datetime.now(UTC)
    rows = [
        *enqueue_email("Hi", "Body", None, ["a@example.com", "b@example.com"]),
        *enqueue_email(
            "Hi",
            "Body",
            None,
            ["c@example.com"],
            send_at=now - timedelta(seconds=5),
            expires_at=now + timedelta(hours=1),
        ),
    ]
    for created in enqueue_many(
        [{"subject": "s", "message": "b", "recipient_list": ["d@example.com"], "send_at": now}]
    ):
        rows += created
    Sweeper().run_pass()
    run_worker()
    assert {Delivery.objects.get(pk=d.pk).status for d in rows} == {Status.SENT}
    assert len(mail.outbox) == 4


# -- a row due now is due by the database's clock (PostgreSQL) -------------------------

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite has no server clock: rows keep this host's time (the worker uses Redis')",
)


def transaction_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def not_before(rows) -> set[datetime]:
    return set(
        Delivery.objects.filter(pk__in=[d.pk for d in rows]).values_list("not_before", flat=True)
    )


@postgresql_only
def test_enqueue_writes_the_databases_now_as_not_before(queue):
    send_at = datetime.now(UTC) + timedelta(hours=1)
    with transaction.atomic():
        # now() is the transaction's start: before any time this host reads inside it.
        db_now = transaction_now()
        one = enqueue_email("s", "b", None, ["a@example.com"])
        two = enqueue_email("s", "b", None, ["b@example.com", "c@example.com"])
        [many, later_many] = enqueue_many(
            [
                {"subject": "s", "message": "b", "recipient_list": ["d@example.com"]},
                {
                    "subject": "s",
                    "message": "b",
                    "recipient_list": ["e@example.com"],
                    "send_at": send_at,
                },
            ]
        )
        later = enqueue_email("s", "b", None, ["f@example.com"], send_at=send_at)
        # The ORM path: an idempotency key, or attachments.
        keyed = enqueue_email("s", "b", None, ["g@example.com"], idempotency_key="order-1")
        attached = enqueue_email(
            "s", "b", None, ["h@example.com"], attachments=[("a.txt", b"x", "text/plain")]
        )
    assert not_before([*one, *two, *many, *keyed, *attached]) == {db_now}
    assert not_before([*later, *later_many]) == {send_at}  # the caller's own time, as given
    # Every row's own times are the database's too: the mirror check's clock.
    rows = [*one, *two, *many, *keyed, *attached, *later, *later_many]
    assert written_times(rows) == {db_now}
    assert {d.created_at for d in rows} == {d.updated_at for d in rows} == {db_now}
    due = {d.pk for d in [*one, *two, *many, *keyed, *attached]}
    assert due <= queue.waiting_ids()


def written_times(rows) -> set[datetime]:
    """The rows' created_at and updated_at, and their emails' created_at."""
    pks = [d.pk for d in rows]
    times = set()
    for created, updated in Delivery.objects.filter(pk__in=pks).values_list(
        "created_at", "updated_at"
    ):
        times |= {created, updated}
    emails = Email.objects.filter(deliveries__pk__in=pks)
    return times | set(emails.values_list("created_at", flat=True))


@postgresql_only
def test_an_operators_requeue_writes_the_databases_now_as_not_before(queue):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    operations.cancel([row.pk], "tester")
    with transaction.atomic():
        db_now = transaction_now()
        assert operations.requeue([row.pk], "tester").changed == [row.pk]
    assert not_before([row]) == {db_now}
    assert Delivery.objects.get(pk=row.pk).updated_at == db_now
    attempt = Attempt.objects.get(delivery_id=row.pk, outcome=Attempt.Outcome.REQUEUED)
    assert attempt.started_at == attempt.finished_at == db_now


@postgresql_only
def test_a_row_the_sweeper_requeues_has_updated_at_on_the_databases_clock(queue):
    # The sweeper passes Redis time for what it decides; a row it makes queued
    # gets updated_at, which its mirror check compares with the database's
    # clock, from the database. Its other transitions keep Redis time.
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    redis_time = timezone.now() - timedelta(minutes=5)  # as if Redis' clock were behind

    def sweeper_moves(change: transitions.Transition) -> datetime:
        with transaction.atomic():
            db_now = transaction_now()
            operations.transition([row.pk], change, actor="sweeper", now=redis_time)
        return db_now

    Delivery.objects.filter(pk=row.pk).update(status=Status.PROCESSING)  # as if claimed
    sweeper_moves(transitions.ABANDON)
    assert Delivery.objects.get(pk=row.pk).updated_at == redis_time
    db_now = sweeper_moves(transitions.REQUEUE_NOT_SENT)
    after = Delivery.objects.get(pk=row.pk)
    assert (after.updated_at, after.not_before) == (db_now, redis_time)
    assert {a.started_at for a in Attempt.objects.filter(delivery_id=row.pk)} == {redis_time}


# -- an operator's requeue keeps a later send time ---------------------------------------


def scheduled_score(queue: RedisQueue, row: Delivery) -> float | None:
    """When ``scheduled`` has the row's id due (members are "id:priority")."""
    for member, score in queue.redis.zrange(queue.scheduled_key, 0, -1, withscores=True):
        if member.decode().partition(":")[0] == str(row.pk):
            return score
    return None


def test_requeue_keeps_a_later_send_time_and_send_now_does_not(queue):
    send_at = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    [row] = enqueue_email("s", "b", None, ["a@example.com"], send_at=send_at)
    [past] = enqueue_email("s", "b", None, ["b@example.com"], send_at=timezone.now())
    operations.cancel([row.pk, past.pk], "admin:ops")

    assert operations.requeue([row.pk, past.pk], "admin:ops").changed == [row.pk, past.pk]
    assert Delivery.objects.get(pk=row.pk).not_before == send_at
    # The forced push replaced the scheduled entry with the row's own time.
    assert scheduled_score(queue, row) == send_at.timestamp()
    # A row whose time has come is due now, as before.
    assert Delivery.objects.get(pk=past.pk).not_before <= timezone.now()
    run_worker()
    assert Delivery.objects.get(pk=row.pk).status == Status.QUEUED  # an hour early: not sent
    assert Delivery.objects.get(pk=past.pk).status == Status.SENT

    operations.cancel([row.pk], "admin:ops")
    assert operations.requeue_now([row.pk], "admin:ops").changed == [row.pk]
    assert Delivery.objects.get(pk=row.pk).not_before <= timezone.now() + timedelta(seconds=5)
    assert scheduled_score(queue, row) is None  # the hour-ahead entry was replaced
    run_worker()
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT


# -- a web host with a slow clock whose push failed ---------------------------------------

SLOW = -120  # seconds: the web host's clock


def slow_web_host(code: str) -> str:
    """Run ``code`` in a Django process whose clock is 120 s slow and whose Redis is away.

    Its OUTBOX Redis is a closed port, so every push after a commit fails (the
    documented warning) while the rows commit. Returns what ``code`` prints
    after "OUT ".
    """
    from tests.chaos.faults.skew import skewed_clock_env

    env = subprocess_env(
        OUTBOX_TEST_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        OUTBOX_TEST_REDIS_TOPOLOGY="",
        **skewed_clock_env(SLOW),
    )
    # The process's clock is printed first, to check that it is slow.
    code = "import time; print('CLOCK', time.time())\n" + code
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos.worker_main", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Redis is unreachable" in done.stderr, done.stderr  # the push did fail
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert float(lines["CLOCK"]) < datetime.now(UTC).timestamp() + SLOW / 2
    return lines["OUT"]


ENQUEUE_EVERY_WAY = """
import asyncio, json
from datetime import timedelta
from django.core.mail import EmailMessage
from django.utils import timezone
from outbox import aenqueue_email, enqueue_email, enqueue_many
from outbox.backends import OutboxBackend
rows = enqueue_email(
    "s", "b", None, ["one@example.com"], expires_at=timezone.now() + timedelta(minutes=10)
)
rows += enqueue_email("s", "b", None, ["keyed@example.com"], idempotency_key="order-1")
rows += enqueue_many([{"subject": "s", "message": "b", "recipient_list": ["bulk@example.com"]}])[0]
rows += asyncio.run(aenqueue_email("s", "b", None, ["async@example.com"]))
OutboxBackend().send_messages([EmailMessage("s", "b", None, ["dropin@example.com"])])
print("OUT", json.dumps([d.pk for d in rows]))
"""

RECIPIENTS = {
    "one@example.com",
    "keyed@example.com",
    "bulk@example.com",
    "async@example.com",
    "dropin@example.com",
}


def process(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
@only_in_cells(*BOTH_DATABASES, why="real worker, sweeper and faketime'd web processes")
def test_a_slow_web_hosts_rows_whose_push_failed_are_sent_within_seconds(queue):
    """A sweeper every second and a worker: the rows go out in seconds, not at the hourly check.

    Before the database's clock wrote these rows (PostgreSQL) and the ids
    marked the window (SQLite), ``updated_at`` was the web host's, 120 s
    behind the marker: the incremental check never saw them.
    """
    # The first pass, a full check, here: the sweeper process's passes are all plain.
    Sweeper().run_pass()
    full_at = queue.mirror_state()["full_at"]
    smtp = SMTPRecorder().start()
    procs = [
        process("outbox_sweep", "--loop", "1"),
        process("outbox_worker", OUTBOX_TEST_SMTP_PORT=str(smtp.port)),
    ]
    try:
        ids = json.loads(slow_web_host(ENQUEUE_EVERY_WAY))
        rows = Delivery.objects.filter(recipient__in=RECIPIENTS)
        assert rows.count() == len(RECIPIENTS)
        assert set(ids) <= set(rows.values_list("pk", flat=True))

        wait_until(lambda: rows.filter(status=Status.SENT).count() == len(RECIPIENTS), 15)
        assert set(rows.values_list("status", flat=True)) == {Status.SENT}  # none expired
        assert queue.mirror_state()["full_at"] == full_at  # found by plain passes only
        counts = smtp.by_message_id()
        assert all(counts[d.message_id] == 1 for d in rows)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        smtp.stop()


REQUEUE = """
from outbox import operations
print("OUT", operations.requeue([{pk}], "admin:slow-host").changed)
"""


@pytest.mark.slow
def test_an_operators_requeue_from_a_slow_host_whose_push_failed_is_found_by_a_plain_pass(queue):
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    operations.cancel([row.pk], "admin:ops")
    run_worker()  # drops the cancelled row's id from Redis
    Sweeper().run_pass()  # the first pass: a full check, and the marker
    assert row.pk not in queue.waiting_ids()

    assert slow_web_host(REQUEUE.format(pk=row.pk)).strip() == f"[{row.pk}]"
    assert Delivery.objects.get(pk=row.pk).status == Status.QUEUED
    assert row.pk not in queue.waiting_ids()  # the push failed

    report = Sweeper().run_pass()
    assert not report.full_mirror_check
    assert report.remirrored == 1
    assert row.pk in queue.waiting_ids()


# -- USE_TZ = False: the night the clocks go back ----------------------------------------

GOING_BACK = """
import json
from datetime import UTC, datetime
from outbox import enqueue_email, operations
send_at = datetime.fromtimestamp({send_at}, UTC)
[kept] = enqueue_email("s", "b", None, ["scheduled@example.com"], send_at=send_at)
[again] = enqueue_email("s", "b", None, ["requeued@example.com"], send_at=send_at)
operations.cancel([again.pk], "admin:ops")
print("OUT", json.dumps([kept.pk, again.pk]))
"""

REQUEUE_AGAIN = """
from outbox import operations
print("OUT", operations.requeue([{pk}], "admin:ops").changed)
"""


def in_zone(code: str, env: dict[str, str]) -> str:
    """Run ``code`` in a Django process of ``env``'s zone (USE_TZ = False); what it prints after "OUT "."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", code],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    return lines["OUT"]


@pytest.mark.slow
@only_in_cells(*BOTH_DATABASES, why="real worker and sweeper across a compiled DST change")
def test_a_send_at_in_the_hour_the_clocks_go_back_leaves_at_its_instant(queue, tmp_path):
    """``USE_TZ = False``: a send_at whose wall-clock time happens twice, re-read every way.

    The zone's clocks go back 35 s from now; the send_at is 5 s after
    that, in the repeated hour, so its wall-clock time was also shown an hour
    ago. Then Redis loses everything and one sweep rebuilds the mirror from
    the rows, an operator requeues a cancelled copy (in the first of the two
    hours: by the wall clock "now" is later than the send_at), and a worker
    runs through the change. Before ``not_before`` was stored in UTC, each
    re-read took the earlier time: both left at once, and the requeue also
    replaced the schedule with "now".
    """
    from tests.zones import HOUR, clocks_go_back, zone_in

    # Far enough ahead for three short subprocesses and a sweep on a busy machine
    # (the assertion below says if it was not).
    change = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=35)
    send_at = change + timedelta(seconds=5)
    env = clocks_go_back(tmp_path, change)
    zone = zone_in(env)
    wall = send_at.astimezone(zone).replace(tzinfo=None)
    # The same wall-clock time an hour earlier, before the change: the trap.
    # (Instants compared as timestamps: PEP 495 makes a time in a fold unequal
    # to every time of another zone.)
    assert wall.replace(tzinfo=zone, fold=0).timestamp() == (send_at - HOUR).timestamp()
    assert wall.replace(tzinfo=zone, fold=1).timestamp() == send_at.timestamp()

    kept, again = json.loads(in_zone(GOING_BACK.format(send_at=send_at.timestamp()), env))
    queue.redis.flushdb()  # Redis restarts empty: the next sweep rebuilds from the rows
    sweep = subprocess.run(
        [sys.executable, "-m", "django", "outbox_sweep"],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert kept in queue.waiting_ids()
    assert json.loads(in_zone(REQUEUE_AGAIN.format(pk=again), env)) == [again]
    assert datetime.now(UTC) < change  # all of the above in the first of the two hours

    # Redis has each id scheduled for the send_at: not an hour early (the mirror
    # rebuild), not due now (the requeue's push).
    assert scheduled_score(queue, Delivery(pk=kept)) == send_at.timestamp()
    assert scheduled_score(queue, Delivery(pk=again)) == send_at.timestamp()

    smtp = SMTPRecorder().start()
    worker = process("outbox_worker", OUTBOX_TEST_SMTP_PORT=str(smtp.port), **env)
    try:
        # Nothing leaves before its time, though the worker runs through the change...
        while datetime.now(UTC) < send_at - timedelta(seconds=0.5):
            assert smtp.count() == 0, f"sent {send_at - datetime.now(UTC)} early"
            time.sleep(0.2)
        # ...and both leave once it has come, once each.
        rows = Delivery.objects.filter(pk__in=[kept, again])
        wait_until(lambda: rows.filter(status=Status.SENT).count() == 2, 30)
        assert sorted(smtp.by_message_id().values()) == [1, 1]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        smtp.stop()
    # Read back with USE_TZ = True (this process): one instant each, the send_at.
    assert set(rows.values_list("not_before", flat=True)) == {send_at}
