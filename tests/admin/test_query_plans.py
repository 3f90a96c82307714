"""The operator's pages on a large table: their queries read indexes, and answer as before.

A few thousand rows of history (mostly sent, some failed and cancelled, over
120 days) and a few live rows, then ``VACUUM ANALYZE`` as autovacuum would.
On PostgreSQL each query of the dashboard, a metrics scrape, ``outbox_status``,
the delivery list (plain and filtered by each status) and the email list is
``EXPLAIN``ed: none reads the whole delivery table, the dashboard counts the
failed, abandoned and cancelled rows from their index alone, the list of a
rare status reads its page from that index, and a list the
planner expects to be long is not counted row by row. The benchmark's admin
scale part (tests/benchmark/admin_scale.py) times the same pages at 5,000,000
rows. On every database the counts are those of an exact ``GROUP BY``. The
sweeper's content retention is ``EXPLAIN``ed too: it reads partial indexes.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from outbox.admin.dashboard import per_minute
from outbox.admin.paginator import EstimatedCountPaginator
from outbox.models import Delivery, Email
from outbox.status import collect, snapshot
from outbox.sweeper import retention

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
TOKEN = "tests-only-metrics-token"  # tests/settings.py
DELIVERIES = "admin:outbox_delivery_changelist"
HISTORY = 4_000
# Every 20th history row failed, every 30th cancelled, every 200th abandoned (and
# never settled since): spread over the table.
LIVE = {"queued": 30, "processing": 2, "abandoned": 3}
ATTENTION_INDEX = "outbox_deliv_attention_id"

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="query plans are PostgreSQL's"
)


def fill() -> None:
    """The history and the live rows, then VACUUM ANALYZE (PostgreSQL)."""
    now = timezone.now()
    email = Email.objects.create(subject="Your order", body="On its way.", from_email="s@x.test")
    rows = []
    for g in range(HISTORY):
        # From 120 days ago to two hours ago: nothing in the chart's hour.
        when = now - timedelta(hours=2) - timedelta(days=120) * (HISTORY - g) / HISTORY
        status = Status.FAILED if g % 20 == 0 else Status.SENT
        status = Status.CANCELLED if g % 30 == 1 else status
        status = Status.ABANDONED if g % 200 == 7 else status
        rows.append(
            Delivery(
                email=email,
                recipient=f"c{g}@shop.test",
                message_id=f"<{g}@shop.test>",
                status=status,
                priority=("high", "normal", "normal", "low")[g % 4],
                sent_at=when if status == Status.SENT else None,
                not_before=when,
                created_at=when,
                updated_at=when,
            )
        )
    for status, n in LIVE.items():
        rows += [
            Delivery(
                email=email,
                recipient=f"{status}{i}@shop.test",
                message_id=f"<{status}{i}@shop.test>",
                status=status,
                not_before=now - timedelta(minutes=i),
            )
            for i in range(n)
        ]
    Delivery.objects.bulk_create(rows, batch_size=1_000)
    if connection.vendor == "postgresql":
        vacuum_analyze()


def vacuum_analyze() -> None:
    """VACUUM ANALYZE until every page of the table is marked all-visible, as autovacuum would.

    A VACUUM cannot mark the pages of rows that a snapshot still open
    somewhere may not see (an autovacuum ANALYZE, say); index-only scans, and
    the planner's choice of them, depend on those marks.
    """
    deadline = time.monotonic() + 20
    with connection.cursor() as cursor:
        while True:
            cursor.execute("VACUUM ANALYZE outbox_delivery")
            cursor.execute(
                "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'outbox_delivery'"
            )
            pages, visible = cursor.fetchone()
            if visible >= pages or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert visible >= pages, (pages, visible)


def exact_counts() -> dict[str, int]:
    rows = Delivery.objects.order_by().values_list("status").annotate(n=Count("id"))
    return dict(rows.values_list("status", "n"))


def plans_of(run) -> list[tuple[str, str]]:
    """``(sql, plan)`` of every SELECT on the delivery table that ``run()`` sends."""
    with CaptureQueriesContext(connection) as captured:
        run()
    found = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if "outbox_delivery" not in sql or sql.startswith("EXPLAIN"):
                continue
            if not sql.lstrip("( ").upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN " + sql)
            found.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    return found


def get_page(client, url: str, **headers: str) -> None:
    response = client.get(url, headers=headers)
    assert response.status_code == 200, url


# -- the answers (every database) --------------------------------------------------


def test_counts_by_status_and_priority_are_an_exact_group_by():
    fill()
    database = collect()["database"]

    exact = exact_counts()
    assert {s: n for s, n in database["by_status"].items() if n} == exact
    assert database["estimated"] == []  # a small table: counted
    by_priority = Counter()
    for status, priority, n in (
        Delivery.objects.order_by().values_list("status", "priority").annotate(n=Count("id"))
    ):
        by_priority[priority, status] = n
    for priority, counts in database["by_priority"].items():
        for status, n in counts.items():
            assert n == by_priority[priority, status], (priority, status)
    assert database["due"] == LIVE["queued"]


def test_the_chart_counts_the_last_hour_only():
    fill()
    now = timezone.now()
    latest = Delivery.objects.filter(status=Status.SENT).order_by("-id")[:3]
    Delivery.objects.filter(pk__in=[d.pk for d in latest]).update(sent_at=now)
    failed = Delivery.objects.filter(status=Status.FAILED).order_by("-id").first()
    Delivery.objects.filter(pk=failed.pk).update(updated_at=now)

    chart = per_minute(now)
    assert sum(chart.sent) == 3
    assert sum(chart.failed) == 1


# -- the plans (PostgreSQL) --------------------------------------------------------


@postgresql_only
def test_the_dashboard_counts_the_attention_rows_from_their_index_alone():
    fill()
    plans = plans_of(collect)
    counts = [plan for sql, plan in plans if "IN ('failed', 'abandoned', 'cancelled')" in sql]
    assert counts, [sql for sql, _plan in plans]
    # Before 0014 the three statuses' rows were read from the table (a bitmap
    # heap scan over rows spread over all of it).
    assert f"Index Only Scan using {ATTENTION_INDEX}" in counts[0], counts[0]


@postgresql_only
def test_a_list_of_a_rare_status_reads_its_page_from_its_index(admin_client, monkeypatch):
    fill()
    # 23 abandoned rows among 4,000, spread over 120 days, 10 to a page: the
    # newest 10 come from the (status, id) index. Before 0014 they came from
    # the primary key, read backwards row by row until ten matched, which on
    # millions of rows with few recent ones reads most of the table.
    monkeypatch.setattr(admin.site._registry[Delivery], "list_per_page", 10)
    url = reverse(DELIVERIES) + "?status__exact=abandoned"
    plans = plans_of(lambda: get_page(admin_client, url))
    page = [plan for sql, plan in plans if "LIMIT" in sql]
    assert page and ATTENTION_INDEX in page[0], page
    assert "outbox_delivery_pkey" not in page[0], page[0]


@postgresql_only
def test_no_page_reads_the_whole_delivery_table(admin_client, client, monkeypatch):
    fill()
    # Lists the planner expects to hold more than this are estimated, as a
    # table of millions would be with the real threshold.
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_threshold", 1_000)
    monkeypatch.setattr(snapshot, "ESTIMATE_ABOVE", 1_000)
    pages = {
        "dashboard": lambda: get_page(admin_client, reverse("admin:outbox_dashboard")),
        "metrics": lambda: get_page(
            client, reverse("outbox:metrics"), Authorization=f"Bearer {TOKEN}"
        ),
        "outbox_status": lambda: call_command("outbox_status", stdout=StringIO()),
        "emails": lambda: get_page(admin_client, reverse("admin:outbox_email_changelist")),
    }
    for query in ["", "priority__exact=high", *(f"status__exact={s}" for s in Status.values)]:
        url = reverse(DELIVERIES) + (f"?{query}" if query else "")
        pages[f"deliveries?{query}"] = lambda url=url: get_page(admin_client, url)
    # The first scrape counts every sent row once (outbox/status/counters.py).
    get_page(client, reverse("outbox:metrics"), Authorization=f"Bearer {TOKEN}")

    for name, run in pages.items():
        for sql, plan in plans_of(run):
            assert "Seq Scan on outbox_delivery" not in plan, (name, sql, plan)


@postgresql_only
def test_a_long_filtered_list_is_estimated_not_counted(admin_client, monkeypatch):
    fill()
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_threshold", 1_000)
    exact = exact_counts()

    for query, want in (
        ("status__exact=sent", exact[Status.SENT]),
        ("priority__exact=normal", Delivery.objects.filter(priority="normal").count()),
    ):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(reverse(DELIVERIES) + "?" + query)
        sql = [q["sql"].upper() for q in captured.captured_queries]
        assert not any("COUNT(" in s for s in sql), (query, sql)
        cl = response.context["cl"]
        assert cl.paginator.estimated
        # The planner's estimate, from ANALYZE's statistics: close, not exact.
        assert abs(cl.result_count - want) <= want * 0.05, (query, cl.result_count, want)
        assert len(cl.result_list) == 100

    # Shorter than the threshold: counted, exactly.
    response = admin_client.get(reverse(DELIVERIES) + "?status__exact=failed")
    assert response.context["cl"].result_count == exact[Status.FAILED]
    assert not response.context["cl"].paginator.estimated


@postgresql_only
def test_the_content_retention_reads_its_partial_indexes_not_the_tables():
    """20,000 emails settled a month ago, 1 in 100 with content still kept (1 in 5 of those
    sensitive): the sweeper's clearing finds them through ``outbox_email_content_kept`` and
    ``outbox_email_sensitive``, and their deliveries through ``email_id``: no table is read."""
    old = timezone.now() - timedelta(days=30)
    emails = Email.objects.bulk_create(
        (
            Email(
                subject=f"s{i}",
                body="kept" if i % 100 == 0 else "",
                from_email="s@x.test",
                created_at=old + timedelta(seconds=i),
                content_cleared_at=None if i % 100 == 0 else old,
                sensitive=i % 500 == 0,
            )
            for i in range(20_000)
        ),
        batch_size=2_000,
    )
    Delivery.objects.bulk_create(
        (
            Delivery(
                email=email,
                recipient=f"c{email.pk}@shop.test",
                message_id=f"<{email.pk}@shop.test>",
                status=Status.SENT,
                sent_at=old,
                not_before=old,
                created_at=old,
                updated_at=old,
            )
            for email in emails
        ),
        batch_size=2_000,
    )
    vacuum_analyze()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE outbox_email")
    plans = [plan for sql, plan in plans_of(lambda: retention.clear_content(timezone.now()))]
    assert any("outbox_email_sensitive" in plan for plan in plans), plans
    assert any("outbox_email_content_kept" in plan for plan in plans), plans
    for plan in plans:
        assert "Seq Scan" not in plan, plan
    assert not Email.objects.filter(content_cleared_at=None).exists()
