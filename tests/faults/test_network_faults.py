"""The promise with real worker processes, through a proxy that loses what a network loses.

Each test puts tests/proxy.py's FaultProxy between a real ``outbox_worker``
subprocess and one of its servers (the worker's environment points at the
proxy's port), injects one fault, and checks the promise of
outbox/PROTOCOL.md: nothing lost, nothing sent twice under "review", no
abandoned row sent, no row stuck.

- Redis: a claim's reply is lost while the thread holds a retry, and Redis
  goes away at that moment (the retry's push fails): the replayed claim must
  apply the ack, and the sweeper's plain passes must find the row.
- PostgreSQL: the claim step commits but its reply (or the read-back's) is
  lost; then a pause, or SIGTERM: the row must be set back before its id is
  given back.
- Redis: heartbeats (and registrations) are lost on their way while claims
  and the database work: no send once the lease has run out, no abandoned
  row sent.
- SMTP: the reply to the final dot is lost: "review" flags the row, "requeue"
  sends it again.

The in-process halves of these rules are in tests/faults/test_promise_machinery.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection

from outbox import enqueue_email
from outbox.conf import outbox_settings
from outbox.models import Delivery
from outbox.queue import RedisQueue, control
from outbox.queue.scripts import shared_script
from outbox.sweeper import Sweeper
from outbox.worker import Worker
from tests.cells import slow_processes
from tests.processes import Run, process_state
from tests.proxy import Fault, FaultProxy
from tests.servers import RefusingOnce, SMTPRecorder, wait_until

pytestmark = slow_processes(
    ("5.2:postgres",),
    why="the faults are on the wire, not in Django or the SQL dialect",
)

Status = Delivery.Status

HEARTBEAT_TIMEOUT = outbox_settings.HEARTBEAT_TIMEOUT  # 3 s in tests/settings.py
# A send needs a heartbeat sent less than this long ago (the worker's LEASE_SHARE).
LEASE = 0.8 * HEARTBEAT_TIMEOUT

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the fault is on the network between the worker and a database server; SQLite is a file",
)
not_on_a_topology = pytest.mark.skipif(
    bool(os.environ.get("OUTBOX_TEST_REDIS_TOPOLOGY")),
    reason="the proxy stands in for one redis-server, not a Sentinel or Cluster",
)


# -- servers and workers -------------------------------------------------------------


@dataclass
class Timed(SMTPRecorder):
    """Records when each DATA began (time.monotonic()), before any ``delay``."""

    data_at: list[float] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.data_at.append(time.monotonic())
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def smtp_of() -> Iterator[Callable[[SMTPRecorder], SMTPRecorder]]:
    """Start an SMTP recorder of the test's choosing; stopped at the end."""
    started: list[SMTPRecorder] = []

    def start(server: SMTPRecorder) -> SMTPRecorder:
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def worker(worker_process) -> Iterator[Callable[..., Run]]:
    """Start ``outbox_worker --concurrency 1`` with extra environment; killed at the end."""
    runs: list[Run] = []

    def start(*args: str, **env: str) -> Run:
        run = Run(worker_process("--concurrency", "1", "--skip-checks", *args, **env))
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()  # a stopped process too
        run.proc.wait(timeout=10)
        run.reader.join(timeout=10)


def redis_proxy_env(queue: RedisQueue) -> tuple[int, Callable[[FaultProxy], dict[str, str]]]:
    """The redis-server's port, and the worker environment that goes through a proxy to it."""
    kwargs = queue.redis.connection_pool.connection_kwargs
    db = int(kwargs.get("db", 0))
    return int(kwargs["port"]), lambda proxy: {
        "OUTBOX_TEST_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/{db}"
    }


def database_address() -> tuple[str, int]:
    return str(connection.settings_dict["HOST"] or "127.0.0.1"), int(
        connection.settings_dict["PORT"] or 5432
    )


def evalsha(*names: str) -> re.Pattern[bytes]:
    """An EVALSHA of one of the named scripts of outbox/queue/lua/, as redis-py writes it."""
    shas = b"|".join(shared_script(name).sha.encode() for name in names)
    return re.compile(rb"EVALSHA\r\n\$40\r\n(?:" + shas + rb")")


def load_scripts(queue: RedisQueue, *names: str) -> None:
    """Loaded beforehand: a NOSCRIPT answer and the retry would count as two matches."""
    for name in names:
        queue.redis.script_load(shared_script(name).script)


def the_live_worker(queue: RedisQueue) -> str:
    found = wait_until(lambda: list(queue.live_workers()), 30)
    assert len(found) == 1, found
    return str(found[0])


def copies(message_id: str, smtp: SMTPRecorder, outbox_mail: list | None = None) -> int:
    """How many times the message was handed over: over SMTP, and to in-process workers."""
    count = smtp.by_message_id().get(message_id, 0)
    for message in outbox_mail or []:
        count += message.extra_headers.get("Message-ID") == message_id
    return count


def describe(queue: RedisQueue, *pks: int) -> str:
    """The rows, the live workers' processing lists and what waits in Redis: for a failure."""
    lines = []
    for row in Delivery.objects.filter(pk__in=pks).order_by("pk"):
        outcomes = list(row.attempt_log.order_by("pk").values_list("outcome", "actor"))
        lines.append(
            f"delivery {row.pk}: {row.status}, worker {row.worker_id!r}, "
            f"attempts {row.attempts}, not_before {row.not_before}, outcomes {outcomes}"
        )
    for name in queue.live_workers():
        lines.append(f"live worker {name}: processing list {queue.processing_ids(name)}")
    lines.append(f"waiting in Redis: {sorted(queue.waiting_ids())}")
    return "\n".join(lines)


# -- Redis: an ack added while a claim's reply was lost -----------------------------------


@not_on_a_topology
def test_a_retry_written_while_a_claim_reply_was_lost_is_sent_once(worker, queue, smtp_of):
    """The retry's ack rides on the replayed claim; its failed push is repaired by plain passes.

    The first attempt gets a 451: the thread holds a retry. Its next claim
    reaches Redis but the reply is lost, and Redis goes away at that moment:
    the thread writes the retry alone, its push fails, and its ack waits for
    the claim's replay. Before, the replay applied no ack and the thread then
    forgot it: the id stayed in the live worker's list, where every pass of
    the sweeper trusted it, and the row stayed ``queued`` for the worker's
    lifetime.
    """
    smtp = smtp_of(RefusingOnce(refuse={"a@example.com": "451 try later"}))
    load_scripts(queue, "claim")
    Sweeper().run_pass()  # the first pass checks everything; the ones below are plain
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    redis_port, through = redis_proxy_env(queue)
    with FaultProxy(redis_port) as proxy:
        # Claim 1 takes the row; claim 2 is the one made with the retry in hand.
        lost = proxy.swallow_reply(evalsha("claim"), nth=2, refuse_after=1.0)
        run = worker(OUTBOX_TEST_SMTP_PORT=str(smtp.port), **through(proxy))
        wait_until(lambda: lost.fired == 1, 30)
        assert smtp.refused == ["a@example.com"]
        passes = []

        def swept_until_sent() -> bool:
            passes.append(Sweeper().run_pass())
            return Delivery.objects.get(pk=row.pk).status == Status.SENT

        try:
            wait_until(swept_until_sent, 15, interval=0.5)
        except AssertionError:
            state = describe(queue, row.pk)
            run.finish()
            pytest.fail(f"not sent within 15 s of plain sweeps:\n{state}\n{run.output()}")
        assert run.finish() == 0, run.output()
    assert smtp.by_message_id() == {row.message_id: 1}
    assert not any(p.full_mirror_check for p in passes), passes
    # The test meant what it says: one incarnation all along, never reaped.
    assert "declared dead" not in run.output(), run.output()
    assert proxy.refused > 0  # the retry's push did fail


# -- PostgreSQL: a claim that committed without the thread learning it --------------------


def lose_the_claims_reply(proxy: FaultProxy, row: Delivery, lost: str) -> tuple[Fault, int]:
    """Cut the connection on replies that carry ``row``'s Message-ID; and how many to wait for.

    Only what claims the row, or reads it back, returns its Message-ID. It is
    matched in the server's reply because with prepared statements (the
    6.1:postgres cell) the step's text is sent once per connection, not with
    each execution.

    ``"step"``: the step's reply is lost (on the worker's step connection),
    and the database then refuses new connections for 2 s: the thread's
    retries fail before they reach it, and so may its first give-back.
    ``"read-back"``: every such reply is lost: the step's, then each read-back
    of the row by its token on the thread's own connection (the retried step
    finds the row no longer queued and answers without it).
    """
    pattern = row.message_id.encode()
    if lost == "step":
        return proxy.cut_on(pattern, direction="down", times=1, refuse_after=2.0), 1
    return proxy.cut_on(pattern, direction="down", times=None), 2


@postgresql_only
@pytest.mark.parametrize("lost", ["step", "read-back"])
def test_a_pause_sets_back_a_claim_that_committed_unseen(
    lost, worker, queue, smtp_server, outbox_mail
):
    """The id is given back at the pause only once the row is ``queued`` again.

    Before, the id went back at once while the row stayed ``processing``
    under the paused worker's token: another worker's claim skipped it, and
    the row stayed ``processing`` under a live worker for ever. (The worker
    is held still with SIGSTOP after the give-back, so that another worker
    takes the id: a thread that still has the claim's token would find the
    row its own again, and hide the fault.)
    """
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    host, port = database_address()
    with FaultProxy(port, host) as proxy:
        fault, fired = lose_the_claims_reply(proxy, row, lost)
        run = worker(
            OUTBOX_TEST_PG_HOST="127.0.0.1",
            OUTBOX_TEST_PG_PORT=str(proxy.port),
            OUTBOX_TEST_SMTP_PORT=str(smtp_server.port),
        )
        wait_until(lambda: fault.fired >= fired, 30)
        incarnation = the_live_worker(queue)
        # The step committed: the row is the worker's, though it does not know it.
        assert Delivery.objects.get(pk=row.pk).status == Status.PROCESSING
        control.pause(None, queue)
        wait_until(lambda: queue.processing_ids(incarnation) == [], 15)  # given back
        fault.remove()
        run.send(signal.SIGSTOP)
        wait_until(lambda: process_state(run.proc) == "T", 10)
        control.resume(None, queue)
        Worker(burst=True).run(install_signal_handlers=False)  # another worker
        state = describe(queue, row.pk)
        run.send(signal.SIGCONT)
        assert run.finish() == 0, run.output()
    after = Delivery.objects.get(pk=row.pk)
    assert after.status == Status.SENT, f"{state}\n{run.output()}"
    assert copies(row.message_id, smtp_server, outbox_mail) == 1


@postgresql_only
def test_sigterm_sets_back_a_claim_that_committed_unseen(worker, queue, smtp_server, outbox_mail):
    """SIGTERM while the thread backs off: the row goes back to ``queued``, never ``abandoned``.

    Before, the id went back while the row stayed ``processing`` under an
    incarnation that then deregistered: the sweeper flagged it abandoned
    though it was never sent, and the next worker skipped its id.
    """
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    host, port = database_address()
    with FaultProxy(port, host) as proxy:
        fault, fired = lose_the_claims_reply(proxy, row, "read-back")
        run = worker(
            OUTBOX_TEST_PG_HOST="127.0.0.1",
            OUTBOX_TEST_PG_PORT=str(proxy.port),
            OUTBOX_TEST_SMTP_PORT=str(smtp_server.port),
        )
        wait_until(lambda: fault.fired >= fired, 30)
        assert Delivery.objects.get(pk=row.pk).status == Status.PROCESSING
        assert run.finish(signal.SIGTERM) == 0, run.output()
    started_at = Delivery.objects.get(pk=row.pk).processing_started_at.timestamp()
    abandoned: list[int] = []

    def swept_past_the_cutoff() -> bool:
        # Past it, a row left processing by a worker that is gone is the sweeper's.
        past = queue.time() - HEARTBEAT_TIMEOUT > started_at + 0.2
        abandoned.append(Sweeper(policy="review").run_pass().abandoned)
        return past

    wait_until(swept_past_the_cutoff, 15, interval=0.3)
    state = describe(queue, row.pk)
    Worker(burst=True).run(install_signal_handlers=False)  # a later worker
    after = Delivery.objects.get(pk=row.pk)
    assert (after.status, sum(abandoned)) == (Status.SENT, 0), f"{state}\n{run.output()}"
    assert copies(row.message_id, smtp_server, outbox_mail) == 1
    assert not after.attempt_log.filter(outcome="abandoned").exists()


# -- Redis: heartbeats lost, claims and the database fine: the fence ----------------------


@not_on_a_topology
def test_no_send_once_heartbeats_are_lost(worker, queue, smtp_of, outbox_mail):
    """Redis gets no more heartbeats (nor registrations); claims and the database work on.

    A sweeper talking to Redis directly declares the worker dead. The worker
    must not start a send once its lease (0.8 x HEARTBEAT_TIMEOUT from the
    last heartbeat that was answered) has run out, and no row the sweeper
    flagged may have been sent. Before, the lease counted from when a row was
    marked, so a worker whose heartbeats were lost sent on until it was
    declared dead, and the row in hand then was flagged and sent. The
    sweeper here waits 1.5 x HEARTBEAT_TIMEOUT (more patience than the workers'
    timeout only widens the margin), so sends past the lease would show.

    The heartbeats are cut on their way, not their replies: a heartbeat
    whose reply only is lost still renews the registration in Redis.
    """
    smtp = smtp_of(Timed(delay=0.2))
    load_scripts(queue, "claim", "heartbeat", "register")
    rows = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(60)])
    redis_port, through = redis_proxy_env(queue)
    with FaultProxy(redis_port) as proxy:
        run = worker(OUTBOX_TEST_SMTP_PORT=str(smtp.port), **through(proxy))
        wait_until(lambda: smtp.count() >= 2, 30)
        incarnation = the_live_worker(queue)
        # Registration too, so that a new incarnation cannot start a fresh lease.
        lost = proxy.cut_on(evalsha("heartbeat", "register"), times=None)
        wait_until(lambda: lost.fired >= 1, 5)
        stopped_beating = time.monotonic()  # the last answered heartbeat was sent before
        patient = Sweeper(policy="review", timeout=1.5 * HEARTBEAT_TIMEOUT)
        passes = []

        def declared_dead() -> bool:
            passes.append(patient.run_pass())
            return incarnation not in queue.live_workers()

        wait_until(declared_dead, 20, interval=0.2)
        sends = list(smtp.data_at)
        assert run.finish() == 0, run.output()  # unregistered, it stops at once
    # Settle what it left (the sweeper's stuck-row rule), then another worker sends the rest.
    wait_until(
        lambda: (
            Sweeper(policy="review", timeout=0.5).run_pass() is not None
            and not Delivery.objects.filter(status=Status.PROCESSING).exists()
        ),
        15,
        interval=0.3,
    )
    Worker(burst=True).run(install_signal_handlers=False)

    lease_end = stopped_beating + LEASE
    late = [round(t - stopped_beating, 2) for t in sends if t > lease_end + 0.5]
    assert late == [], f"sends began this long after the last heartbeat: {late}\n{run.output()}"
    assert sum(p.reaped for p in passes) == 1
    statuses: dict[str, int] = {}
    for row in Delivery.objects.filter(pk__in=[r.pk for r in rows]):
        statuses[row.status] = statuses.get(row.status, 0) + 1
        sent = copies(row.message_id, smtp, outbox_mail)
        if row.status == Status.ABANDONED:
            assert sent == 0, f"delivery {row.pk} was flagged abandoned, yet sent"
        else:
            assert (row.status, sent) == (Status.SENT, 1), describe(queue, row.pk)
    assert statuses.get(Status.SENT, 0) >= len(rows) - 2, statuses


# -- SMTP: the reply to the final dot is lost ----------------------------------------------


@pytest.mark.parametrize("policy", ["review", "requeue"])
def test_a_lost_reply_to_the_final_dot(policy, worker, queue, smtp_server):
    """In doubt after DATA: "review" flags the row and never sends it again; "requeue" does.

    This already held before the lease and give-back fixes (tests/faults/test_ambiguous.py
    has it in process); here it is a real worker against a real connection cut.
    """
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    final = Status.ABANDONED if policy == "review" else Status.SENT
    with FaultProxy(smtp_server.port) as proxy:
        lost = proxy.swallow_reply(b"\r\n.\r\n", then="cut")
        run = worker(OUTBOX_TEST_SMTP_PORT=str(proxy.port), OUTBOX_TEST_ABANDONED_POLICY=policy)
        wait_until(lambda: Delivery.objects.get(pk=row.pk).status == final, 30)
        # Nothing moves it on: the sweeper leaves a worker's own verdict alone.
        Sweeper(policy=policy).run_pass()
        assert run.finish() == 0, run.output()
    assert lost.fired == 1
    after = Delivery.objects.get(pk=row.pk)
    # A success writes no Attempt row: the row itself is its record.
    attempts = list(after.attempt_log.order_by("pk").values_list("outcome", "error"))
    assert [error.startswith("in doubt") for _, error in attempts] == [True], attempts
    if policy == "review":
        assert (after.status, attempts[0][0]) == (Status.ABANDONED, "ambiguous")
        assert smtp_server.by_message_id() == {row.message_id: 1}  # the server has it, once
    else:
        assert (after.status, attempts[0][0]) == (Status.SENT, "retry")
        assert smtp_server.by_message_id() == {row.message_id: 2}  # at least once: the duplicate
