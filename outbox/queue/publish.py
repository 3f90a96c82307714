"""Pushing committed rows to Redis from the web side: a lost push loses no email.

The rows are already committed when their ids are pushed, so a push that
fails (Redis away) is logged, not raised: the sweeper mirrors every queued row
that Redis does not hold.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from redis import Redis

from ..conf import outbox_settings
from .client import get_connection
from .entries import QueueEntry
from .reliable import RedisQueue

logger = logging.getLogger("outbox.enqueue")


def default_queue() -> RedisQueue:
    """The queue of ``OUTBOX["REDIS_CACHE"]`` and ``KEY_PREFIX``, both read live."""
    # One RedisQueue per client and prefix, not one per call: building its key
    # names cost a web request as much as packing the push.
    return _queue_for(get_connection(), outbox_settings.KEY_PREFIX)


@lru_cache(maxsize=16)
def _queue_for(client: Redis, prefix: str) -> RedisQueue:
    return RedisQueue(client, prefix)


def publish(entries: list[QueueEntry], *, force: bool = False) -> bool:
    """Push rows to Redis; False (and a warning) when Redis is away.

    ``force`` pushes even ids the dedup set says are waiting (see
    ``RedisQueue.push``).
    """
    try:
        default_queue().push(entries, force=force)
    except Exception as exc:  # whatever failed, the rows are committed: never raise
        # One line per failed push: a web request during an outage logs one
        # each, and a traceback would bury the log. The traceback is at DEBUG.
        logger.warning(
            "Redis is unreachable (%s: %s); %s in the database until outbox_sweep mirrors %s.",
            type(exc).__name__,
            " ".join(str(exc).split()),
            "1 queued delivery stays"
            if len(entries) == 1
            else f"{len(entries)} queued deliveries stay",
            "it" if len(entries) == 1 else "them",
        )
        logger.debug("the failed push to Redis", exc_info=True)
        return False
    return True
