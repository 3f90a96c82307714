"""The admin scale part's history, in SQL (PostgreSQL): emails, deliveries, one attempt each.

:func:`insert_history` adds ``n`` rows of history spread evenly over the last
:data:`DAYS` days, each an email of its own with one delivery and one
attempt, in this mix (every block of 1,000 consecutive numbers gets the same
mix, so any size keeps the proportions):

==========  =======  ====================================================
status      share    times
==========  =======  ====================================================
sent        97.9 %   sent over the last 120 days (at 5,000,000 rows,
                     about 29 a minute; at 10,000, one every 17 minutes)
failed      1.6 %    failed over the same days, ``550`` in ``last_error``
cancelled   0.5 %    cancelled over the same days
==========  =======  ====================================================

and :func:`insert_live` the rows of a running outbox, the same number
whatever the history: :data:`LIVE` queued (half due for up to ten minutes,
half due within two days), processing and abandoned rows. So the two sizes
differ only in their history, and every answer except the history's counts
(and the chart, which shows the last hour of it) must come out the same.

Priorities: 10 % high, 80 % normal, 10 % low. Recipients are
``customer<g>@shop<g % 50>.example``.
"""

from __future__ import annotations

import time
from typing import Any

DAYS = 120
# The live rows: (status, rows).
LIVE = (("queued-due", 2_000), ("queued-scheduled", 2_000), ("processing", 20), ("abandoned", 30))

EMAILS = """
INSERT INTO outbox_email (id, subject, body, html_message, from_email, reply_to, headers,
    created_at, mailer)
SELECT g, 'Your order #' || g || ' has shipped', 'Hello, your order is on its way.', '',
    'shop@example.com', '[]', '{}', %(now)s - (%(total)s - g)::float8 / %(total)s * %(days)s
        * interval '1 day', ''
FROM generate_series(%(start)s + 1, %(end)s) AS g
"""

# f in (0, 1]: how far back in the window row g lies (the newest row is f = 0).
DELIVERIES = """
INSERT INTO outbox_delivery (id, email_id, recipient, status, priority, attempts,
    max_attempts, not_before, worker_id, claim_token, processing_started_at, sent_at,
    message_id, last_error, idempotency_key, created_at, updated_at)
SELECT g, g, 'customer' || g || '@shop' || g %% 50 || '.example', s.status,
    CASE WHEN g %% 10 = 0 THEN 'high' WHEN g %% 10 = 1 THEN 'low' ELSE 'normal' END,
    s.attempts, 5, s.not_before, s.worker, s.token,
    CASE WHEN s.token IS NOT NULL THEN s.changed END,
    CASE WHEN s.status = 'sent' THEN s.changed END,
    '<' || g || '.scale@shop.example>',
    CASE WHEN s.status = 'failed' THEN '550 5.1.1 mailbox unavailable' ELSE '' END,
    NULL, s.not_before - interval '1 second', s.changed
FROM generate_series(%(start)s + 1, %(end)s) AS g,
-- k: a multiple of g, so that the rare statuses are spread over every page of the table.
LATERAL (SELECT (g * 37) %% 1000 AS k) AS p,
LATERAL (SELECT %(now)s - (%(total)s - g)::float8 / %(total)s * %(days)s * interval '1 day'
    AS t) AS w,
LATERAL (
    SELECT
        CASE WHEN %(live)s <> '' THEN %(live)s
             WHEN k < 16 THEN 'failed' WHEN k < 21 THEN 'cancelled' ELSE 'sent' END AS status
) AS v,
LATERAL (
    SELECT
        CASE WHEN v.status = 'queued-due' THEN 'queued'
             WHEN v.status = 'queued-scheduled' THEN 'queued' ELSE v.status END AS status,
        CASE WHEN v.status IN ('sent', 'cancelled') THEN 1
             WHEN v.status LIKE 'queued%%' THEN 0 ELSE 3 END AS attempts,
        CASE WHEN v.status = 'queued-due' THEN %(now)s - (g %% 600) * interval '1 second'
             WHEN v.status = 'queued-scheduled' THEN %(now)s + interval '1 minute'
                 + (g %% 2880) * interval '1 minute'
             WHEN v.status = 'processing' THEN %(now)s - interval '5 seconds'
             WHEN v.status = 'abandoned' THEN %(now)s - interval '1 day'
             ELSE w.t - interval '2 seconds' END AS not_before,
        CASE WHEN v.status LIKE 'queued%%' THEN %(now)s - interval '10 minutes'
             WHEN v.status = 'processing' THEN %(now)s - interval '4 seconds'
             WHEN v.status = 'abandoned' THEN %(now)s - interval '1 day'
             ELSE w.t END AS changed,
        CASE WHEN v.status IN ('processing', 'abandoned') THEN 'scale-worker-' || g %% 2
             ELSE '' END AS worker,
        CASE WHEN v.status IN ('processing', 'abandoned') THEN gen_random_uuid() END AS token
) AS s
"""

ATTEMPTS = """
INSERT INTO outbox_attempt (delivery_id, number, worker_id, claim_token, started_at,
    finished_at, outcome, error, actor)
SELECT id, 1, 'scale-worker-' || id %% 2, gen_random_uuid(), updated_at - interval '1 second',
    updated_at, CASE WHEN status = 'sent' THEN 'sent' WHEN status = 'failed' THEN 'failed'
        WHEN status = 'cancelled' THEN 'cancelled' ELSE 'retry' END,
    last_error, 'scale-worker-' || id %% 2
FROM outbox_delivery WHERE id > %(start)s AND id <= %(end)s AND status <> 'queued'
"""


def insert_rows(cursor: Any, start: int, n: int, total: int, now: Any, live: str = "") -> None:
    """Rows ``start + 1`` to ``start + n`` of ``total``: history, or one live kind of :data:`LIVE`.

    History row ``g`` lies ``(total - g) / total`` of :data:`DAYS` back.
    """
    params = {
        "start": start,
        "end": start + n,
        "total": max(total, 1),
        "days": DAYS if not live else 0,
        "now": now,
        "live": live,
    }
    cursor.execute(EMAILS, params)
    cursor.execute(DELIVERIES, params)
    cursor.execute(ATTEMPTS, params)


def insert_history(cursor: Any, n: int, now: Any, batch: int = 1_000_000) -> dict[str, float]:
    """``n`` history rows, then the live rows of :data:`LIVE` after them; ids from 1.

    The tables are filled without their secondary indexes and unique
    constraints, which are then built again from their own definitions (a
    fresh index is denser than one grown row by row, so reads are a little
    cheaper than on a table of the same size grown by hand), and without the
    foreign keys' per-row checks (``session_replication_role``: the rows refer
    to each other by construction). In batches, so that one statement's work
    stays bounded; then the sequences move past the ids used, and VACUUM
    ANALYZE (as autovacuum would). Returns the seconds each index took to build.
    """
    dropped = _drop_secondary_indexes(cursor)
    cursor.execute("SET session_replication_role = replica")
    done = 0
    while done < n:
        size = min(batch, n - done)
        insert_rows(cursor, done, size, n, now)
        done += size
    start = n
    for live, rows in LIVE:
        insert_rows(cursor, start, rows, rows, now, live)
        start += rows
    cursor.execute("SET session_replication_role = DEFAULT")
    built = {}
    cursor.execute("SET maintenance_work_mem = '256MB'")
    for name, statement in dropped:
        started = time.perf_counter()
        cursor.execute(statement)
        built[name] = time.perf_counter() - started
    cursor.execute("RESET maintenance_work_mem")
    for table in TABLES:
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
        )
    for table in TABLES:
        cursor.execute(f"VACUUM ANALYZE {table}")
    return built


TABLES = ("outbox_email", "outbox_delivery", "outbox_attempt")


def _drop_secondary_indexes(cursor: Any) -> list[tuple[str, str]]:
    """Drop every index and unique constraint of :data:`TABLES` but the primary keys.

    Returns ``(name, statement)`` pairs that build each again, as it was.
    """
    cursor.execute(
        """
        SELECT c.conname, 'ALTER TABLE ' || c.conrelid::regclass || ' ADD CONSTRAINT '
            || quote_ident(c.conname) || ' ' || pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        WHERE c.conrelid::regclass::text = ANY(%s) AND c.contype = 'u'
        """,
        [list(TABLES)],
    )
    constraints = cursor.fetchall()
    cursor.execute(
        """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i
        WHERE i.indrelid::regclass::text = ANY(%s) AND NOT i.indisprimary
            AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
        """,
        [list(TABLES)],
    )
    indexes = cursor.fetchall()
    for name, statement in constraints:
        table = statement.split()[2]
        cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for name, _statement in indexes:
        cursor.execute(f"DROP INDEX {name}")
    return [*constraints, *indexes]
