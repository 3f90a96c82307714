"""Fault: SIGKILL a worker mid-send and restart it at once under the same ``--worker-id``.

What systemd's ``%i`` or a StatefulSet pod name does: a one-thread worker runs
as ``--worker-id chaos-fixed-<n>`` and stops itself right after it marked a row
``processing`` (``OUTBOX_FAULT_POINT=after_mark_processing``); it is SIGKILLed
there and a new process starts immediately under the same id. Every process
start is its own incarnation (``chaos-fixed-<n>#<12 hex>``), so the new one must
not revive the old one's registration: the sweeper declares the old incarnation
dead and settles its row (``abandoned`` under "review", requeued under
"requeue"); the row is never left ``processing``. The new process stays on as an
ordinary worker. analysis.py (``check_restarts``) checks the row at the end.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from tests.chaos.faults.send_window import stopped_at

if TYPE_CHECKING:
    from tests.chaos.child import Child


def restart_same_id(child: Child) -> None:
    from outbox.models import Delivery

    name = f"chaos-fixed-{child.counts['restart under reused id'] + 1}"
    proc, row = stopped_at(child, "restart", "after_mark_processing", worker_id=name)
    old = Delivery.objects.values_list("worker_id", flat=True).get(pk=row)
    proc.expected_exit = True
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait(timeout=30)
    new = child.start_worker(1, worker_id=name)
    child.disturbed[proc.pid] = "SIGKILL after_mark_processing, restarted under its id"
    child.restart_rows.append((row, old))
    child.counts["restart under reused id"] += 1
    child.wait_for(lambda: child.wait_until_up(new, 0.01), 60, f"{new.name} to start")
    # The sweeper must settle the old incarnation's row while the new one beats.
    child.wait_for(
        lambda: Delivery.objects.filter(pk=row).exclude(status="processing").exists(),
        6 * child.config.heartbeat_timeout + 30,
        f"the sweeper to settle row {row} of the restarted {name}",
    )
    status = Delivery.objects.values_list("status", flat=True).get(pk=row)
    child.event(
        f"SIGKILL {proc.name} (pid {proc.pid}, {old}) after_mark_processing on row {row}; "
        f"started {new.name} (pid {new.pid}) as --worker-id {name} at once; "
        f"the sweeper settled row {row} (its status now: {status})"
    )
