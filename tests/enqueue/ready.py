"""What enqueueing pushed to Redis: the ids in a ready list, in order."""

from __future__ import annotations

from outbox.queue import RedisQueue


def ready_ids(queue: RedisQueue, priority: str = "normal") -> list[int]:
    return [int(x) for x in queue.redis.lrange(queue.ready_key(priority), 0, -1)]
