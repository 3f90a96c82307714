"""What a sender thread's rooms need from the worker process that runs them.

:class:`~outbox.worker.process.Worker` is the one implementation; the rooms
(``loop``, ``attempt``, ``gate``, ``backoff``) name this protocol instead, so
that they import nothing above them.
"""

from __future__ import annotations

import threading
from typing import Protocol

from ..queue.clock import RedisClock
from ..queue.control import ControlView
from ..queue.entries import QueueEntry
from ..queue.reliable import RedisQueue
from .alarm import FailureAlarm
from .cache import EmailCache
from .group_commit import GroupCommit
from .incarnation import Incarnation
from .report import Stats


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
