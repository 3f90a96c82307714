"""Every connection through a transaction-pooling PgBouncer, with a pool smaller than a worker's threads.

A private PgBouncer (tests/pgbouncer.py) stands in front of this cell's
PostgreSQL: ``pool_mode = transaction``, ``default_pool_size = 2``. For this
module the test process's own connection goes through it too (its HOST and
PORT are switched, with ``DISABLE_SERVER_SIDE_CURSORS``, and without
prepared statements unless the PgBouncer is 1.21 or later), and so do the
worker and sweeper subprocesses (OUTBOX_TEST_PG_PORT, OUTBOX_TEST_PG_BOUNCER):
enqueue and ``enqueue_many``, workers of 4 threads, ``outbox_sweep --loop``,
the admin's delivery list, and the chaos run's database faults (a smaller run).

The key test SIGKILLs PgBouncer twice while a worker has deliveries in
flight (every client and server connection drops at once; a transaction in
progress is rolled back by PostgreSQL) and starts it again on the same
port: every row must end ``sent`` and every message must reach the SMTP
server exactly once.

PostgreSQL only, and one cell: what PgBouncer changes is the connection, not
Django's version. Skipped where PgBouncer cannot run (tests/run.sh installs
it with apt-get).
"""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, InterfaceError, connection, connections, transaction
from django.urls import reverse

from outbox import enqueue_email, enqueue_many
from outbox.models import Delivery
from tests.cells import only_in_cells
from tests.chaos.config import SMALL
from tests.paths import ROOT
from tests.pgbouncer import PgBouncer, unavailable
from tests.processes import Run
from tests.servers import RefusingOnce, SMTPRecorder, subprocess_env, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL connections"
    ),
    only_in_cells("5.2:postgres", why="PgBouncer changes the connection, not Django's version"),
]

Status = Delivery.Status
LIVE = (Status.QUEUED, Status.PROCESSING)
POOL = 2  # server connections per database: fewer than the worker's threads
THREADS = 4
# Sessions on the test database when the module began (not the PgBouncer's).
FOREIGN: set[int] = set()


# -- PgBouncer, and this process's connection through it ------------------------------------


@pytest.fixture(scope="module")
def bouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """The module's PgBouncer; this process's connection goes through it while the module runs."""
    why = unavailable()
    if why:
        pytest.skip(why)
    settings = connection.settings_dict
    server = PgBouncer(
        str(settings["HOST"] or "127.0.0.1"),
        int(settings["PORT"] or 5432),
        str(settings["USER"]),
        pool_size=POOL,
    ).start()
    saved = {key: settings.get(key) for key in ("HOST", "PORT", "OPTIONS")}
    saved_cursors = settings.get("DISABLE_SERVER_SIDE_CURSORS", False)
    # Connections of ended threads of earlier tests go with their garbage; what
    # is still on the test database now is not the PgBouncer's.
    gc.collect()
    connections.close_all()
    FOREIGN.clear()
    FOREIGN.update(session_pids(server))
    settings.update(pooled_settings(server, settings))
    try:
        yield server
    finally:
        connections.close_all()
        settings.update(saved)
        settings["DISABLE_SERVER_SIDE_CURSORS"] = saved_cursors
        # Its server connections end with it: none is left on the test database.
        server.close()


def pooled_settings(server: PgBouncer, settings: dict[str, Any]) -> dict[str, Any]:
    """What a site's DATABASES entry says behind a transaction-pooling PgBouncer."""
    options = dict(settings.get("OPTIONS") or {})
    if not server.prepared_statements:
        options.pop("prepare_threshold", None)  # Django's default: psycopg prepares nothing
    return {
        "HOST": "127.0.0.1",
        "PORT": str(server.port),
        "OPTIONS": options,
        "DISABLE_SERVER_SIDE_CURSORS": True,
    }


def pooled_env(server: PgBouncer) -> dict[str, str]:
    """The environment that sends a subprocess's connections through the PgBouncer."""
    env = {
        "OUTBOX_TEST_PG_HOST": "127.0.0.1",
        "OUTBOX_TEST_PG_PORT": str(server.port),
        "OUTBOX_TEST_PG_BOUNCER": "1",
    }
    if not server.prepared_statements:
        env["OUTBOX_TEST_PG_PREPARE_THRESHOLD"] = ""
    return env


def database() -> str:
    """The test database's name."""
    return str(connection.settings_dict["NAME"])


def poll(query: Callable[[], Any]) -> Any:
    """``query()``, or None while the PgBouncer is down.

    A connection broken by an earlier kill is dropped and the query tried once
    more, on a new one.
    """
    for _ in range(2):
        try:
            return query()
        except (DatabaseError, InterfaceError):
            connection.close()
    return None


def live_rows() -> int | None:
    return poll(lambda: Delivery.objects.filter(status__in=LIVE).count())


def backends_on(server: PgBouncer) -> int:
    """PostgreSQL's sessions on the test database that came while the module ran.

    A server connection that PgBouncer has just closed (its client went away
    mid-transaction, as a killed worker of the test before does) stays listed
    for the few milliseconds its backend takes to exit, while PgBouncer may
    already have opened the one that replaces it. So a count above the pool
    is read again: a session held beyond the pool is still there a moment
    later, an exiting one is not.
    """
    count = len(session_pids(server) - FOREIGN)
    deadline = time.monotonic() + 0.5
    while count > POOL and time.monotonic() < deadline:
        time.sleep(0.02)
        count = min(count, len(session_pids(server) - FOREIGN))
    return count


def session_pids(server: PgBouncer) -> set[int]:
    """PostgreSQL's sessions on the test database, read on a direct connection of its own."""
    import psycopg

    with psycopg.connect(
        host=server.pg_host,
        port=server.pg_port,
        user=server.user,
        dbname=database(),
        autocommit=True,
        connect_timeout=5,
    ) as direct:
        rows = direct.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return {int(pid) for (pid,) in rows}


# -- workers and the sweeper ----------------------------------------------------------------


@pytest.fixture
def worker(worker_process, bouncer) -> Iterator[Callable[..., Run]]:
    """``outbox_worker --concurrency 4`` through the PgBouncer; killed at the end."""
    runs: list[Run] = []

    def start(smtp: SMTPRecorder, *args: str, **env: str) -> Run:
        run = Run(
            worker_process(
                "--concurrency",
                str(THREADS),
                "--skip-checks",
                *args,
                OUTBOX_TEST_SMTP_PORT=str(smtp.port),
                **pooled_env(bouncer),
                **env,
            )
        )
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.wait(timeout=10)
        run.reader.join(timeout=10)


@pytest.fixture
def sweeper(bouncer) -> Iterator[Callable[[], Run]]:
    """``outbox_sweep --loop 1`` through the PgBouncer; killed at the end."""
    runs: list[Run] = []

    def start() -> Run:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_sweep", "--loop", "1"],
            cwd=ROOT,
            env=subprocess_env(**pooled_env(bouncer)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        run = Run(proc)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.wait(timeout=10)
        run.reader.join(timeout=10)


@pytest.fixture
def recorder() -> Iterator[Callable[[SMTPRecorder], SMTPRecorder]]:
    """Start an SMTP recorder of the test's choosing; stopped at the end."""
    started: list[SMTPRecorder] = []

    def start(server: SMTPRecorder) -> SMTPRecorder:
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


def bulk(count: int, tag: str) -> list[Delivery]:
    """``count`` single-recipient emails in one ``enqueue_many`` call."""
    items = [
        {
            "subject": f"{tag} {i}",
            "message": "Your order has shipped.",
            "from_email": "shop@example.com",
            "recipient_list": [f"{tag}-{i}@example.com"],
        }
        for i in range(count)
    ]
    return [row for rows in enqueue_many(items) for row in rows]


def stop_and_check(run: Run, what: str) -> None:
    """It lived through the test; SIGTERM ends it with status 0."""
    assert run.proc.poll() is None, f"the {what} exited on its own:\n{run.output()}"
    assert run.finish() == 0, run.output()


# -- the tests ------------------------------------------------------------------------------


def test_enqueue_and_enqueue_many_through_pgbouncer(bouncer, queue):
    """Rows are written through the pool, pushed after commit; a rollback writes and pushes nothing."""
    before = transactions(bouncer)
    [one] = enqueue_email("Receipt", "Thanks.", "shop@example.com", ["a@example.com"])
    three = enqueue_email("Note", "Hi.", None, ["b@example.com", "c@example.com", "d@example.com"])
    keyed = enqueue_email("Keyed", "Once.", None, ["e@example.com"], idempotency_key="order-1")
    again = enqueue_email("Keyed", "Once.", None, ["e@example.com"], idempotency_key="order-1")
    assert [r.pk for r in again] == [r.pk for r in keyed]
    with transaction.atomic():
        many = bulk(30, "many")
    with pytest.raises(RuntimeError), transaction.atomic():
        bulk(5, "rolled-back")
        enqueue_email("Gone", "Never.", None, ["gone@example.com"])
        raise RuntimeError("roll back")

    rows = [one, *three, *keyed, *many]
    assert Delivery.objects.count() == len(rows) == 35
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.QUEUED}
    assert sorted(int(i) for i in queue.waiting_ids()) == sorted(r.pk for r in rows)
    # It did go through PgBouncer: it counted the transactions, and held no more servers.
    assert transactions(bouncer) > before
    assert bouncer.servers(database()) <= POOL


def transactions(server: PgBouncer) -> int:
    """How many transactions PgBouncer has pooled on the test database."""
    return sum(
        int(r["total_xact_count"]) for r in server.show("STATS") if r["database"] == database()
    )


def test_admin_changelist_through_pgbouncer(admin_client, bouncer):
    rows = enqueue_email("Your receipt", "Thanks.", None, ["a@example.com", "b@example.com"])
    changelist = reverse("admin:outbox_delivery_changelist")
    response = admin_client.get(changelist)
    assert response.status_code == 200
    assert b"a@example.com" in response.content and b"b@example.com" in response.content
    response = admin_client.get(changelist, {"status__exact": "queued", "q": "b@example.com"})
    assert response.status_code == 200 and b"b@example.com" in response.content
    detail = reverse("admin:outbox_delivery_change", args=[rows[0].pk])
    response = admin_client.get(detail)
    assert response.status_code == 200 and b"Your receipt" in response.content


def test_two_workers_of_four_threads_and_the_sweeper_share_a_pool_of_two(
    worker, sweeper, bouncer, recorder
):
    """Every email is delivered once while PostgreSQL never sees more than the pool's sessions.

    A worker's threads write their steps together on one session of their own,
    and each thread writes any other outcome on its own: a tenth of the
    recipients are refused once with a 451, so that those are written too.
    """
    rows = bulk(120, "pool")
    smtp = recorder(RefusingOnce(refuse=refused_once(rows, 10), delay=0.01))
    watcher = sweeper()
    runs = [worker(smtp), worker(smtp)]
    clients: list[int] = []
    sessions: list[int] = []

    def drained() -> bool:
        clients.append(bouncer.clients(database()))
        sessions.append(backends_on(bouncer))
        return live_rows() == 0

    wait_until(drained, 60, interval=0.05)
    for run in runs:
        stop_and_check(run, "worker")
    stop_and_check(watcher, "sweeper")
    assert statuses() == {Status.SENT: len(rows)}
    assert smtp.by_message_id() == {r.message_id: 1 for r in rows}
    assert len(smtp.refused) == len(rows) // 10
    # More clients than the pool's server connections at once (the workers' sessions,
    # the sweeper's, this process's), and PostgreSQL saw no session but the pool's.
    assert max(clients) > POOL, clients
    assert max(sessions) <= POOL, sessions


def refused_once(rows: list[Delivery], every: int) -> dict[str, str]:
    """Every ``every``-th recipient is answered 451 once (see RefusingOnce)."""
    return {r.recipient: "451 4.7.1 try again later" for r in rows[::every]}


def test_pgbouncer_sigkilled_mid_delivery_loses_nothing_and_sends_nothing_twice(
    worker, sweeper, bouncer, smtp_server, queue
):
    """Two SIGKILLs of PgBouncer with deliveries in flight; it comes back on the same port.

    The first is restarted at once: the worker's connections break mid-statement
    and mid-send. The second stays down until the worker has noticed (its log
    says the database is unavailable, or a write of an outcome failed). Nothing
    is lost, nothing is sent twice, and the worker and the sweeper live through it.
    """
    smtp_server.delay = 0.02
    total = 240
    rows = bulk(total, "kill")
    watcher = sweeper()
    run = worker(smtp_server)
    pids = []
    for share, wait_for_the_worker in ((0.2, False), (0.55, True)):
        wait_until(lambda share=share: smtp_server.count() >= share * total, 60)
        assert live_rows(), "drained before PgBouncer was killed: slow the SMTP server down"
        pids.append(bouncer.pid)
        seen = len(run.output())
        bouncer.kill()
        if wait_for_the_worker:
            wait_until(lambda seen=seen: noticed(run.output()[seen:]), 30)
        bouncer.start()
    assert bouncer.starts == 3 and len(set(pids)) == 2

    try:
        wait_until(lambda: live_rows() == 0, 90, interval=0.2)
    except AssertionError:
        pytest.fail(f"not drained after the restarts: {statuses()}\n{run.output()[-4000:]}")
    stop_and_check(run, "worker")
    stop_and_check(watcher, "sweeper")
    assert statuses() == {Status.SENT: total}, run.output()[-4000:]
    received = smtp_server.by_message_id()
    twice = {mid: n for mid, n in received.items() if n != 1}
    assert received == {r.message_id: 1 for r in rows}, (len(received), twice)
    assert not queue.waiting_ids()


def statuses() -> dict[str, int]:
    """How many rows are in each status."""
    found: dict[str, int] = {}
    for status in Delivery.objects.values_list("status", flat=True):
        found[status] = found.get(status, 0) + 1
    return found


def noticed(output: str) -> bool:
    """Whether a worker's log shows that its database went away."""
    return "is unavailable" in output or "database error" in output


# The chaos run's faults that meet the database connection, one of each, smaller: the
# SMTP and Redis faults (stall, cut, skew, Redis wipe and outage, lost claim and push
# replies, long send) are the same with or without a pooler, and tests/faults/test_chaos.py runs them.
CHAOS = {
    **{name: 0 for name in SMALL},
    "deliveries": 150,
    "workers": 3,
    "concurrency": [1, 2, 4],
    "random_kills": 1,
    "stops": 1,
    "window_kills": 1,
    "restarts": 1,
    "pg_outages": 1,
    "lost_steps": 1,
    "lock_stops": 1,
    "proxied_workers": 2,
    "time_limit": 90.0,
    "seed": 5,
}
# Room for the lock-stop fault: the harness's lock, each worker's step waiting on it, one more.
CHAOS_POOL = 6


def test_the_small_chaos_run_through_pgbouncer(bouncer, tmp_path, monkeypatch):
    """The chaos run's database faults, every connection through a PgBouncer of its own.

    Review policy. The pool (6) is smaller than the workers' threads (1 + 2 + 4)
    and their replacements, and leaves room for what the row-lock fault holds:
    the harness's lock and a step of every worker waiting on it (a session
    waiting on a lock keeps its server connection), and the harness's look at
    pg_stat_activity. No "refused mark sent" step: it terminates PostgreSQL's
    sessions, which PgBouncer replaces without its clients seeing it (the kill
    test above kills PgBouncer itself instead).
    """
    if shutil.which("faketime") is None:
        pytest.skip("faketime is not installed (tests/run.sh installs it)")
    from tests.chaos.run import Config, run_chaos

    server = PgBouncer(bouncer.pg_host, bouncer.pg_port, bouncer.user, pool_size=CHAOS_POOL)
    server.start()
    try:
        for name, value in pooled_env(server).items():
            monkeypatch.setenv(name, value)
        result = run_chaos(
            Config(policy="review", db="postgres", results_dir=str(tmp_path), **CHAOS)
        )
    finally:
        server.close()
    counts, table = result["counts"], result["table"]
    assert result["violations"] == [], table
    assert result["ok"], table
    assert counts["random SIGKILL"] == counts["SIGSTOP"] == counts["SIGKILL after_send"] == 1, table
    assert counts["restart under reused id"] == 1, table
    assert counts["postgres outage"] == counts["lost step reply"] == 1, table
    assert counts["SIGSTOP blocked on a row lock"] == 1, table
    assert counts["enqueued"] == counts["rows"] >= CHAOS["deliveries"], table
    assert counts["rolled back"] > 0 and counts["rolled-back arrived"] == 0, table
    assert counts["lost"] == counts["not terminal"] == counts["sent without receipt"] == 0, table
    assert counts.get("delivered twice or more", 0) == 0, table
