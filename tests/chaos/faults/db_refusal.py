"""Fault (PostgreSQL only): the database refuses a worker's "mark sent" write.

A worker is stopped right after the SMTP server accepted a message (see
send_window.py); every other backend of the run's database is terminated
(``pg_terminate_backend``), and the worker is woken up. Its "mark sent" fails;
it must reconnect and record the row as sent, once, and say so in its log
(whatever the wording: "database error recording delivery ..." when the
outcome is written alone, "the database is unavailable (...)" when it shares
the next claim's statement).
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.child import Child

from tests.chaos.faults.send_window import stopped_after_send


def db_refusal(child: Child) -> None:
    from django.db import connection

    proc, row = stopped_after_send(child, "refuse")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        terminated = sum(1 for (ok,) in cursor.fetchall() if ok)
    # What the worker logs from here on must show the refused write.
    offset = proc.log.stat().st_size
    os.kill(proc.pid, signal.SIGCONT)
    child.counts["db refusals"] += 1
    child.counts["backends terminated"] += terminated
    child.refused_rows.append((row, proc.pid, proc.log, offset))
    from outbox.models import Delivery

    child.wait_for(
        lambda: Delivery.objects.filter(pk=row).exclude(status="processing").exists(),
        30,
        f"row {row} to be settled after the refused write",
    )
    code = child.terminate(proc)
    child.event(
        f"{proc.name} (pid {proc.pid}) stopped after_send on row {row}; terminated "
        f"{terminated} backends of the database; SIGCONT; row settled; SIGTERM -> {code}"
    )
