"""The benchmark's scale check (PostgreSQL): our delivery rate with a large history.

Fills the Delivery table with old rows (99% sent, 1% failed, one Attempt each)
in SQL, then times a burst worker on fresh emails, and one full and one
incremental sweeper pass, once per history size.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tests.benchmark.common import BODY, PREPARED, PREPARED_ENV, SENDER, Row, run_timed


class ScaleMixin:
    """The scale part of the benchmark's ``Child`` (see child.py for the attributes)."""

    db: str
    repeat: int
    extra: dict[str, Any]

    def bench_scale(self) -> None:
        from outbox.sweeper import Sweeper

        n = self.sizes.scale_drain
        c = self.sizes.scale_concurrency
        py = [sys.executable, "-m", "django", "outbox_worker", "--burst", "--concurrency", str(c)]
        env = {**self.env("noop"), **PREPARED_ENV}
        self.extra["scale"] = {}
        for history in self.sizes.scale_history:
            self.reset()
            t0 = time.perf_counter()
            self.insert_history(history)
            self.log(f"scale: {history} history rows in {time.perf_counter() - t0:.1f}s")
            row = self.add(
                Row(
                    "scale",
                    self.db,
                    "outbox",
                    f"{history:,} rows in table, c{c}, {PREPARED}",
                    n,
                    ours=True,
                )
            )
            for i in range(self.repeat):
                self.seed("outbox", n, offset=(i + 1) * 10_000_000)
                from django.db import connection

                connection.close()
                elapsed, err = run_timed([py], env)
                row.times.append(elapsed)
                if err:
                    row.note = err
                self.log(f"scale {history}: {elapsed:.2f}s")
            full = Sweeper().run_pass(full_mirror_check=True)
            incremental = Sweeper().run_pass()
            self.extra["scale"][str(history)] = {
                "rows": self.count_rows(),
                "sweep_full_s": full.seconds,
                "sweep_incremental_s": incremental.seconds,
                "sweep_errors": full.errors + incremental.errors,
            }
            self.log(f"scale {history}: sweeper {full.seconds:.3f}s / {incremental.seconds:.3f}s")

    def count_rows(self) -> int:
        from outbox.models import Delivery

        return Delivery.objects.count()

    def insert_history(self, count: int) -> None:
        """count old deliveries (99% sent, 1% failed) and one attempt each, in SQL."""
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO outbox_email (subject, body, html_message, from_email, reply_to,"
                " headers, created_at) VALUES ('old newsletter', %s, '', %s, '[]', '{}',"
                " now() - interval '30 days') RETURNING id",
                [BODY, SENDER],
            )
            email_id = cur.fetchone()[0]
            cur.execute(
                """
                INSERT INTO outbox_delivery (email_id, recipient, recipient_key, status,
                    priority, attempts, max_attempts, not_before, worker_id, claim_token,
                    processing_started_at, sent_at, message_id, last_error, idempotency_key,
                    created_at, updated_at)
                SELECT %s, 'old' || g || '@example.com', 'old' || g || '@example.com',
                    CASE WHEN g %% 100 = 0 THEN 'failed' ELSE 'sent' END, 'normal', 1, 5,
                    t, 'old-worker', gen_random_uuid(), t,
                    CASE WHEN g %% 100 = 0 THEN NULL ELSE t END,
                    '<old' || g || '@example.com>', '', NULL, t, t
                FROM generate_series(1, %s) AS g,
                    LATERAL (SELECT now() - interval '30 days' + g * interval '1 second' AS t) AS x
                """,
                [email_id, count],
            )
            cur.execute(
                """
                INSERT INTO outbox_attempt (delivery_id, number, worker_id, claim_token,
                    started_at, finished_at, outcome, error, actor)
                SELECT id, 1, worker_id, claim_token, processing_started_at,
                    processing_started_at, CASE WHEN status = 'sent' THEN 'sent' ELSE 'failed' END,
                    '', worker_id
                FROM outbox_delivery
                """
            )
            cur.execute("VACUUM ANALYZE outbox_delivery")
            cur.execute("VACUUM ANALYZE outbox_attempt")
            cur.execute("VACUUM ANALYZE outbox_email")
