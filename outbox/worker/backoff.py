"""What a sender thread does when something it needs is away: wait, and let go.

``Backoff`` is the growing pause while Redis or the database is unreachable
(0.2 s doubling to 5 s, so a failover is noticed within seconds but an outage is
not hammered), logged once per outage. The two closers drop a connection that
may be dead without letting its goodbye raise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection

if TYPE_CHECKING:
    from .process import Worker

logger = logging.getLogger("outbox.worker")


class Backoff:
    """Growing pause while Redis or the database is away, logged once per outage."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.delay = 0.0

    def reset(self) -> None:
        if self.delay:
            logger.info("connection restored")
        self.delay = 0.0

    def wait(self, what: str, exc: BaseException | None) -> None:
        if not self.delay:
            logger.warning("%s is unavailable (%s); backing off", what, exc or "error")
        self.delay = min(max(self.delay * 2, 0.2), 5.0)
        self.worker.stop_event.wait(self.delay)


def close_quietly(backend: BaseEmailBackend) -> None:
    try:
        backend.close()
    except Exception:  # a dead connection may fail to say goodbye
        logger.debug("closing the delivery connection failed", exc_info=True)


def drop_db_connection() -> None:
    try:
        connection.close()
    except Exception:
        logger.debug("closing the database connection failed", exc_info=True)
