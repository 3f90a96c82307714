"""The Redis half of :func:`outbox.status.collect`: what Redis holds, and whether it agrees.

One pipeline (or ``MULTI`` on one node) reads the ready lists, ``scheduled``,
the workers and what each holds; the sending-control switches, the rate
limits and the failure alarm come from their own modules. The ids are read only when the caller
asks to compare and Redis holds at most ``limit`` of them (see
``outbox.status.snapshot.COMPARE_LIMIT`` for why there is a limit).
"""

from __future__ import annotations

from typing import Any, cast

from ..conf import PRIORITIES, outbox_settings
from ..queue import alarm, control, ratelimit
from ..queue.reliable import RELEASE_LEVEL, RedisQueue, release_level


def read_redis(
    queue: RedisQueue | None, now: float, compare: bool, limit: int
) -> tuple[dict[str, Any], dict[str, set[int]] | None]:
    """The Redis part of the snapshot, and its ids when ``compare`` and at most ``limit``."""
    try:
        return _read_redis(queue or RedisQueue(), now, compare, limit)
    except Exception as exc:  # unreachable, or misconfigured: say so
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, None


def _read_redis(
    queue: RedisQueue, now: float, compare: bool, limit: int
) -> tuple[dict[str, Any], dict[str, set[int]] | None]:
    if compare:  # the database side is small enough: is Redis' too?
        pipe = queue.redis.pipeline(transaction=False)
        for key in queue.ready_keys:
            pipe.llen(key)
        pipe.zcard(queue.scheduled_key)
        compare = sum(pipe.execute()) <= limit

    workers, dead, names, levels, result = _read_redis_snapshot(queue, compare)
    ready = dict(zip(PRIORITIES, (int(n) for n in result[: len(PRIORITIES)]), strict=True))
    result = result[len(PRIORITIES) :]
    scheduled = int(result.pop(0))
    held = {name: [int(i) for i in result.pop(0)] for name in names}
    timeout = outbox_settings.HEARTBEAT_TIMEOUT
    report: dict[str, Any] = {
        "ok": True,
        "error": None,
        "ready": ready,
        "scheduled": scheduled,
        "workers": [
            {
                "id": _text(w),
                "heartbeat_age": round(max(0.0, now - float(score)), 3),
                "alive": now - float(score) <= timeout,
                "held": held[_text(w)],
                "release_level": release_level(levels.get(_text(w))),
            }
            for w, score in workers
        ],
        "release_level": RELEASE_LEVEL,
        "dead_workers": [{"id": _text(w), "held": held[_text(w)]} for w in dead],
        **_sending_control(queue),
        "failures": _failures(queue),
    }
    if not compare:
        return report, None
    ready_ids: set[int] = set()
    for values in result[: len(PRIORITIES)]:
        ready_ids.update(int(i) for i in values)
    scheduled_ids = {int(_text(m).partition(":")[0]) for m in result[len(PRIORITIES)]}
    held_ids = {i for ids in held.values() for i in ids}
    return report, {"ready": ready_ids, "scheduled": scheduled_ids, "held": held_ids}


def _read_redis_snapshot(
    queue: RedisQueue, compare: bool
) -> tuple[list[tuple[bytes, float]], list[bytes], list[str], dict[str, str], list[Any]]:
    """``(workers, dead workers, their names, release levels, the rest of the MULTI's replies)``.

    The rest is: the ready lists' lengths, the scheduled set's size, each named
    worker's processing list, then (with ``compare``) every ready list and the
    scheduled set's members.
    """
    redis = queue.redis
    # Read everything in one MULTI, so that an id a worker claims meanwhile is
    # seen either in a ready list or in its processing list, never in neither.
    # A worker that registers between the two round trips is read again.
    for _attempt in range(5):
        workers = cast(
            list[tuple[bytes, float]], redis.zrange(queue.workers_key, 0, -1, withscores=True)
        )
        dead = cast(list[bytes], redis.zrange(queue.dead_key, 0, -1))
        names = [_text(w) for w, _score in workers] + [_text(w) for w in dead]
        pipe = redis.pipeline(transaction=True)
        pipe.zrange(queue.workers_key, 0, -1, withscores=True)
        pipe.zrange(queue.dead_key, 0, -1)
        pipe.hgetall(queue.releases_key)
        for key in queue.ready_keys:
            pipe.llen(key)
        pipe.zcard(queue.scheduled_key)
        for name in names:
            pipe.lrange(queue.processing_key(name), 0, -1)
        if compare:
            for key in queue.ready_keys:
                pipe.lrange(key, 0, -1)
            pipe.zrange(queue.scheduled_key, 0, -1)
        result = pipe.execute()
        # Heartbeats change scores (and order), not membership.
        if {w for w, _s in result[0]} == {w for w, _s in workers} and set(result[1]) == set(dead):
            levels = {_text(k): _text(v) for k, v in result[2].items()}
            return result[0], result[1], names, levels, result[3:]
    raise RuntimeError("the set of workers kept changing; try again")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- agreement ------------------------------------------------------------------


def agreement_of(db: dict[str, set[int]], redis: dict[str, set[int]]) -> dict[str, Any]:
    ready, scheduled, held = redis["ready"], redis["scheduled"], redis["held"]
    anywhere = ready | scheduled | held
    ready_missing = len(db["due"] - anywhere)
    ready_stale = len(ready - db["due"])
    scheduled_missing = len(db["scheduled"] - anywhere)
    scheduled_stale = len(scheduled - db["scheduled"] - db["due"])
    return {
        "ready": {
            "agrees": not ready_missing and not ready_stale,
            "missing": ready_missing,
            "stale": ready_stale,
        },
        "scheduled": {
            "agrees": not scheduled_missing and not scheduled_stale,
            "missing": scheduled_missing,
            "stale": scheduled_stale,
        },
    }


def not_compared(limit: int) -> dict[str, Any]:
    """The agreement part when more than ``limit`` ids were too many to compare."""
    return {"agrees": None, "missing": None, "stale": None, "limit": limit}


# -- the failure alarm ----------------------------------------------------------------


def _failures(queue: RedisQueue) -> dict[str, Any]:
    """The failure alarm's rule and, per mailer, the window's counts (one round trip)."""
    _now, mailers = alarm.read(queue)
    return {
        **alarm.Rule.from_settings().as_dict(),
        "mailers": {m.mailer: m.as_dict() for m in mailers},
    }


# -- sending control ----------------------------------------------------------------


def _sending_control(queue: RedisQueue) -> dict[str, Any]:
    """The pause switches and the rate limits' use (``control`` and ``rate_limits``).

    One round trip for the switches and Redis' time, one more for the limits
    when there are any (read at that time, not at a second TIME).
    """
    now, switches = control.read(queue)
    return {
        "control": {**switches.as_dict(), "read_at": now},
        "rate_limits": [{**u._asdict()} for u in ratelimit.usage(queue, now=now)],
    }
