"""The one clock: Redis' ``TIME``, seen from a worker or sweeper host.

Every decision about time in the queue is made on one clock, so that a host
whose own clock is minutes off neither looks dead nor sends late:

- heartbeats, the dead-worker cutoff, claims and the promotion of scheduled ids
  are timed with Redis ``TIME`` inside the Lua scripts (``lua/_common.lua``);
- whether a row is due is decided in SQL with the database's own clock
  (``now()`` on PostgreSQL; SQLite has no server clock, so there Redis
  time is passed in, the clock that also promoted the id);
- times the worker and the sweeper write on rows (start of an attempt, retry
  time, sent time) and the sweeper's "stuck since" cutoff are Redis time too,
  read from the replies of the scripts above through :class:`RedisClock`, so
  they agree with each other whatever the host's clock says;
- times a web host writes (an enqueue, an operator's action) are the
  database's ``now()`` on PostgreSQL, and so is ``updated_at`` of a row the
  sweeper makes ``queued``: the sweeper's incremental mirror check
  compares ``updated_at`` with the database's clock (:class:`outbox.sweeper.mirror.Mirror`
  says why that clock, and what stands for it on SQLite).

Redis and the database are servers whose clocks an operator keeps in step
(NTP); hosts that run workers need not be.

The datetimes made here are what Django stores: aware UTC with ``USE_TZ =
True``, naive in ``TIME_ZONE`` without (SQLite refuses an aware datetime
then, and the ORM's naive values must compare with them), with ``fold`` set
in the hour the clocks go back, so that ``outbox.models.instant`` reads them
as the instant they are (``not_before`` and ``expires_at`` are stored in UTC).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone


class RedisClock:
    """This host's view of Redis' clock: the local clock plus the last seen offset.

    ``observe()`` is fed the Redis time that every claim and heartbeat reply
    carries; until the first reply the local clock is used as it is.
    """

    def __init__(self) -> None:
        self.offset = 0.0

    def observe(self, redis_now: float) -> None:
        # A float assignment is atomic in CPython: threads share one clock safely.
        self.offset = redis_now - time.time()

    def time(self) -> float:
        """Redis time now, epoch seconds."""
        return time.time() + self.offset

    def now(self) -> datetime:
        """Redis time now, as a datetime the way Django stores it (see above)."""
        return from_timestamp(self.time())


def from_timestamp(ts: float) -> datetime:
    """Epoch seconds as a datetime the way Django stores it (see above)."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    if settings.USE_TZ:
        return moment
    return timezone.make_naive(moment, timezone.get_default_timezone())
