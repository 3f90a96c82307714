"""What a sender thread's rooms need from the worker process that runs them.

:class:`~outbox.worker.process.Worker` is the one implementation; the rooms
(``loop``, ``attempt``, ``gate``, ``backoff``) name this protocol instead, so
that they import nothing above them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Protocol

from ..conf import outbox_settings
from ..queue.clock import RedisClock
from ..queue.control import ControlView
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue
from .alarm import FailureAlarm
from .cache import EmailCache
from .group_commit import GroupCommit
from .report import Stats

# A send needs a lease: the last heartbeat that found this incarnation alive
# was sent less than this share of HEARTBEAT_TIMEOUT ago. The rest of the
# timeout is the margin between the sweeper's clock and ours.
LEASE_SHARE = 0.8


@dataclass(frozen=True)
class Incarnation:
    """Who the worker process is now and since when its lease runs, read as one.

    The name (``<name>#<hex>``, unique to one incarnation: rows, processing
    lists and heartbeats carry it) and the lease change together, in one
    assignment under the worker's lock, and a sender reads them together
    (``WorkerHost.incarnation``). Read apart, a thread could take the new
    incarnation's fresh lease with the old, dead name, and mark and send a
    row under a name the sweeper is settling.
    """

    worker_id: str
    # time.monotonic() when the last heartbeat (or the registration) that
    # found this incarnation alive was sent: the start of its lease.
    lease_from: float

    def lease_left(self) -> float:
        """Seconds this incarnation may still start a send; not positive: it may not.

        The sweeper declares an incarnation dead when its heartbeat is
        HEARTBEAT_TIMEOUT old by Redis' clock. The lease counts from when the
        last successful heartbeat was *sent*, before Redis stamped it, so it
        ends before the sweeper may act, whatever froze us (SIGSTOP, a Redis
        outage, a stalled step).
        """
        lease = LEASE_SHARE * outbox_settings.HEARTBEAT_TIMEOUT
        return lease - (time.monotonic() - self.lease_from)

    def renewed(self, sent_at: float) -> Incarnation:
        """The same incarnation, its lease renewed by a heartbeat sent at ``sent_at``."""
        return replace(self, lease_from=max(self.lease_from, sent_at))


class WorkerHost(Protocol):
    """The process-wide state and services the sender threads share."""

    burst: bool
    concurrency: int  # sender threads: those a claim shares the ready ids among
    queue: RedisQueue
    clock: RedisClock
    control: ControlView
    emails: EmailCache
    stats: Stats
    alarm: FailureAlarm
    group_commit: GroupCommit
    stop_event: threading.Event
    sqlite_write_lock: threading.Lock

    def claim_size(self) -> int: ...

    def count_handled(self) -> bool: ...

    @property
    def worker_id(self) -> str: ...  # the current incarnation's name

    def incarnation(self) -> Incarnation: ...

    def reincarnate(self, old: str) -> None: ...

    def lease_left(self, worker_id: str) -> float: ...

    def push_quietly(self, entries: list[QueueEntry]) -> None: ...

    def outlasted(self, since: float, what: str, exc: BaseException | None) -> bool: ...
