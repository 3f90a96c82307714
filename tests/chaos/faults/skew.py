"""Fault: a worker whose clock is 90 seconds behind (libfaketime), for the rest of the run.

The worker runs under ``FAKETIME=-90s`` with libfaketime preloaded (the Debian
package ``faketime``; tests/run.sh and tests/chaos/run.sh install it), through
tests/chaos/worker_main.py (see there how Python is kept working under it).
Heartbeats, claims and the dead-worker cutoff use Redis time and due checks
the database's clock, so this worker must never be declared dead while it
beats, must deliver like any other, and nothing it touches may be abandoned
or requeued by the sweeper. It is not a target of the other faults; it stops
with the others at the end (SIGTERM, exit 0). The fault waits until it has
delivered one row; analysis.py (``check_skewed``) checks the rest at the end.
"""

from __future__ import annotations

import glob
import shutil
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError
from tests.chaos.processes import incarnations

if TYPE_CHECKING:
    from tests.chaos.child import Child
    from tests.chaos.processes import Proc


def libfaketime() -> str:
    """The multi-threaded libfaketime library's path; HarnessError when not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found or shutil.which("faketime") is None:
        raise HarnessError("faketime is not installed (apt-get install faketime)")
    return found[0]


def skewed_clock_env(offset: float) -> dict[str, str]:
    """Environment for a ``tests.chaos.worker_main`` process whose wall clock is ``offset`` s off.

    libfaketime is preloaded; worker_main.py says why the monotonic clock
    stays real and how Python is kept working under it.
    """
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": f"{offset:+.0f}s",
        "DONT_FAKE_MONOTONIC": "1",
        "OUTBOX_CHAOS_SLEEP_FIX": "1",
    }


def skewed_worker(child: Child) -> None:
    offset = child.config.skew_seconds
    env = skewed_clock_env(offset)
    proc = child.start_worker(2, role="skew", env=env)
    child.skewed.append(proc)
    child.counts["skewed workers"] += 1
    child.wait_for(lambda: child.wait_until_up(proc, 0.01), 60, f"{proc.name} to start")
    if proc.proc.poll() is not None:
        raise HarnessError(f"{proc.name} exited ({proc.proc.returncode}) at its start")

    def delivered() -> int:
        child.ensure_work(5, for_fault=True)
        return sent_by(proc)

    child.wait_for(delivered, 60, f"{proc.name} (clock {offset:+.0f}s) to deliver", interval=0.3)
    child.event(
        f"started {proc.name} (pid {proc.pid}) with its clock {offset:+.0f}s off; "
        f"it delivered {sent_by(proc)} so far"
    )


def sent_by(proc: Proc) -> int:
    """Rows sent by any incarnation of this worker process."""
    from outbox.models import Delivery

    return Delivery.objects.filter(status="sent", worker_id__in=incarnations(proc.log)).count()
