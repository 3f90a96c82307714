"""Fault (PostgreSQL only): SIGSTOP a worker whose step waits on a row lock, then let it go.

The harness locks the next few queued rows the workers are about to claim
(``SELECT ... FOR UPDATE`` on its own connection, the oldest never-tried rows)
and waits until a worker's session waits on that lock (pg_stat_activity:
``wait_event_type = 'Lock'``, blocked by the harness's backend; the session's
``application_name`` is ``chaos-<pid>``, see tests/chaos/settings.py). It
SIGSTOPs that worker, releases the lock (the frozen worker's step then
commits: its row is ``processing`` under it), waits until the sweeper has
declared the worker dead and reaped it, and SIGCONTs it.

The worker's lease ran out while it was frozen, so it must not send the row:
under "review" the row is ``abandoned`` and stays so, never arriving; under
"requeue" it is requeued and sent once, at most. analysis (``check_lock_rows``
in expectations_net.py) checks each row at the end.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any

from tests.chaos.config import HarnessError
from tests.chaos.processes import Proc, incarnations, process_state

if TYPE_CHECKING:
    from tests.chaos.child import Child

LOCKED_ROWS = 5


def stop_on_row_lock(child: Child) -> None:
    import psycopg

    for _ in range(8):
        child.ensure_work(2 * LOCKED_ROWS, for_fault=True)
        with psycopg.connect(**child._pg_params(child.db_name)) as conn:
            rows = lock_next_rows(conn)
            victim = wait_for_waiter(child, backend_pid(conn), 10) if rows else None
            if victim is not None:
                stopped_at = time.monotonic()
                os.kill(victim.pid, signal.SIGSTOP)
                child.disturbed[victim.pid] = "SIGSTOP blocked on a row lock"
                child.wait_for(lambda pid=victim.pid: process_state(pid) == "T", 10, "the SIGSTOP")
            conn.rollback()  # releases the lock: the frozen worker's step commits
        if victim is not None:
            break
    else:
        raise HarnessError("no worker's step waited on the locked rows")
    try:
        held = wait_held(child, victim, rows)
        wait_reaped(child, victim, stopped_at)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    child.counts["SIGSTOP blocked on a row lock"] += 1
    child.lock_rows += [(pk, victim.pid) for pk in held]
    child.event(
        f"locked rows {rows}; {victim.name} (pid {victim.pid}) waited on them: SIGSTOP, "
        f"lock released, its step claimed rows {held}; SIGCONT after "
        f"{time.monotonic() - stopped_at:.1f}s, once declared dead and reaped"
    )


def lock_next_rows(conn: Any) -> list[int]:
    """Lock the oldest never-tried queued rows (the transaction stays open)."""
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM outbox_delivery WHERE status = 'queued' AND attempts = 0 "
            "AND not_before <= now() ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
            [LOCKED_ROWS],
        )
        return [pk for (pk,) in cursor.fetchall()]


def backend_pid(conn: Any) -> int:
    """The server process of the lock's transaction.

    Asked in the transaction, not read from ``conn.info.backend_pid``: behind a
    pooler (tests/faults/test_pgbouncer.py) that is PgBouncer's own number.
    """
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def wait_for_waiter(child: Child, blocker: int, timeout: float) -> Proc | None:
    """A regular worker whose session waits on the harness's lock, or None in time."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:  # autocommit: a fresh snapshot each time
            cursor.execute(
                "SELECT application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND %s = ANY(pg_blocking_pids(pid))",
                [blocker],
            )
            names = [name for (name,) in cursor.fetchall()]
        pids = {int(n.split("-", 1)[1]) for n in names if n.startswith("chaos-")}
        for proc in child.live_workers():
            if proc.pid in pids:
                return proc
        child.tick()
        time.sleep(0.02)
    return None


def wait_held(child: Child, victim: Proc, rows: list[int]) -> list[int]:
    """The locked rows the frozen worker's step claimed once the lock was gone."""
    from outbox.models import Delivery

    names = incarnations(victim.log)

    def held() -> list[int]:
        found = Delivery.objects.filter(pk__in=rows, worker_id__in=names)
        return list(found.values_list("pk", flat=True))

    return child.wait_for(held, 10, f"the step of stopped {victim.name} to claim a locked row")


def wait_reaped(child: Child, victim: Proc, stopped_at: float) -> None:
    timeout = child.config.heartbeat_timeout
    child.wait_for(
        lambda: time.monotonic() - stopped_at > timeout and not child.registered(victim.pid),
        4 * timeout + 30,
        f"the sweeper to declare stopped {victim.name} (pid {victim.pid}) dead and reap it",
        interval=0.1,
    )
