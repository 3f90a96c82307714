"""Fault: SIGKILL a worker inside the send window (after the SMTP server accepted).

A one-thread worker started with ``OUTBOX_FAULT_POINT=after_send`` stops itself
right after its first accepted send, before it records "sent"; it is SIGKILLed
there. (The hook stops the calling thread itself, so the worker cannot run on
into the next message.) Under "review" the row must end ``abandoned``
(delivered once), under "requeue" it is sent again (delivered twice). ``stopped_after_send`` is shared
with db_refusal.py; ``stopped_at`` (any fault point) with restart.py.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError
from tests.chaos.processes import Proc, incarnations, pid_of, process_state

if TYPE_CHECKING:
    from tests.chaos.child import Child


def stopped_after_send(child: Child, role: str) -> tuple[Proc, int]:
    """Start a one-thread worker that SIGSTOPs itself after its first accepted send."""
    return stopped_at(child, role, "after_send")


def stopped_at(
    child: Child, role: str, point: str, worker_id: str | None = None
) -> tuple[Proc, int]:
    """Start a one-thread worker that SIGSTOPs itself at ``point``; it and its one row.

    Work is kept queued for it (from the plan's reserve, see plan.py) until it
    stops; ``worker_id`` is its ``--worker-id``.
    """
    proc = child.start_worker(1, role=role, fault=point, worker_id=worker_id)
    child.wait_for(lambda: child.wait_until_up(proc, 0.01), 60, f"{proc.name} to start")
    deadline = time.monotonic() + 90
    next_check = 0.0
    while process_state(proc.pid) != "T":
        if proc.proc.poll() is not None:
            proc.expected_exit = True
            raise HarnessError(f"{proc.name} exited ({proc.proc.returncode}) before its fault")
        now = time.monotonic()
        if now > deadline:
            raise HarnessError(f"{proc.name} never reached {point}")
        if now >= next_check:  # keep a little work queued for it to claim
            child.ensure_work(5, for_fault=True)
            next_check = now + 0.3
        child.tick()
        time.sleep(0.02)
    rows = rows_held_by(proc, worker_id)
    if len(rows) != 1:
        raise HarnessError(f"{proc.name} stopped {point} holding rows {rows}, not one")
    return proc, rows[0]


def rows_held_by(proc: Proc, name: str | None) -> list[int]:
    """The ``processing`` rows of this process (by its pid, or by its --worker-id)."""
    from outbox.models import Delivery

    mine = incarnations(proc.log)
    return [
        pk
        for pk, worker_id in Delivery.objects.filter(status="processing").values_list(
            "pk", "worker_id"
        )
        if worker_id in mine or (name is None and pid_of(worker_id) == proc.pid)
    ]


def window_kill(child: Child) -> None:
    proc, row = stopped_after_send(child, "window")
    proc.expected_exit = True
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait(timeout=30)
    child.disturbed[proc.pid] = "SIGKILL after_send"
    child.window_rows.append(row)
    child.counts["SIGKILL after_send"] += 1
    child.event(f"SIGKILL {proc.name} (pid {proc.pid}) after_send: row {row} in the window")
