"""What a sender thread does when it has to wait: for work, or for what is away.

``Backoff`` is the growing pause while Redis or the database is unreachable
(0.2 s doubling to 5 s, so a failover is noticed within seconds but an outage is
not hammered), logged once per outage; an outage that outlasts the worker's
``give_up_after`` (``--give-up-after``) stops it. :func:`wait_idle` blocks while there is
no work. The two closers drop a connection that may be dead without letting
its goodbye raise.
"""

from __future__ import annotations

import logging
import math
import time

from django.core.mail.backends.base import BaseEmailBackend
from django.db import connections
from redis.exceptions import RedisError

from ..conf import outbox_settings
from ..models import outbox_alias
from .host import WorkerHost

logger = logging.getLogger("outbox.worker")


class Backoff:
    """Growing pause while Redis or the database is away, logged once per outage."""

    def __init__(self, worker: WorkerHost) -> None:
        self.worker = worker
        self.delay = 0.0
        self.since = 0.0  # time.monotonic() when the outage began

    def reset(self) -> None:
        if self.delay:
            logger.info("connection restored")
        self.delay = 0.0

    def wait(self, what: str, exc: BaseException | None) -> None:
        if not self.delay:
            logger.warning("%s is unavailable (%s); backing off", what, exc or "error")
            self.since = time.monotonic()
        elif self.worker.outlasted(self.since, what, exc):
            return  # the worker is stopping
        self.delay = min(max(self.delay * 2, 0.2), 5.0)
        self.worker.stop_event.wait(self.delay)


def wait_idle(
    worker: WorkerHost, pause: Backoff, paused: bool, next_due: float | None = None
) -> None:
    """Nothing to claim: block until woken, or until the next scheduled id is due.

    ``next_due``: that time as the empty claim saw it (``ClaimResult.next_due``),
    or None to ask Redis.
    """
    if paused:
        # Not on the wake list: its tokens would only spin a paused thread.
        worker.stop_event.wait(outbox_settings.BLOCK_TIMEOUT)
        return
    try:
        worker.queue.wait(idle_timeout(worker, next_due))
    except RedisError as exc:
        pause.wait("Redis", exc)


def idle_timeout(worker: WorkerHost, next_due: float | None = None) -> float:
    """How long to block on the wake token: at most until the next scheduled id is due.

    Nothing wakes a worker when a scheduled id falls due (only pushes do), and
    promotion happens in the claim. Without this, ids held for a rate limit's
    slot, retries and ``send_at`` mail would wait up to BLOCK_TIMEOUT past
    their time, and a limit's slots would go by unused. An id scheduled
    earlier after the look leaves a wake token (``push_args`` in
    ``lua/_common.lua``), so a look made by the claim is as good as one made here.
    """
    timeout = outbox_settings.BLOCK_TIMEOUT
    due = worker.queue.next_scheduled_at() if next_due is None else next_due
    if due != math.inf:
        # Never 0: BLPOP would block for ever.
        timeout = max(0.01, min(timeout, due - worker.clock.time()))
    return timeout


def close_quietly(backend: BaseEmailBackend) -> None:
    try:
        backend.close()
    except Exception:  # a dead connection may fail to say goodbye
        logger.debug("closing the delivery connection failed", exc_info=True)


def drop_db_connection() -> None:
    try:
        connections[outbox_alias()].close()
    except Exception:
        logger.debug("closing the database connection failed", exc_info=True)
