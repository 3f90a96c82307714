"""The outbox at a glance: what ``manage.py outbox_status`` shows.

:func:`collect` takes one snapshot of the database and of Redis and returns a
dict that ``outbox_status --json`` prints as it is. Its keys are stable (new
keys may be added; none is renamed or removed without a new ``version``):

``version``
    ``1``.
``time``
    When the snapshot was taken: ISO 8601, UTC.
``valve``
    The staging valve (:mod:`outbox.mail.valve`), from this host's settings:
    ``on`` (bool: ``OUTBOX["ALLOWED_RECIPIENTS"]`` is set, so mail to other
    addresses is redirected or cancelled), ``allowed_recipients`` (the
    patterns, or ``null``) and ``redirect_to`` (``null`` when off or unset).
``database``
    ``ok`` (bool) and ``error`` (``null``, or why the database could not be
    read; the other keys are then missing, except ``not_migrated``: true when
    the database answered but the outbox's migrations are not all applied,
    false when it did not answer), and:

    ``by_status``
        ``{status: count}`` for every status (``queued``, ``processing``,
        ``sent``, ``failed``, ``abandoned``, ``cancelled``). Exact, except
        ``sent`` when ``estimated`` lists it.
    ``by_priority``
        ``{priority: {status: count}}`` for ``high``, ``normal``, ``low``;
        ``sent`` is ``null`` in each when it is estimated.
    ``estimated``
        The statuses whose count is an estimate: ``[]``, or ``["sent"]`` on
        PostgreSQL once the table holds :data:`ESTIMATE_ABOVE` sent rows or
        more (see :func:`_sent_count`). Every other number is an exact count,
        read through a partial index that holds only the rows it counts.
    ``due``
        Queued rows whose send time has come.
    ``scheduled``
        Queued rows that wait (``send_at``, or a retry's backoff).
    ``oldest_due_age``
        Seconds since the longest-waiting due row became due (its
        ``not_before``), or ``null`` when nothing is due.
    ``sent_last_minute``, ``sent_last_hour``
        Rows sent in the last 60 and 3600 seconds.
``redis``
    ``ok`` (bool) and ``error`` (``null``, or why Redis could not be read;
    the other keys are then missing), and:

    ``ready``
        ``{priority: length}`` of the ready lists.
    ``scheduled``
        Size of the scheduled sorted set.
    ``workers``
        Registered workers, oldest heartbeat first: ``{"id", "heartbeat_age"
        (seconds), "alive" (heartbeat within HEARTBEAT_TIMEOUT), "held" (ids in
        its processing list: claimed, being sent, or sent but not yet
        acknowledged)}``.
    ``dead_workers``
        Workers the sweeper declared dead and has not cleaned up yet:
        ``{"id", "held"}``.
    ``control``
        The pause switches (``outbox.queue.control.state()``): ``known`` (false:
        Redis holds no switches, because nothing has run yet or Redis lost
        them), ``paused``, ``paused_since``, ``paused_domains`` and
        ``slow_domains`` (``{domain: Redis time}``: since when / held until),
        and ``lost_at`` (when a worker found them lost and restored what it
        last saw; cleared by ``outbox_resume``); ``paused_mailers``
        (``{mailer alias, "" for the default: {"until", "since" (Redis
        times), "count" (pauses in a row), "why" (the ESP's refusal)}}``:
        mailers whose ESP refused their credential, kept after the pause
        ends until a send through the mailer succeeds); ``read_at``: Redis'
        time when they were read, which those times compare with.
    ``rate_limits``
        One entry per configured limit (``outbox.queue.ratelimit.usage()``):
        ``{"key", "limit", "used" (sends in the current period),
        "capacity", "held" (rows waiting for a slot it reserved),
        "next_free_in" (seconds)}``.
    ``failures``
        The failure alarm (``outbox.queue.alarm``): its rule, ``window``
        (seconds), ``min_failures`` and ``share`` (the settings
        ``FAILURE_ALARM_*`` of the host that reads it), and ``mailers``:
        ``{mailer alias, "" for the default: {"alarm" (bool: its failed
        attempts in the window reach both min_failures and share of its
        attempts), "attempts" and "failed" (in the window, by all workers),
        "cause" (the most frequent cause of those failures, addresses
        removed; "" if none), "since" (Redis time the alarm began, or
        null)}}`` for every mailer with attempts in the window or an alarm.
``agreement``
    Whether Redis agrees with the database: ``null`` when either could not be
    read, else ``{"ready": {...}, "scheduled": {...}}``, each with

    ``agrees``
        ``true``/``false``, or ``null`` when there were more than
        :data:`COMPARE_LIMIT` queued rows, or ids in Redis, to compare one by
        one (then ``missing`` and ``stale`` are ``null`` too, ``limit`` says
        how many; only the counts below are read).
    ``database``, ``redis``
        The counts on each side: for ``ready``, due rows and ids in the ready
        lists; for ``scheduled``, waiting rows and the scheduled set's size.
        They differ in ordinary operation (claimed ids, due rows not promoted
        yet, stale ids), so equal counts prove nothing and unequal ones
        nothing either: they say how big each side is.
    ``missing``
        Rows the database has that Redis does not: for ``ready``, due queued
        rows that are in no ready list, no worker's processing list and not
        in the scheduled set (from which the next claim promotes them); for
        ``scheduled``, waiting queued rows in none of these. No worker sends
        them until they are pushed to Redis again, which the sweeper's mirror
        check does. An ordinary pass pushes the queued rows that changed
        since the previous pass, skipping ids that Redis' ``queued`` set (the
        gate against pushing an id twice) lists as waiting. A full check pushes
        every queued row that is in no ready list, not in the scheduled set
        and in no live worker's processing list, whatever that set says; it
        runs on ``outbox_sweep --full-mirror-check``, every
        ``MIRROR_FULL_SCAN_INTERVAL`` seconds, and when the sweeper sees that
        Redis lost data (its marker key is gone, or the set counts more ids
        than the lists hold). A row that went missing without changing, and
        without such a sign, waits for the next full check.
    ``stale``
        Ids Redis holds for rows that are not waiting there any more. They
        are harmless: a worker that claims one changes nothing and drops it
        (or, for a queued row that is not due yet, moves it to the scheduled
        set). For ``ready``, ids in a ready list whose row is not due and
        queued; for ``scheduled``, members whose row is not queued.

    While mail flows a few ids can disagree for a moment (a row committed
    between the two reads): alert on disagreement that lasts.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import BooleanField, Count, ExpressionWrapper, Min, Q
from django.utils import timezone

from ..conf import PRIORITIES
from ..db import database_problem
from ..mail import valve
from ..models import Delivery, outbox_alias
from ..queue.reliable import RedisQueue
from .live import agreement_of, not_compared, read_redis

VERSION = 1
# Above this many queued rows (or ids in Redis), agreement is not computed id
# by id: that reads every queued id from the database and from Redis, about
# 4 ms per 1,000 (most of it redis-py parsing the replies), which would take
# the dashboard past its budget of 200 ms. Only the counts are reported then.
COMPARE_LIMIT = 5_000
# On PostgreSQL, sent rows are estimated, not counted, from this many on.
ESTIMATE_ABOVE = 100_000
STATUSES: tuple[str, ...] = tuple(Delivery.Status.values)

Status = Delivery.Status
# Every status but sent, grouped as the partial indexes of Delivery cover them.
_INDEXED_GROUPS: tuple[tuple[str, ...], ...] = (
    (Status.QUEUED,),
    (Status.PROCESSING,),
    (Status.FAILED, Status.ABANDONED, Status.CANCELLED),
)
# The planner's row estimate: reltuples per page at the last VACUUM/ANALYZE,
# times the pages the table has now. NULL when it was never analysed
# (reltuples is -1 from PostgreSQL 14 on, 0 with no pages before that).
ESTIMATE_SQL = """
SELECT CASE
    WHEN reltuples < 0 OR (relpages = 0 AND reltuples = 0) THEN NULL
    WHEN relpages = 0 THEN reltuples
    ELSE reltuples / relpages
        * (pg_relation_size(oid) / current_setting('block_size')::integer)
END
FROM pg_class WHERE oid = to_regclass(%s)
"""


def collect(queue: RedisQueue | None = None, now: datetime | None = None) -> dict[str, Any]:
    """One snapshot of the outbox (see the module docstring for the keys)."""
    now = now or timezone.now()
    database, db_ids = _database(now)
    redis_part, redis_ids = read_redis(
        queue, now.timestamp(), compare=db_ids is not None, limit=COMPARE_LIMIT
    )
    agreement = None
    if database["ok"] and redis_part["ok"]:
        if db_ids is not None and redis_ids is not None:
            agreement = agreement_of(db_ids, redis_ids)
        else:
            agreement = {
                "ready": not_compared(COMPARE_LIMIT),
                "scheduled": not_compared(COMPARE_LIMIT),
            }
        agreement["ready"].update(database=database["due"], redis=sum(redis_part["ready"].values()))
        agreement["scheduled"].update(database=database["scheduled"], redis=redis_part["scheduled"])
    return {
        "version": VERSION,
        "time": now.isoformat(),
        "valve": valve.state(),
        "database": database,
        "redis": redis_part,
        "agreement": agreement,
    }


# -- the database ---------------------------------------------------------------


def _database(now: datetime) -> tuple[dict[str, Any], dict[str, set[int]] | None]:
    try:
        return _read_database(now)
    except Exception as exc:  # report it; the Redis part may still be useful
        error = f"{type(exc).__name__}: {exc}"
        problem = database_problem(outbox_alias()) if isinstance(exc, DatabaseError) else None
        if problem is not None and problem.kind == "not migrated":
            return {"ok": False, "error": str(problem), "not_migrated": True}, None
        return {"ok": False, "error": error, "not_migrated": False}, None


def _read_database(now: datetime) -> tuple[dict[str, Any], dict[str, set[int]] | None]:
    by_priority: dict[str, dict[str, int | None]] = {
        p: dict.fromkeys(STATUSES, 0) for p in PRIORITIES
    }
    by_status = dict.fromkeys(STATUSES, 0)
    for status, priority, count in _small_counts():
        by_status[status] += count
        by_priority.setdefault(priority, dict.fromkeys(STATUSES, 0))[status] = count
    sent, sent_by_priority = _sent_count(sum(by_status.values()))
    by_status[Status.SENT] = sent
    for priority, counts in by_priority.items():
        counts[Status.SENT] = (
            None if sent_by_priority is None else sent_by_priority.get(priority, 0)
        )
    queued = Delivery.objects.queued()
    due_q = Q(not_before__lte=now)
    # Index-only over the partial index of queued rows (not_before, id).
    waiting = queued.aggregate(
        due=Count("id", filter=due_q),
        scheduled=Count("id", filter=~due_q),
        oldest=Min("not_before", filter=due_q),
    )
    # A range of the partial index of sent rows by sent_at: the last hour only.
    recent = Delivery.objects.filter(
        status=Status.SENT, sent_at__gte=now - timedelta(hours=1)
    ).aggregate(
        minute=Count("id", filter=Q(sent_at__gte=now - timedelta(minutes=1))),
        hour=Count("id"),
    )
    oldest = waiting["oldest"]
    report = {
        "ok": True,
        "error": None,
        "by_status": by_status,
        "by_priority": by_priority,
        "estimated": [] if sent_by_priority is not None else [Status.SENT.value],
        "due": waiting["due"],
        "scheduled": waiting["scheduled"],
        "oldest_due_age": None if oldest is None else round((now - oldest).total_seconds(), 3),
        "sent_last_minute": recent["minute"],
        "sent_last_hour": recent["hour"],
    }
    if waiting["due"] + waiting["scheduled"] > COMPARE_LIMIT:
        return report, None
    ids: dict[str, set[int]] = {"due": set(), "scheduled": set()}
    # The database says which ids are due: a boolean reads three times faster
    # than a timestamp (the comparison is most of the page's time).
    is_due = ExpressionWrapper(due_q, output_field=BooleanField())
    for pk, due in queued.annotate(is_due=is_due).values_list("pk", "is_due"):
        ids["due" if due else "scheduled"].add(pk)
    return report, ids


def _small_counts() -> list[tuple[str, str, int]]:
    """``(status, priority, count)`` of every status but sent: one query.

    A ``UNION ALL`` of one grouped count per index, so that each part reads
    its own partial index (queued, processing, and the attention statuses);
    none of them grows with the history of sent mail. The attention statuses
    are read index-only (their index holds status and priority): they are
    history too (a failed row stays), spread over the whole table, and reading
    their rows from the table would cost a page per row. One condition ORed
    over the three indexes would read every one of those rows from the table.
    """
    first, *others = (
        Delivery.objects.filter(
            Q(status=statuses[0]) if len(statuses) == 1 else Q(status__in=statuses)
        )
        .order_by()
        .values_list("status", "priority")
        .annotate(n=Count("*"))
        for statuses in _INDEXED_GROUPS
    )
    rows = first.union(*others, all=True)
    return [(status, priority, n) for status, priority, n in rows]


def _sent_count(others: int) -> tuple[int, dict[str, int] | None]:
    """The sent rows: ``(count, {priority: count})``, or ``(estimate, None)``.

    Sent rows are the history: nearly the whole table, and no index makes
    counting them cheap (a million index entries take about 100 ms). On
    PostgreSQL, once the table's estimated size less the exact count of every
    other status reaches :data:`ESTIMATE_ABOVE`, that difference is the answer.
    The estimate is the planner's: ``pg_class.reltuples`` (live rows at the
    last VACUUM or ANALYZE) scaled to the table's current size in pages, as the
    planner itself does; it follows growth between autovacuum runs within a few
    per cent. Other databases, small tables, and tables never analysed are
    counted exactly, by priority.
    """
    estimate = _estimated_rows()
    if estimate is not None and estimate - others >= ESTIMATE_ABOVE:
        return estimate - others, None
    rows = Delivery.objects.filter(status=Status.SENT).order_by().values("priority")
    by_priority = {row["priority"]: row["n"] for row in rows.annotate(n=Count("id"))}
    return sum(by_priority.values()), by_priority


def _estimated_rows() -> int | None:
    """PostgreSQL's estimate of the rows in the Delivery table, or None (see :func:`_sent_count`)."""
    connection = connections[outbox_alias()]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(ESTIMATE_SQL, [connection.ops.quote_name(Delivery._meta.db_table)])
        row = cursor.fetchone()
    return None if row is None or row[0] is None else max(0, round(row[0]))
