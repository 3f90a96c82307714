"""``outbox_sent_total`` without counting the whole history on every scrape.

A Prometheus counter must only go up, and must survive restarts: so it is
taken from the database, not from a process. But counting the sent rows takes
about 100 ms per million (every entry of the partial index on ``sent_at``),
and the table is mostly sent rows. So the count is kept as a *checkpoint* in
Redis (``{prefix}:sent-total``, a hash: ``since``, epoch seconds, and
``base``, the sent rows with ``sent_at`` before it), and each scrape counts
only the rows sent since the checkpoint, a range of that index::

    sent_total = base + count(sent rows with sent_at >= since)

and moves the checkpoint to :data:`SETTLE` before now, adding the rows in
between to ``base``. Why this is right:

- A sent row never changes status again, and its ``sent_at`` is the time of
  its send (Redis time, or the operator's "mark sent"). A row is committed
  within moments of that time (the worker writes it right after the send, or
  with its next claim), far less than :data:`SETTLE`: so no row can appear
  behind the checkpoint once it has moved past it. The checkpoint is placed
  by Redis' clock too (an operator's "mark sent" uses the web server's clock,
  which NTP keeps far closer than :data:`SETTLE`).
- The two fields are written together in one ``HSET``. Two scrapers at once
  may write checkpoints of different ages; each pair is consistent on its own,
  and whichever stays, the next scrape counts on from it. No lock is needed.
- Rows deleted behind the checkpoint (``outbox_sweep --purge-sent-days``) stay
  counted: the counter says how many were ever sent, as a counter should.

The checkpoint is a cache of the database, like everything in Redis here. When
it is missing (the first scrape, or Redis lost its data) the first scrape
counts every sent row once; if rows were purged meanwhile the counter comes
out lower than before, which Prometheus reads as a reset (``rate()`` copes).
No writer on the hot path is involved: the worker never touches the key.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import Count, Q

from ..models import Delivery
from ..queue.reliable import RedisQueue

# How far behind now the checkpoint stays; see the module docstring.
SETTLE = timedelta(minutes=10)


def sent_total(queue: RedisQueue) -> int:
    """How many deliveries were ever sent (see the module docstring).

    One query, and two Redis round trips (the checkpoint and Redis' clock; then
    the new checkpoint).
    """
    key = queue.sent_total_key
    pipe = queue.redis.pipeline(transaction=False)
    pipe.hmget(key, ["since", "base"])
    pipe.time()
    (since_raw, base_raw), (seconds, _micros) = pipe.execute()
    since = None
    if since_raw is not None and base_raw is not None:
        since = datetime.fromtimestamp(int(since_raw), tz=UTC)
    base = int(base_raw) if since is not None and base_raw is not None else 0
    # Redis' clock, the one the worker stamps sent_at with, so that no other
    # machine's clock can move the checkpoint ahead of rows still to come.
    # Whole seconds: the boundary is stored exactly and read back the same.
    until = datetime.fromtimestamp(int(seconds), tz=UTC) - SETTLE
    rows = Delivery.objects.filter(status=Delivery.Status.SENT)
    if since is not None:
        rows = rows.filter(sent_at__gte=since)
    if since is not None and until <= since:
        return base + rows.count()
    counts = rows.aggregate(
        recent=Count("id", filter=Q(sent_at__gte=until)),
        settled=Count("id", filter=~Q(sent_at__gte=until)),
    )
    settled = base + counts["settled"]
    queue.redis.hset(key, mapping={"since": int(until.timestamp()), "base": settled})
    return settled + counts["recent"]
