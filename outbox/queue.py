"""The Redis mirror of the outbox: a reliable queue of delivery ids.

Only row ids go into Redis; the database row is the truth and Redis is a fast,
lossy accelerator that can always be rebuilt from it (see ``sweeper.py``).

Keys, all sharing the hash tag ``{<KEY_PREFIX>}`` so that multi-key commands
and scripts stay legal on Redis Cluster:

``{p}:ready:high|normal|low``  lists of due ids (LPUSH in, LMOVE out from the right)
``{p}:scheduled``              sorted set of ``"id:prio"``, score = due time
``{p}:queued``                 set of ids waiting in a ready list or ``scheduled``:
                               the gate that keeps repeated mirroring from
                               duplicating ids
``{p}:processing:<worker>``    ids a worker has claimed (the reliable-queue list)
``{p}:workers``                sorted set of live workers, score = last heartbeat
``{p}:dead``                   workers declared dead, not yet cleaned up
``{p}:sweep-lock``             the sweeper's lease
``{p}:mirror``                 hash: the sweeper's bookkeeping of the mirror

Duplicate ids are harmless: a worker acts on an id only through a conditional
UPDATE in the database, so a stale or repeated id changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, NamedTuple, cast

from redis import Redis
from redis.commands.core import Script

from .conf import PRIORITIES, outbox_settings

PRIORITY_INDEX: dict[str, int] = {name: i + 1 for i, name in enumerate(PRIORITIES)}
PRIORITY_NAME: dict[int, str] = {i: name for name, i in PRIORITY_INDEX.items()}

# How many scheduled ids one claim may promote; bounds the script's run time.
PROMOTE_LIMIT = 200
# Triples per script call when mirroring many rows (keeps each call short).
PUSH_CHUNK = 1000


class QueueEntry(NamedTuple):
    """What Redis needs to know about a row to place it: id, priority, due time."""

    id: int
    priority: str
    due: float  # epoch seconds


class Claimed(NamedTuple):
    id: int
    priority: str


@cache
def _script_source(name: str) -> str:
    lua = resources.files("outbox").joinpath("lua")
    body = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if name.startswith("lock_"):
        return body  # lock scripts take only the lock key
    return lua.joinpath("_common.lua").read_text(encoding="utf-8") + "\n" + body


def get_connection() -> Redis:
    """The Redis client of the django-redis cache alias ``OUTBOX["REDIS_CACHE"]``."""
    from django_redis import get_redis_connection

    return get_redis_connection(outbox_settings.REDIS_CACHE)


def _entry_args(entries: Iterable[QueueEntry]) -> list[Any]:
    args: list[Any] = []
    for entry in entries:
        args += [entry.id, PRIORITY_INDEX[entry.priority], f"{entry.due:.6f}"]
    return args


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisQueue:
    """Key names and atomic operations of one outbox's Redis mirror."""

    def __init__(self, connection: Redis | None = None, prefix: str | None = None) -> None:
        self.redis: Redis = connection if connection is not None else get_connection()
        self.prefix = prefix or outbox_settings.KEY_PREFIX
        tag = "{" + self.prefix + "}"
        self.queued_key = f"{tag}:queued"
        self.scheduled_key = f"{tag}:scheduled"
        self.ready_keys = [f"{tag}:ready:{name}" for name in PRIORITIES]
        self.workers_key = f"{tag}:workers"
        self.dead_key = f"{tag}:dead"
        self.lock_key = f"{tag}:sweep-lock"
        self.mirror_key = f"{tag}:mirror"
        self._processing_prefix = f"{tag}:processing:"
        self._scripts: dict[str, Script] = {}

    # -- keys -------------------------------------------------------------

    def processing_key(self, worker_id: str) -> str:
        return self._processing_prefix + worker_id

    def ready_key(self, priority: str) -> str:
        return self.ready_keys[PRIORITY_INDEX[priority] - 1]

    def _keys(self, worker_id: str | None = None) -> list[str]:
        keys = [
            self.queued_key,
            self.scheduled_key,
            *self.ready_keys,
            self.workers_key,
            self.dead_key,
        ]
        if worker_id is not None:
            keys.append(self.processing_key(worker_id))
        return keys

    def _script(self, name: str) -> Script:
        # Script objects use EVALSHA and reload on NOSCRIPT, so they survive a
        # Redis restart that forgot the script cache.
        if name not in self._scripts:
            self._scripts[name] = self.redis.register_script(_script_source(name))
        return self._scripts[name]

    # -- producers ----------------------------------------------------------

    def push(self, entries: Sequence[QueueEntry], now: float | None = None) -> int:
        """Mirror rows into Redis; ids already waiting there are skipped.

        Due ids go to their ready list, later ones to ``scheduled``. Returns how
        many ids were new to Redis. Large batches go in chunks, one pipeline.
        """
        if not entries:
            return 0
        now = time.time() if now is None else now
        script = self._script("push")
        keys = self._keys()
        if len(entries) <= PUSH_CHUNK:
            return int(script(keys=keys, args=[now, *_entry_args(entries)]))
        pipe = self.redis.pipeline(transaction=False)
        for start in range(0, len(entries), PUSH_CHUNK):
            chunk = entries[start : start + PUSH_CHUNK]
            script(keys=keys, args=[now, *_entry_args(chunk)], client=pipe)
        return sum(int(n) for n in pipe.execute())

    # -- workers ------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        count: int,
        acks: Sequence[int] = (),
        now: float | None = None,
    ) -> list[Claimed]:
        """Forget ``acks``, promote due ids, then claim up to ``count`` ids.

        One round trip. Claimed ids sit in the worker's processing list until
        acknowledged, so a crash leaves them for the sweeper.
        """
        now = time.time() if now is None else now
        raw = self._script("claim")(
            keys=self._keys(worker_id),
            args=[now, count, PROMOTE_LIMIT, len(acks), *acks],
        )
        return [Claimed(int(raw[i]), PRIORITY_NAME[int(raw[i + 1])]) for i in range(0, len(raw), 2)]

    def wait_claim(self, worker_id: str, timeout: float) -> Claimed | None:
        """Block up to ``timeout`` seconds for one normal-priority id.

        Used only when :meth:`claim` found nothing; a high or low priority id
        that arrives meanwhile is taken by the next :meth:`claim`, at most
        ``timeout`` later.
        """
        normal = self.ready_key("normal")
        # BLMOVE takes a fractional timeout (Redis >= 6); redis-py types it as int.
        raw = self.redis.execute_command(
            "BLMOVE", normal, self.processing_key(worker_id), "RIGHT", "LEFT", timeout
        )
        if raw is None:
            return None
        self.redis.srem(self.queued_key, raw)
        return Claimed(int(raw), "normal")

    def ack(self, worker_id: str, ids: Sequence[int]) -> None:
        """Remove finished ids from the worker's processing list."""
        if ids:
            self.claim(worker_id, 0, acks=ids)

    def release(
        self,
        worker_id: str,
        entries: Sequence[QueueEntry],
        acks: Sequence[int] = (),
        deregister: bool = False,
        now: float | None = None,
    ) -> int:
        """Put claimed-but-unstarted ids back; optionally deregister the worker."""
        now = time.time() if now is None else now
        return int(
            self._script("release")(
                keys=self._keys(worker_id),
                args=[
                    now,
                    worker_id,
                    1 if deregister else 0,
                    len(acks),
                    *acks,
                    *_entry_args(entries),
                ],
            )
        )

    def register(self, worker_id: str, now: float | None = None) -> None:
        self.redis.zadd(self.workers_key, {worker_id: time.time() if now is None else now})

    def heartbeat(self, worker_id: str, now: float | None = None) -> bool:
        """Refresh the heartbeat; False means this id was declared dead (or lost)."""
        now = time.time() if now is None else now
        return bool(self._script("heartbeat")(keys=self._keys(), args=[now, worker_id]))

    # -- sweeper ------------------------------------------------------------

    def declare_dead(self, cutoff: float, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        raw = self._script("declare_dead")(keys=self._keys(), args=[cutoff, now])
        return [_decode(w) for w in raw]

    def dead_workers(self) -> list[str]:
        members = cast(list[bytes], self.redis.zrange(self.dead_key, 0, -1))
        return [_decode(w) for w in members]

    def live_workers(self) -> dict[str, float]:
        """Registered workers and their last heartbeat (epoch seconds)."""
        pairs = cast(
            list[tuple[bytes, float]], self.redis.zrange(self.workers_key, 0, -1, withscores=True)
        )
        return {_decode(w): float(score) for w, score in pairs}

    def mirror_state(self) -> dict[str, str]:
        """The sweeper's bookkeeping hash, decoded."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.mirror_key))
        return {_decode(k): _decode(v) for k, v in raw.items()}

    def processing_ids(self, worker_id: str) -> list[int]:
        return [int(i) for i in self.redis.lrange(self.processing_key(worker_id), 0, -1)]

    def reap(self, worker_id: str, requeue: Sequence[QueueEntry], now: float | None = None) -> int:
        """Push back ``requeue`` and forget the dead worker's list and entry."""
        now = time.time() if now is None else now
        return int(
            self._script("reap")(
                keys=self._keys(worker_id),
                args=[now, worker_id, *_entry_args(requeue)],
            )
        )

    def queued_members(self, ids: Sequence[int]) -> list[bool]:
        """Which of ``ids`` are waiting in Redis (ready or scheduled)."""
        if not ids:
            return []
        return [bool(x) for x in self.redis.smismember(self.queued_key, list(ids))]

    def acquire_lock(self, token: str, ttl: float) -> bool:
        return bool(self.redis.set(self.lock_key, token, nx=True, px=int(ttl * 1000)))

    def extend_lock(self, token: str, ttl: float) -> bool:
        return bool(
            self._script("lock_extend")(keys=[self.lock_key], args=[token, int(ttl * 1000)])
        )

    def release_lock(self, token: str) -> bool:
        return bool(self._script("lock_release")(keys=[self.lock_key], args=[token]))

    def promote(self, limit: int = 10_000, now: float | None = None) -> int:
        """Move due ids from ``scheduled`` to the ready lists; returns how many."""
        now = time.time() if now is None else now
        return int(self._script("promote")(keys=self._keys(), args=[now, limit]))

    # -- introspection --------------------------------------------------------

    def ready_lengths(self) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for key in self.ready_keys:
            pipe.llen(key)
        return dict(zip(PRIORITIES, (int(n) for n in pipe.execute()), strict=True))

    def scheduled_length(self) -> int:
        return int(self.redis.zcard(self.scheduled_key))

    def queued_count(self) -> int:
        return int(self.redis.scard(self.queued_key))
