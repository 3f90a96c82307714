"""Fault: SIGTERM a worker while the SMTP server holds its reply longer than HEARTBEAT_TIMEOUT.

The SMTP server is armed for a fresh row's recipient (``slow``): it holds the
reply to DATA's final dot for ``slow_seconds`` (HEARTBEAT_TIMEOUT + 1.5 s, less
than the workers' SEND_TIMEOUT), then records the message and accepts it.
While it holds it, the worker sending it is SIGTERMed. A graceful stop
finishes the message in hand, and the worker's heartbeat goes on until its
sender threads are done: the sweeper must not declare it dead, and the row
ends ``sent``, never abandoned, with exactly one receipt; the worker exits 0.
A replacement is started. analysis (``check_long_sends`` in
expectations_net.py) checks the row at the end.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError
from tests.chaos.faults.stall import pick_fresh_row, wait_played
from tests.chaos.processes import Proc, pid_of

if TYPE_CHECKING:
    from tests.chaos.child import Child


def sigterm_during_long_send(child: Child) -> None:
    smtp = child.smtp
    assert smtp is not None
    for _ in range(8):
        row, recipient = pick_fresh_row(child)
        smtp.arm(recipient, "slow", True)
        played = wait_played(child, row, recipient)
        if played is None:
            smtp.armed.pop(recipient, None)  # it went out before the server was armed
            continue
        proc = sender_of(child, row)
        if proc is not None:
            break
        child.wait_for(lambda row=row: row_settled(row), 30, f"slow row {row} to settle")
    else:
        raise HarnessError("no regular worker sent an armed slow message")
    time.sleep(0.5)  # well inside the held reply
    held_since = time.monotonic()
    code = child.terminate(proc)
    child.counts["SIGTERM during a long send"] += 1
    child.long_send_rows.append((row, proc.pid, code))
    new = child.start_worker(proc.concurrency, proxied=proc.proxied)
    child.event(
        f"SIGTERM {proc.name} (pid {proc.pid}) while the SMTP server held row {row}'s reply "
        f"{smtp.slow_seconds:.1f}s; it exited {code} after {time.monotonic() - held_since:.1f}s; "
        f"started {new.name} (pid {new.pid})"
    )


def sender_of(child: Child, row: int) -> Proc | None:
    """The regular worker holding ``row`` (a fault's own or the skewed one: None)."""
    from outbox.models import Delivery

    worker_id = Delivery.objects.values_list("worker_id", flat=True).get(pk=row)
    pid = pid_of(worker_id or "")
    for proc in child.live_workers():
        if proc.pid == pid:
            return proc
    return None


def row_settled(row: int) -> bool:
    from outbox.models import Delivery

    return Delivery.objects.filter(pk=row).exclude(status__in=("queued", "processing")).exists()
