"""Fault: SIGKILL a random running worker at a random moment, and start a replacement.

Whatever the worker had claimed or was sending is left for the sweeper, which
declares the worker dead after the heartbeat timeout.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError

if TYPE_CHECKING:
    from tests.chaos.child import Child


def random_kill(child: Child) -> None:
    child.ensure_work(child.batch_size)
    victims = child.live_workers()
    if not victims:
        raise HarnessError("no running worker to kill")
    victim = child.rng.choice(victims)
    victim.expected_exit = True
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=30)
    child.disturbed[victim.pid] = "SIGKILL"
    child.counts["random SIGKILL"] += 1
    new = child.start_worker(victim.concurrency, proxied=victim.proxied)
    child.event(f"SIGKILL {victim.name} (pid {victim.pid}); started {new.name} (pid {new.pid})")
