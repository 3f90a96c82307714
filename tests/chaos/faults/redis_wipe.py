"""Fault: redis-server dies, a batch is enqueued while it is down, it comes back empty.

The sweeper must mirror every queued row into the new, empty Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.child import Child


def redis_wipe(child: Child) -> None:
    child.redis_server.stop()
    child.enqueue_next()  # commits while Redis is down: the sweeper must mirror these
    child.redis_server.start()  # same port, no persistence: every key is gone
    child.counts["redis wipe"] += 1
    child.event("redis-server killed, one batch enqueued while it was down, restarted empty")
