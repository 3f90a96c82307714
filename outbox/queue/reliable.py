"""The Redis mirror of the outbox: a reliable queue of delivery ids.

Only row ids go into Redis; the database row is the truth and Redis is a fast,
lossy accelerator that can always be rebuilt from it (see :class:`outbox.sweeper.mirror.Mirror`).

Keys, all sharing the hash tag ``{<KEY_PREFIX>}`` so that multi-key commands
and scripts stay legal on Redis Cluster:

``{p}:ready:high|normal|low``  lists of due ids (LPUSH in, LMOVE out from the right)
``{p}:scheduled``              sorted set of ``"id:prio"``, score = due time
``{p}:queued``                 set of ids waiting in a ready list or ``scheduled``:
                               the gate that keeps repeated mirroring from
                               duplicating ids
``{p}:wake``                   tokens a blocked worker waits for (BLPOP): ids are
                               ready, or one was scheduled earlier than any other
                               (an idle worker blocks only until the earliest
                               scheduled id is due); the claim is always a script
``{p}:processing:<worker>``    ids a worker incarnation has claimed (the
                               reliable-queue list)
``{p}:claims:<worker>``        each thread's last claim, so a retried claim
                               whose reply was lost gets the same ids
``{p}:workers``                sorted set of live incarnations, score = last heartbeat
``{p}:releases``               hash: incarnation -> the :data:`RELEASE_LEVEL` of the
                               release it runs, written before it registers; an
                               incarnation without one runs an earlier release
``{p}:dead``                   incarnations declared dead, not yet cleaned up
``{p}:sweep-lock``             the sweeper's lease
``{p}:mirror``                 hash: the sweeper's bookkeeping of the mirror
``{p}:mirror-held``            hash: queued rows whose id sat in a live worker's
                               processing list at the last pass -> since when
``{p}:control``                hash: the operator's pause switches, the domains
                               slowed down by their servers and the mailers
                               paused by their ESP's refusal (``control.ControlState``)
``{p}:rate:<key>``, ``{p}:rate-held:<key>``
                               one rate limit's bucket and the ids holding its
                               reserved slots (``ratelimit.take``)
``{p}:reconcile-asked``        sorted set: abandoned rows the reconcilers could not
                               settle, score = when asked (``outbox.sweeper.reconcile``)
``{p}:sent-total``             hash: the metrics' checkpoint of the sent count
                               (``outbox.status.counters``; never written by a worker)
``{p}:alarm``, ``{p}:alarm-state``
                               the failure alarm: attempts and failures per mailer
                               in buckets of the last window, and the mailers whose
                               alarm is on (``alarm.add``)

The rules every script keeps:

- An id leaves the ready lists only inside a script that also takes it out of
  the dedup set (``claim.lua``), so the set never claims an id that waits
  nowhere. Blocking waits happen on ``wake``, never on a ready list.
- An id that comes out of a processing list (given back, reaped, retried) is
  pushed *forced*: the set is not consulted, because it says nothing about it.
- A push always replaces a scheduled entry of the id with the row's due time.
  An id new to the set is placed at once (see ``push`` in ``lua/_common.lua``).
- All times are Redis ``TIME`` (see ``lua/_common.lua``).

Duplicate ids are harmless: a worker acts on an id only through a conditional
UPDATE in the database, so a stale or repeated id changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

from redis import Redis

from ..conf import PRIORITIES, outbox_settings
from ..redis_cluster import is_cluster, slot_target
from .client import get_connection, socket_timeout
from .direct import direct_connections
from .entries import (
    PRIORITY_INDEX,
    PRIORITY_NAME,
    Claimed,
    ClaimResult,
    QueueEntry,
    decode,
    entry_args,
)
from .scripts import shared_script

PUSH = shared_script("push")

# How many scheduled ids one claim may promote; bounds the script's run time.
PROMOTE_LIMIT = 200
# Triples per script call when mirroring many rows (keeps each call short).
PUSH_CHUNK = 1000
# Elements per LRANGE/ZRANGE page when the full check reads what Redis holds.
SCAN_PAGE = 10_000

# What a worker of this release can be given, announced at its registration in
# ``{p}:releases`` so that the current release writes nothing an earlier one's
# workers, still running during a rolling upgrade, would mishandle (the
# README's "Upgrading"). 0.1.0's workers announce nothing: level 1. Level 2: a
# worker refuses an email whose content the sweeper cleared
# (``outbox.mail.structure.refuse_cleared``), which 0.1.0's would send empty;
# so the sweeper clears no content while a worker below it is registered
# (``outbox.sweeper.sweep.Sweeper._clear_content``). A release that writes
# something new of that kind raises the level and waits the same way.
RELEASE_LEVEL = 2


def release_level(announced: bytes | str | None) -> int:
    """The release level a worker announced in ``{p}:releases``; none announced: 1 (0.1.0)."""
    return int(announced or 1)


class RedisQueue:
    """Key names and atomic operations of one outbox's Redis mirror."""

    def __init__(self, connection: Redis | None = None, prefix: str | None = None) -> None:
        self.redis: Redis = connection if connection is not None else get_connection()
        self.prefix = prefix or outbox_settings.KEY_PREFIX
        self._direct = direct_connections(self.redis)
        tag = "{" + self.prefix + "}"
        self.queued_key = f"{tag}:queued"
        self.scheduled_key = f"{tag}:scheduled"
        self.ready_keys = [f"{tag}:ready:{name}" for name in PRIORITIES]
        self.workers_key = f"{tag}:workers"
        self.releases_key = f"{tag}:releases"
        self.dead_key = f"{tag}:dead"
        self.wake_key = f"{tag}:wake"
        self.lock_key = f"{tag}:sweep-lock"
        self.mirror_key = f"{tag}:mirror"
        self.mirror_held_key = f"{tag}:mirror-held"
        self.control_key = f"{tag}:control"
        self.reconcile_key = f"{tag}:reconcile-asked"
        self.sent_total_key = f"{tag}:sent-total"
        self.alarm_key = f"{tag}:alarm"
        self.alarm_state_key = f"{tag}:alarm-state"
        self._processing_prefix = f"{tag}:processing:"
        self._claims_prefix = f"{tag}:claims:"

    # -- keys -------------------------------------------------------------

    def processing_key(self, worker_id: str) -> str:
        return self._processing_prefix + worker_id

    def claims_key(self, worker_id: str) -> str:
        return self._claims_prefix + worker_id

    def ready_key(self, priority: str) -> str:
        return self.ready_keys[PRIORITY_INDEX[priority] - 1]

    def _keys(self, worker_id: str | None = None) -> list[str]:
        keys = [
            self.queued_key,
            self.scheduled_key,
            *self.ready_keys,
            self.workers_key,
            self.dead_key,
            self.wake_key,
        ]
        if worker_id is not None:
            keys += [self.processing_key(worker_id), self.claims_key(worker_id)]
        return keys

    def _script(self, name: str) -> Callable[..., Any]:
        # Script objects use EVALSHA and reload on NOSCRIPT, so they survive a
        # Redis restart that forgot the script cache. A caller may still pass
        # its own client= (a pipeline).
        return partial(shared_script(name), client=self.redis)

    def script(self, name: str) -> Callable[..., Any]:
        """The Lua script ``outbox/queue/lua/<name>.lua``, called on this connection."""
        return self._script(name)

    def time(self) -> float:
        """Redis' clock, epoch seconds: the one clock of every queue decision."""
        # On a cluster, from the primary that runs the scripts (their clock).
        target = slot_target(self.redis, self.queued_key)
        seconds, micros = cast(tuple[int, int], self.redis.time(**target))
        return seconds + micros / 1_000_000

    # -- producers ----------------------------------------------------------

    def push(self, entries: Sequence[QueueEntry], *, force: bool = False) -> int:
        """Mirror rows into Redis; returns how many ids were new to the dedup set.

        Due ids (by Redis time) go to their ready list, later ones to
        ``scheduled``; a scheduled entry of the id is always moved to the
        given due time. Without ``force`` an id already in the dedup set is
        not pushed again. ``force`` is for ids known to wait nowhere (out of a
        processing list, or found missing by a full check). Large batches go
        in chunks, one pipeline; one chunk goes by :mod:`outbox.queue.direct`.
        """
        if not entries:
            return 0
        keys = self._keys()
        flag = 1 if force else 0
        if len(entries) <= PUSH_CHUNK and self._direct is not None:
            pushed = self._direct.evalsha(PUSH, keys, [flag, *entry_args(entries)])
            if pushed is not None:
                return int(pushed)
        script = self._script("push")
        if len(entries) <= PUSH_CHUNK or is_cluster(self.redis):
            # A cluster pipeline cannot reload a script its node forgot (after
            # a failover): there, one call per chunk.
            return sum(
                int(script(keys=keys, args=[flag, *entry_args(entries[i : i + PUSH_CHUNK])]))
                for i in range(0, len(entries), PUSH_CHUNK)
            )
        pipe = self.redis.pipeline(transaction=False)
        for start in range(0, len(entries), PUSH_CHUNK):
            chunk = entries[start : start + PUSH_CHUNK]
            script(keys=keys, args=[flag, *entry_args(chunk)], client=pipe)
        return sum(int(n) for n in pipe.execute())

    # -- workers ------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        count: int,
        *,
        thread: int = 0,
        nonce: str = "",
        acks: Sequence[int] = (),
        share: int = 1,
    ) -> ClaimResult:
        """Forget ``acks``, promote due ids, then claim up to ``count`` ids.

        One round trip. With ``share`` > 1 (the caller's threads), at most
        ceil(ready / share) of them, and at least one (``lua/claim.lua``).
        Claimed ids sit in the incarnation's processing list until
        acknowledged, so a crash leaves them for the sweeper. Calling
        again with the same ``thread`` and ``nonce`` after an error returns
        the ids of the call whose reply was lost instead of claiming more;
        without a nonce every call claims anew.
        """
        raw = self._script("claim")(
            keys=[*self._keys(worker_id), self.control_key],
            args=[worker_id, count, PROMOTE_LIMIT, thread, nonce, share, ",".join(map(str, acks))],
        )
        if not int(raw[1]):
            return ClaimResult(float(raw[0]), False, [])
        flat = [decode(v) for v in raw[2]]
        control = dict(zip(flat[::2], flat[1::2], strict=True))
        taken = decode(raw[3]).split(",") if raw[3] else []
        items = [
            Claimed(int(taken[i]), PRIORITY_NAME[int(taken[i + 1])])
            for i in range(0, len(taken), 2)
        ]
        next_due = None
        if len(raw) > 4:
            next_due = float(decode(raw[4])) if raw[4] else math.inf
        return ClaimResult(float(raw[0]), True, items, control, next_due)

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until ids may be ready; True if woken.

        Only a wake-up token is taken here; the claim that follows is a script,
        so no id ever sits between a list and the dedup set's bookkeeping.
        """
        # A BLPOP longer than the client's socket timeout would be cut by the
        # client ("Timeout reading from socket"): wait less and let the caller
        # look again, leaving a second (or half the limit) for the reply.
        limit = socket_timeout(self.redis)
        if limit is not None:
            timeout = min(timeout, max(limit - 1.0, limit / 2))
        # BLPOP takes a fractional timeout (Redis >= 6); redis-py types it as int.
        return self.redis.execute_command("BLPOP", self.wake_key, timeout) is not None

    def give_back(
        self,
        worker_id: str,
        entries: Sequence[QueueEntry],
        acks: Sequence[int] = (),
        deregister: bool = False,
    ) -> int:
        """Put claimed-but-unstarted ids back; optionally deregister the worker.

        Deregistering never deletes ids still in the processing list: the
        incarnation is then declared dead so that the sweeper settles them.
        """
        given = int(
            self._script("give_back")(
                keys=self._keys(worker_id),
                args=[worker_id, 1 if deregister else 0, len(acks), *acks, *entry_args(entries)],
            )
        )
        if deregister:  # no longer live: its level says nothing more
            self.redis.hdel(self.releases_key, worker_id)
        return given

    def register(self, worker_id: str) -> float:
        """Register an incarnation, with this release's level; returns Redis time.

        The level first: a registered incarnation of this release always has
        it (:meth:`earlier_releases`).
        """
        self.redis.hset(self.releases_key, worker_id, RELEASE_LEVEL)
        return float(self._script("register")(keys=self._keys(), args=[worker_id]))

    def heartbeat(self, worker_id: str) -> tuple[float, bool]:
        """Refresh the heartbeat; returns Redis time and whether the incarnation lives.

        False means it was declared dead (or Redis lost its entry).
        """
        now, alive = self._script("heartbeat")(keys=self._keys(), args=[worker_id])
        return float(now), bool(int(alive))

    # -- sweeper ------------------------------------------------------------

    def declare_dead(self, timeout: float) -> list[str]:
        """Declare dead every incarnation silent for ``timeout`` seconds of Redis time."""
        raw = self._script("declare_dead")(keys=self._keys(), args=[timeout])
        return [decode(w) for w in raw]

    def dead_workers(self) -> list[str]:
        members = cast(list[bytes], self.redis.zrange(self.dead_key, 0, -1))
        return [decode(w) for w in members]

    def live_workers(self) -> dict[str, float]:
        """Registered incarnations and their last heartbeat (Redis time)."""
        pairs = cast(
            list[tuple[bytes, float]], self.redis.zrange(self.workers_key, 0, -1, withscores=True)
        )
        return {decode(w): float(score) for w, score in pairs}

    def mirror_state(self) -> dict[str, str]:
        """The sweeper's bookkeeping hash, decoded."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.mirror_key))
        return {decode(k): decode(v) for k, v in raw.items()}

    def held_watch(self) -> dict[int, float]:
        """Queued rows seen in a live processing list by the last pass -> first seen."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.mirror_held_key))
        return {int(k): float(v) for k, v in raw.items()}

    def set_held_watch(self, watch: dict[int, float]) -> None:
        """Replace the watch list with ``watch`` (one transaction)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.mirror_held_key)
        if watch:
            pipe.hset(self.mirror_held_key, mapping={str(k): v for k, v in watch.items()})
        pipe.execute()

    def processing_ids(self, worker_id: str) -> list[int]:
        return [int(i) for i in self.redis.lrange(self.processing_key(worker_id), 0, -1)]

    def reap(self, worker_id: str, requeue: Sequence[QueueEntry]) -> int:
        """Push back ``requeue`` and forget the dead incarnation's list, entry and level."""
        pushed = int(
            self._script("reap")(keys=self._keys(worker_id), args=[worker_id, *entry_args(requeue)])
        )
        self.redis.hdel(self.releases_key, worker_id)
        return pushed

    def earlier_releases(self) -> list[str]:
        """Live incarnations of a release below :data:`RELEASE_LEVEL` (none announced).

        One round trip, one snapshot: the registered incarnations and the
        levels announced, read in a MULTI.
        """
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrange(self.workers_key, 0, -1)
        pipe.hgetall(self.releases_key)
        live, levels = cast(tuple[list[bytes], dict[bytes, bytes]], pipe.execute())
        return [decode(w) for w in live if release_level(levels.get(w)) < RELEASE_LEVEL]

    def waiting_ids(self) -> set[int]:
        """Every id in a ready list or ``scheduled``, read page by page.

        The full mirror check's view of what Redis really holds: it does not
        trust the dedup set.
        """
        found: set[int] = set()
        for key in self.ready_keys:
            start = 0
            while page := self.redis.lrange(key, start, start + SCAN_PAGE - 1):
                found.update(int(i) for i in page)
                start += SCAN_PAGE
        start = 0
        while members := cast(
            list[bytes], self.redis.zrange(self.scheduled_key, start, start + SCAN_PAGE - 1)
        ):
            found.update(int(decode(m).partition(":")[0]) for m in members)
            start += SCAN_PAGE
        return found

    def queued_set(self) -> set[int]:
        """The dedup set's members."""
        return {int(i) for i in self.redis.sscan_iter(self.queued_key, count=SCAN_PAGE)}

    def forget_stale(self, ids: Sequence[int]) -> int:
        """Drop ids that wait nowhere from the dedup set; returns how many."""
        dropped = 0
        for start in range(0, len(ids), PUSH_CHUNK):
            chunk = list(ids[start : start + PUSH_CHUNK])
            dropped += int(self._script("forget_stale")(keys=self._keys(), args=chunk))
        return dropped

    def set_exceeds_lists(self) -> bool:
        """Whether the dedup set counts more ids than the lists hold: partial data loss.

        Duplicates only ever make the lists longer than the set, so a set that
        is larger names ids that wait nowhere. One cheap pipeline.
        """
        pipe = self.redis.pipeline(transaction=False)
        pipe.scard(self.queued_key)
        pipe.zcard(self.scheduled_key)
        for key in self.ready_keys:
            pipe.llen(key)
        card, *lengths = (int(n) for n in pipe.execute())
        return card > sum(lengths)

    def acquire_lock(self, token: str, ttl: float) -> bool:
        return bool(self.redis.set(self.lock_key, token, nx=True, px=int(ttl * 1000)))

    def extend_lock(self, token: str, ttl: float) -> bool:
        return bool(
            self._script("lock_extend")(keys=[self.lock_key], args=[token, int(ttl * 1000)])
        )

    def release_lock(self, token: str) -> bool:
        return bool(self._script("lock_release")(keys=[self.lock_key], args=[token]))

    def promote(self, limit: int = 10_000) -> int:
        """Move due ids (by Redis time) from ``scheduled`` to the ready lists."""
        return int(self._script("promote")(keys=self._keys(), args=[limit]))

    # -- introspection --------------------------------------------------------

    def ready_lengths(self) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for key in self.ready_keys:
            pipe.llen(key)
        return dict(zip(PRIORITIES, (int(n) for n in pipe.execute()), strict=True))

    def scheduled_length(self) -> int:
        return int(self.redis.zcard(self.scheduled_key))

    def next_scheduled_at(self) -> float:
        """When the earliest id in ``scheduled`` falls due (Redis time); math.inf if none is."""
        first = self.redis.zrange(self.scheduled_key, 0, 0, withscores=True)
        return float(first[0][1]) if first else math.inf

    def queued_count(self) -> int:
        return int(self.redis.scard(self.queued_key))
