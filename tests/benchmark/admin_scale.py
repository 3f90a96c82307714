"""The benchmark's admin scale part (PostgreSQL): every operator page at 10,000 and 5,000,000 rows.

For each history size (``Sizes.admin_scale_history``) the tables are emptied and
filled in SQL (admin_scale_data.py: emails, deliveries and one attempt each,
over 120 days, plus the same live rows whatever the size), the queued rows
mirrored into Redis with a full sweeper pass, and then each page is timed,
warm (one untimed call first), ``RUNS`` times, through Django's test client as
a logged-in superuser (the whole request: middleware, session, template):

- the dashboard, one metrics scrape, ``manage.py outbox_status``;
- the delivery list, and filtered by status (sent, failed, queued);
- the email list.

What each page answered is kept beside an exact ``GROUP BY`` of the table, so
the two sizes can be compared: the live rows are the same at both sizes, so
every count but the history's must be the same, and the history's counts must
be right (exact, or the planner's estimate, marked as such). At the largest
size it also keeps the ``EXPLAIN (ANALYZE, BUFFERS)`` plan of the slowest
outbox query of each page.

The searches by address and Message-ID are not timed here.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

from tests.benchmark.admin_scale_data import insert_history

RUNS = 5
BUDGET_MS = 500.0
TOKEN = "bench-only-metrics-token"  # settings.py
DELIVERIES = "/admin/outbox/delivery/"
# name -> URL (None: outbox_status through call_command).
PAGES: dict[str, str | None] = {
    "dashboard": "/admin/outbox/dashboard/",
    "metrics": "/outbox/metrics",
    "outbox_status": None,
    "delivery list": DELIVERIES,
    "delivery list, status sent": DELIVERIES + "?status__exact=sent",
    "delivery list, status failed": DELIVERIES + "?status__exact=failed",
    "delivery list, status queued": DELIVERIES + "?status__exact=queued",
    "email list": "/admin/outbox/email/",
}
METRIC = re.compile(r'^(outbox_(?:deliveries|due|failed_total)(?:\{status="(\w+)"\})?) (\S+)$')


class AdminScaleMixin:
    """The admin scale part of the benchmark's ``Child`` (see child.py for the attributes).

    Uses the dashboard part's set-up helpers (``mirror_into_redis``,
    ``staff_client``), which the same ``Child`` has.
    """

    db: str
    sizes: Any
    extra: dict[str, Any]
    log: Callable[[str], None]
    reset: Callable[[], None]
    mirror_into_redis: Callable[[], str]
    staff_client: Callable[[], Any]

    def bench_admin_scale(self) -> None:
        from django.db import connection
        from django.utils import timezone

        results = []
        client = self.staff_client()  # reset() empties the outbox's tables, not auth's
        for size in self.sizes.admin_scale_history:
            self.reset()
            started = time.perf_counter()
            with connection.cursor() as cursor:
                built = insert_history(cursor, size, timezone.now())
            seeded = time.perf_counter() - started
            self.log(f"admin scale: {size:,} history rows in {seeded:.0f}s")
            result: dict[str, Any] = {
                "history": size,
                "load_before": os.getloadavg(),
                "seed_s": seeded,
                "index_build_s": built,
                "sweep": self.mirror_into_redis(),
            }
            result["times"], result["cpu"] = {}, {}
            for name, url in PAGES.items():
                result["times"][name], result["cpu"][name] = time_calls(
                    lambda url=url: fetch(client, url)
                )
            for name, times in result["times"].items():
                self.log(
                    f"admin scale {size:,}: {name} {statistics.median(times[1:]) * 1000:.0f} ms"
                )
            result["load_after"] = os.getloadavg()
            result["db_ms"] = {name: database_ms(client, url) for name, url in PAGES.items()}
            result["answers"] = answers(client)
            if size == max(self.sizes.admin_scale_history):
                result["plans"] = slowest_plans(client)
            results.append(result)
        self.extra["admin_scale"] = results


# -- measuring ----------------------------------------------------------------------


def fetch(client: Any, url: str | None) -> Any:
    """One page (its response), or one ``outbox_status`` (its text)."""
    if url is None:
        from django.core.management import call_command

        out = StringIO()
        call_command("outbox_status", stdout=out)
        return out.getvalue()
    headers = {"Authorization": f"Bearer {TOKEN}"} if "metrics" in url else {}
    response = client.get(url, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: {response.status_code}")
    return response


def time_calls(call: Callable[[], Any]) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds (of this process) of 1 + RUNS calls; the first is the warm-up.

    On a machine shared with other work the wall clock includes the time the
    process waited for a core; its CPU time does not.
    """
    times, cpu = [], []
    for _ in range(1 + RUNS):
        started, started_cpu = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return times, cpu


def database_ms(client: Any, url: str | None) -> float:
    """The median over three calls of the time one call spends in its SQL queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    sums = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as captured:
            fetch(client, url)
        sums.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
    return statistics.median(sums)


def answers(client: Any) -> dict[str, Any]:
    """What the pages said (untimed), and the exact counts of the table beside them.

    The test client keeps a page's template context only in Django's test
    environment, which instruments rendering: so it is set up here, after
    the timing, and torn down again.
    """
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    try:
        return _answers(client)
    finally:
        teardown_test_environment()


def _answers(client: Any) -> dict[str, Any]:
    from django.db.models import Count

    from outbox.models import Delivery

    exact = dict(
        Delivery.objects.order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    dashboard = fetch(client, PAGES["dashboard"]).context
    lists = {}
    for name in ("delivery list", "delivery list, status sent", "delivery list, status failed",
                 "delivery list, status queued", "email list"):  # fmt: skip
        changelist = fetch(client, PAGES[name]).context["cl"]
        lists[name] = {
            "count": changelist.result_count,
            "estimated": getattr(changelist.paginator, "estimated", False),
            "first_ids": [obj.pk for obj in changelist.result_list[:3]],
            "shown": len(changelist.result_list),
        }
    metrics = {}
    for line in fetch(client, PAGES["metrics"]).content.decode().splitlines():
        match = METRIC.match(line)
        if match:
            metrics[match.group(1)] = float(match.group(3))
    return {
        "exact": exact,
        "exact_due": Delivery.objects.queued().filter(not_before__lte=dashboard["now"]).count(),
        "dashboard": {
            "counts": {row["status"]: row["count"] for row in dashboard["counts"]},
            "estimated": [row["status"] for row in dashboard["counts"] if row["estimated"]],
            "due": dashboard["due"],
            "scheduled": dashboard["scheduled"],
            "sent_last_hour": dashboard["sent_last_hour"],
            "failed_last_hour": dashboard["failed_last_hour"],
        },
        "lists": lists,
        "metrics": metrics,
    }


def slowest_plans(client: Any) -> list[dict[str, Any]]:
    """For each page, ``EXPLAIN (ANALYZE, BUFFERS)`` of its slowest outbox query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    plans = []
    for name, url in PAGES.items():
        with CaptureQueriesContext(connection) as captured:
            fetch(client, url)
        timed = []
        with connection.cursor() as cursor:
            for query in captured.captured_queries:
                sql = query["sql"]
                if "outbox_" not in sql or not sql.lstrip("( ").upper().startswith("SELECT"):
                    continue
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                ms = float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1))
                timed.append((ms, sql, plan))
        if timed:
            ms, sql, plan = max(timed)
            plans.append({"page": name, "queries": len(timed), "ms": ms, "sql": sql, "plan": plan})
    return plans
