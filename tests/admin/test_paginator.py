"""The admin lists' paginator (``outbox/admin/paginator.py``): exact counts, or PostgreSQL's estimate."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from outbox.admin.deliveries import EstimatedCountPaginator
from outbox.models import Delivery
from tests.admin.rows import (
    CHANGELIST,
    make_rows,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_paginator_counts_exactly_below_the_threshold_and_off_postgresql():
    make_rows({"queued": 30})
    paginator = EstimatedCountPaginator(Delivery.objects.order_by("-id"), 10)
    assert paginator.count == 30
    assert paginator.num_pages == 3
    if connection.vendor != "postgresql":
        assert paginator.estimated_count() is None
    # A filtered list the planner expects to be short is counted exactly
    # (tests/admin/test_query_plans.py has the long one).
    filtered = EstimatedCountPaginator(
        Delivery.objects.filter(recipient__endswith="1@example.com").order_by("-id"), 10
    )
    assert filtered.count == 3
    assert not filtered.estimated


def test_paginator_of_a_plain_list():
    paginator = EstimatedCountPaginator(list(range(25)), 10)
    assert paginator.estimated_count() is None
    assert paginator.count == 25


def test_unfiltered_list_on_postgresql_uses_the_planner_estimate(admin_client, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the estimate is a PostgreSQL feature")
    make_rows({"queued": 250, "sent": 50})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE outbox_delivery")
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_threshold", 100)

    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    sql = [q["sql"] for q in captured.captured_queries]
    assert not any("COUNT(" in s.upper() for s in sql), sql
    assert any("reltuples" in s for s in sql)
    assert response.context["cl"].result_count == 300  # ANALYZE saw every row

    # A filtered list is counted for real.
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse(CHANGELIST) + "?status__exact=sent")
    assert response.context["cl"].result_count == 50
    assert any("COUNT(" in q["sql"].upper() for q in captured.captured_queries)
