"""The benchmark's dashboard part (PostgreSQL): what an operator's look costs at a million rows.

Fills the Delivery table in SQL (dashboard_data.py: 97 % sent over 30 days,
the rest queued, due, scheduled, processing, failed, abandoned, cancelled),
mirrors the queued rows into Redis with a full sweeper pass, registers the
workers that hold the processing rows, then times, warm (one untimed call
first), ``DASHBOARD_RUNS`` times each:

- ``GET /admin/outbox/dashboard/`` through Django's test client, as a
  logged-in superuser (middleware, session, template: the whole request);
- one metrics scrape, ``GET /outbox/metrics`` with the bearer token;
- ``manage.py outbox_status`` (``call_command``, text output).

It also checks what the dashboard reports against an exact ``GROUP BY`` (the
estimate's error, the counts that must be exact), and keeps the
``EXPLAIN (ANALYZE, BUFFERS)`` plan of every outbox query the page and the
scrape run.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

from tests.benchmark.dashboard_data import insert_deliveries

DASHBOARD_RUNS = 10
BUDGET_MS = 200.0
TOKEN = "bench-only-metrics-token"  # settings.py
TIMESTAMP = re.compile(r"'\d{4}-\d\d-\d\d[ T][0-9:.+-]+'(::timestamptz)?")


class DashboardMixin:
    """The dashboard part of the benchmark's ``Child`` (see child.py for the attributes)."""

    db: str
    extra: dict[str, Any]

    def bench_dashboard(self) -> None:
        from django.db import connection
        from django.utils import timezone

        n = self.sizes.dashboard_rows
        self.reset()
        t0 = time.perf_counter()
        with connection.cursor() as cursor:
            insert_deliveries(cursor, n, timezone.now())
        seeded = time.perf_counter() - t0
        self.log(f"dashboard: {n:,} deliveries in {seeded:.1f}s")
        sweep = self.mirror_into_redis()
        client = self.staff_client()
        result: dict[str, Any] = {"rows": n, "seed_s": seeded, "sweep": sweep}
        result["times"] = {
            "dashboard": self.time_calls(lambda: self.get(client, "/admin/outbox/dashboard/")),
            "metrics": self.time_calls(lambda: self.get(client, "/outbox/metrics", TOKEN)),
            "outbox_status": self.time_calls(outbox_status),
        }
        for name, times in result["times"].items():
            self.log(f"dashboard: {name} median {statistics.median(times[1:]) * 1000:.1f} ms")
        result["accuracy"] = self.accuracy()
        result["plans"] = self.plans(client)
        # Growth that autovacuum has not analysed yet (its default threshold is
        # 10 % of the table): how far does the estimate drift?
        with connection.cursor() as cursor:
            insert_deliveries(cursor, n // 20, timezone.now(), start=n, analyze=False)
        result["accuracy_after_growth"] = self.accuracy()
        result["growth"] = n // 20
        # Now over COMPARE_LIMIT queued rows: the page compares counts only.
        result["times"]["dashboard, after growth"] = self.time_calls(
            lambda: self.get(client, "/admin/outbox/dashboard/")
        )
        self.extra["dashboard"] = result

    # -- set-up -------------------------------------------------------------------

    def mirror_into_redis(self) -> str:
        """Workers that hold the processing rows, then a full sweeper pass pushes the queued ones."""
        from outbox.models import Delivery
        from outbox.queue import RedisQueue
        from outbox.sweeper import Sweeper

        queue = RedisQueue()
        held: dict[str, list[int]] = {}
        for pk, worker in Delivery.objects.processing().values_list("pk", "worker_id"):
            held.setdefault(worker, []).append(pk)
        for worker, ids in held.items():
            queue.register(worker)
            queue.redis.rpush(queue.processing_key(worker), *ids)
        report = Sweeper().run_pass(full_mirror_check=True)
        self.log(f"dashboard: {report.line()}")
        return report.line()

    def staff_client(self) -> Any:
        from django.contrib.auth import get_user_model
        from django.test import Client

        user = get_user_model().objects.create_superuser("bench-operator", None, None)
        client = Client()
        client.force_login(user)
        return client

    # -- measuring ----------------------------------------------------------------

    @staticmethod
    def get(client: Any, url: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = client.get(url, headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code}")

    @staticmethod
    def time_calls(call: Callable[[], Any]) -> list[float]:
        """Seconds of 1 + DASHBOARD_RUNS calls; the first is the warm-up."""
        times = []
        for _ in range(1 + DASHBOARD_RUNS):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return times

    def accuracy(self) -> dict[str, Any]:
        """What the dashboard reports next to an exact count of every status (untimed)."""
        from django.db.models import Count

        from outbox.models import Delivery
        from outbox.status import snapshot as status

        exact = dict(
            Delivery.objects.order_by()
            .values_list("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        )
        report = status.collect()
        return {
            "exact": exact,
            "reported": report["database"]["by_status"],
            "estimated": report["database"]["estimated"],
            "agreement": report["agreement"],
        }

    def plans(self, client: Any) -> list[dict[str, str]]:
        """``EXPLAIN (ANALYZE, BUFFERS)`` of each outbox query of one page and one scrape."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            self.get(client, "/admin/outbox/dashboard/")
            self.get(client, "/outbox/metrics", TOKEN)
        seen: list[str] = []
        shapes: set[str] = set()
        for query in captured.captured_queries:
            sql = query["sql"]
            # The scrape repeats the page's queries with other times in them.
            shape = TIMESTAMP.sub("?", sql)
            if "outbox_" in sql and shape not in shapes:
                shapes.add(shape)
                seen.append(sql)
        plans = []
        with connection.cursor() as cursor:
            for sql in seen:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plans.append({"sql": sql, "plan": "\n".join(row[0] for row in cursor.fetchall())})
        return plans


def outbox_status() -> None:
    from django.core.management import call_command

    call_command("outbox_status", stdout=StringIO())
