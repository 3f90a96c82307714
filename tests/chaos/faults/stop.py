"""Fault: SIGSTOP a random worker past the heartbeat timeout, then SIGCONT it.

The worker is frozen until the sweeper has declared it dead (and on PostgreSQL
reaped it, settling the rows in its send window); woken up, it must notice that
its lease is gone and not send late. If the sweeper never gets there, what every
database backend was doing is kept in the details.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError
from tests.chaos.processes import process_state

if TYPE_CHECKING:
    from tests.chaos.child import Child


def stop_past_timeout(child: Child) -> None:
    child.ensure_work(child.batch_size)
    victims = child.live_workers()
    if not victims:
        raise HarnessError("no running worker to stop")
    victim = child.rng.choice(victims)
    stopped_at = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)
    child.disturbed[victim.pid] = "SIGSTOP"
    child.counts["SIGSTOP"] += 1
    try:
        child.wait_for(lambda: process_state(victim.pid) == "T", 10, "the SIGSTOP")
        # Past the heartbeat timeout: until the sweeper declared it dead and (on
        # PostgreSQL) reaped it, settling the rows it had in its send window. On
        # SQLite a worker frozen inside a write transaction keeps the database
        # locked, so the reaping can only happen once it runs again.
        timeout = child.config.heartbeat_timeout
        settled = child.registered if child.config.db == "postgres" else child.is_live
        try:
            child.wait_for(
                lambda: time.monotonic() - stopped_at > timeout and not settled(victim.pid),
                4 * timeout + 30,
                f"the sweeper to declare stopped {victim.name} (pid {victim.pid}) dead"
                + (" and reap it" if child.config.db == "postgres" else ""),
                interval=0.1,
            )
        except HarnessError:
            child.details.append(
                f"while {victim.name} (pid {victim.pid}) was stopped, waited in vain for "
                f"the sweeper; Redis live: {child.is_live(victim.pid)}, "
                f"registered (live or dead, not reaped): {child.registered(victim.pid)}"
            )
            child.details.extend(db_activity(child))
            raise
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    child.event(
        f"SIGSTOP {victim.name} (pid {victim.pid}) for {time.monotonic() - stopped_at:.1f}s "
        f"(until declared dead{' and reaped' if child.config.db == 'postgres' else ''}), "
        "then SIGCONT"
    )


def db_activity(child: Child) -> list[str]:
    """What every other backend of the database is doing, and who blocks whom."""
    if child.config.db != "postgres":
        return []
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), "
            "now() - xact_start, left(regexp_replace(query, '\\s+', ' ', 'g'), 300) "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() ORDER BY pid"
        )
        rows = cursor.fetchall()
    return [
        f"  pg backend {pid}: {state}, waiting {wtype}/{wevent}, blocked by {blockers}, "
        f"transaction age {age}, query: {query}"
        for pid, state, wtype, wevent, blockers, age, query in rows
    ]
