"""The dashboard part's table: a million deliveries in a realistic mix, in SQL (PostgreSQL).

Every block of 10,000 consecutive numbers of ``generate_series`` gets the same
mix, so any size keeps the proportions (a million rows: 4,800 queued, just under
:data:`outbox.status.snapshot.COMPARE_LIMIT`, so the id-by-id comparison with Redis is
part of what is timed):

====================  =======  ===================================================
status                share    times
====================  =======  ===================================================
sent                  97.69 %  sent over the last 30 days, evenly (some every minute)
failed                1.5 %    last changed over the last 30 days
cancelled             0.3 %    last changed over the last 30 days
abandoned             0.02 %   a day ago
processing            0.01 %   claimed a few seconds ago
queued, due           0.24 %   due for up to 10 minutes (a backlog)
queued, scheduled     0.24 %   due in the next 2 days
====================  =======  ===================================================

Priorities: 10 % high, 80 % normal, 10 % low. All rows share one email.
"""

from __future__ import annotations

from typing import Any

from tests.benchmark.common import BODY, SENDER

# The slice of each row is k = g % 10000 (its status); its time offset f spreads
# rows evenly over their window.
INSERT = """
INSERT INTO outbox_delivery (email_id, recipient, status, priority, attempts, max_attempts,
    not_before, worker_id, claim_token, processing_started_at, sent_at, message_id,
    last_error, idempotency_key, created_at, updated_at)
SELECT %(email)s, 'r' || g || '@example.com', s.status,
    CASE WHEN g %% 10 = 0 THEN 'high' WHEN g %% 10 = 1 THEN 'low' ELSE 'normal' END,
    CASE WHEN s.status IN ('sent', 'queued', 'cancelled') THEN 1 ELSE 3 END, 5,
    s.not_before,
    CASE WHEN s.status IN ('processing', 'abandoned') THEN 'bench-worker-' || g %% 4 ELSE '' END,
    CASE WHEN s.status IN ('processing', 'abandoned') THEN gen_random_uuid() END,
    CASE WHEN s.status IN ('processing', 'abandoned') THEN s.changed END,
    CASE WHEN s.status = 'sent' THEN s.changed END,
    '<bench.' || g || '@example.com>',
    CASE WHEN s.status = 'failed' THEN '550 mailbox unavailable' ELSE '' END,
    NULL, s.changed - interval '1 minute', s.changed
FROM generate_series(%(start)s + 1, %(start)s + %(n)s) AS g,
-- f in [0, 1): a permutation of g, so that every status has rows at every age.
LATERAL (SELECT g %% 10000 AS k, ((g::bigint * 2654435761) %% %(n)s)::float8 / %(n)s AS f) AS p,
LATERAL (
    SELECT
        CASE WHEN k < 150 THEN 'failed' WHEN k < 180 THEN 'cancelled'
             WHEN k < 182 THEN 'abandoned' WHEN k < 183 THEN 'processing'
             WHEN k < 231 THEN 'queued' ELSE 'sent' END AS status,
        CASE WHEN k < 180 OR k >= 231 THEN %(now)s - f * interval '30 days'
             WHEN k < 182 THEN %(now)s - interval '1 day'
             WHEN k < 183 THEN %(now)s - f * interval '5 seconds'
             ELSE %(now)s - interval '10 minutes' END AS changed,
        CASE WHEN k < 183 OR k >= 231 THEN %(now)s - f * interval '30 days' - interval '1 minute'
             WHEN k < 207 THEN %(now)s - f * interval '10 minutes'
             ELSE %(now)s + interval '1 minute' + f * interval '2 days' END AS not_before
) AS s
"""


def insert_deliveries(cursor: Any, n: int, now: Any, start: int = 0, analyze: bool = True) -> None:
    """``n`` deliveries in the mix above (one email), numbered from ``start + 1``; then
    VACUUM ANALYZE, unless told not to (to see how far the estimate drifts before autovacuum)."""
    cursor.execute(
        "INSERT INTO outbox_email (subject, body, html_message, from_email, reply_to,"
        " headers, created_at) VALUES ('Your order has shipped', %s, '', %s, '[]', '{}',"
        " %s - interval '30 days') RETURNING id",
        [BODY, SENDER, now],
    )
    email = cursor.fetchone()[0]
    cursor.execute(INSERT, {"email": email, "n": n, "start": start, "now": now})
    if analyze:
        cursor.execute("VACUUM ANALYZE outbox_delivery")
        cursor.execute("VACUUM ANALYZE outbox_email")
