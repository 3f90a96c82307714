"""The deliveries in the admin: the list's filters and search, its queries, the delivery page, read-only rows."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import urlencode

from outbox import enqueue_email, operations
from outbox.admin.deliveries import DeliveryAdmin
from outbox.models import Attempt, Delivery
from tests.admin.rows import (
    CHANGELIST,
    WORKER,
    Outcome,
    make_rows,
    run_action,
    snapshot,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_changelist_filters(admin_client):
    rows = make_rows()
    urgent = enqueue_email("Password reset", "b", None, ["urgent@example.com"], priority="high")

    def listed(query: str) -> set[int]:
        response = admin_client.get(reverse(CHANGELIST) + query)
        assert response.status_code == 200
        return {d.pk for d in response.context["cl"].result_list}

    everything = {pk for ids in rows.values() for pk in ids} | {urgent[0].pk}
    assert listed("?status__exact=abandoned") == set(rows["abandoned"])
    assert listed("?status__exact=queued") == set(rows["queued"]) | {urgent[0].pk}
    assert listed("?priority__exact=high") == {urgent[0].pk}
    # The date filter's own links ("Past 7 days" ...) use aware datetimes.
    now = timezone.now()
    week_ago = urlencode({"created_at__gte": str(now - timedelta(days=7))})
    assert listed(f"?{week_ago}") == everything
    tomorrow = urlencode({"updated_at__gte": str(now + timedelta(days=1))})
    assert listed(f"?{tomorrow}") == set()
    assert listed(
        f"?{urlencode({'updated_at__gte': str(now - timedelta(hours=1))})}&status__exact=sent"
    ) == set(rows["sent"])
    # The link from an email's page: its deliveries only.
    email_id = Delivery.objects.get(pk=urgent[0].pk).email_id
    assert listed(f"?email__id__exact={email_id}") == {urgent[0].pk}


def test_changelist_search(admin_client):
    rows = make_rows()
    other = enqueue_email("Weekly newsletter", "b", None, ["reader@example.org"])[0]

    def listed(term: str) -> set[int]:
        response = admin_client.get(reverse(CHANGELIST), {"q": term})
        assert response.status_code == 200
        return {d.pk for d in response.context["cl"].result_list}

    idn = enqueue_email("Hallo", "b", None, ["Ünal <unal@Bücher.de>"])[0]
    assert listed("failed0@example.com") == set(rows["failed"])
    # The address in any case or form: the normalised address.
    assert listed(" FAILED0@Example.com ") == set(rows["failed"])
    assert listed("Someone <failed0@example.com>") == set(rows["failed"])
    # Any start of an address, with or without the domain's start, in any case or
    # form (before, a term with an "@" had to be a whole address: the help's own
    # example, bob@exa, found nothing).
    assert listed("reader@") == {other.pk}
    assert listed("Reader") == {other.pk}
    assert listed("failed") == set(rows["failed"])
    assert listed("failed0@exa") == set(rows["failed"])
    assert listed("failed0@example.c") == set(rows["failed"])
    assert listed("FAILED0@Example.C") == set(rows["failed"])
    assert listed("Someone <failed0@ex") == set(rows["failed"])
    assert listed("reader@example.or") == {other.pk}
    assert listed("failed0@exb") == set()
    # A Unicode domain is stored in its IDNA form: a whole label typed in Unicode, or
    # any start of the IDNA form, finds it.
    assert listed("unal@bücher") == {idn.pk}
    assert listed("UNAL@BÜCHER.D") == {idn.pk}
    assert listed("unal@xn--bch") == {idn.pk}
    # A Message-ID as the mail log shows it, with or without the angle brackets.
    assert listed(other.message_id) == {other.pk}
    assert listed(other.message_id.strip("<>")) == {other.pk}
    # Subjects are not searched (a substring of every row's subject is a full scan).
    assert listed("newsletter") == set()
    assert listed("nobody-has-this") == set()


def search_queries(admin_client, term: str) -> list[str]:
    """The SQL of the delivery list's queries that carry the search's condition."""
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse(CHANGELIST), {"q": term})
    assert response.status_code == 200
    # The paginator's own EXPLAIN (its estimate of a long list's count) is left out.
    return [
        q["sql"]
        for q in captured.captured_queries
        if "recipient_key" in q["sql"] and not q["sql"].lstrip().upper().startswith("EXPLAIN")
    ]


def plan_nodes(sql: str) -> list[dict[str, Any]]:
    """Every node of the plan PostgreSQL makes for ``sql``."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        [[plan]] = cursor.fetchall()
    nodes, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo += node.get("Plans", [])
    return nodes


def test_the_search_is_answered_by_indexes_on_postgresql(admin_client):
    """An address, the start of one, or a Message-ID: an index lookup, never a scan.

    At 5 million rows the substring search (ILIKE over the recipient, the
    Message-ID and the subject) read every row: 11 s for one customer.
    """
    if connection.vendor != "postgresql":
        pytest.skip("the plans are PostgreSQL's")
    [target] = enqueue_email("Password reset", "b", None, ["Customer <Customer@Example.com>"])
    email_id = Delivery.objects.get(pk=target.pk).email_id
    with connection.cursor() as cursor:
        # History, as a site has it: 20,000 rows of other recipients, analysed.
        cursor.execute(
            "INSERT INTO outbox_delivery (email_id, recipient, recipient_key, status, priority,"
            " attempts, max_attempts, not_before, worker_id, message_id, last_error,"
            " created_at, updated_at)"
            " SELECT %s, 'r' || g || '@example.com', 'r' || g || '@example.com', 'sent',"
            " 'normal', 1, 5, now(), '', '<' || g || '.history@example.com>', '', now(), now()"
            " FROM generate_series(1, 20000) AS g",
            [email_id],
        )
        cursor.execute("ANALYZE outbox_delivery")
    terms = {
        "customer@example.com": {target.pk},
        "CUSTOMER <customer@EXAMPLE.com>": {target.pk},
        "custom": {target.pk},
        "customer@exa": {target.pk},
        "Customer@Example.c": {target.pk},
        target.message_id: {target.pk},
        target.message_id.strip("<>"): {target.pk},
    }
    for term, expected in terms.items():
        response = admin_client.get(reverse(CHANGELIST), {"q": term})
        assert {d.pk for d in response.context["cl"].result_list} == expected, term
        queries = search_queries(admin_client, term)
        assert queries, term
        for sql in queries:
            # No case folding or substring pattern on the column: those no b-tree serves.
            assert not re.search(r"UPPER\(|ILIKE|LIKE '%", sql), sql
            nodes = plan_nodes(sql)
            scans = {n["Node Type"] for n in nodes if n.get("Relation Name") == "outbox_delivery"}
            assert "Seq Scan" not in scans, (term, sql, scans)
            used = {n.get("Index Name") for n in nodes}
            assert used & {"outbox_deliv_recipient_key", "outbox_delivery_message_id_uniq"}, (
                term,
                sql,
                used,
            )


def test_changelist_queries_do_not_grow_with_rows_or_page_size(
    admin_client, monkeypatch, django_assert_max_num_queries
):
    for n in range(20):
        enqueue_email(f"Invoice {n}", "b", None, [f"user{n}-{i}@example.com" for i in range(100)])
    assert Delivery.objects.count() == 2000
    model_admin = admin.site._registry[Delivery]
    counts = {}
    for per_page in (10, 100, 500):
        monkeypatch.setattr(model_admin, "list_per_page", per_page)
        for query in ("", "?status__exact=queued&q=user"):
            with (
                django_assert_max_num_queries(6),
                CaptureQueriesContext(connection) as captured,
            ):
                response = admin_client.get(reverse(CHANGELIST) + query)
            assert response.status_code == 200
            assert len(response.context["cl"].result_list) == per_page
            counts[per_page, query] = len(captured)
    # The page size changes nothing. (On PostgreSQL the unfiltered list also
    # asks the catalogue for its row estimate: one more query, always.)
    for query in ("", "?status__exact=queued&q=user"):
        assert len({n for (_size, q), n in counts.items() if q == query}) == 1, counts


def test_detail_page_shows_what_the_operator_needs(admin_client):
    rows = make_rows({"abandoned": 1})
    delivery = Delivery.objects.get(pk=rows["abandoned"][0])
    Attempt.objects.create(
        delivery=delivery,
        number=1,
        worker_id=WORKER,
        claim_token=delivery.claim_token,
        started_at=delivery.processing_started_at,
        finished_at=timezone.now(),
        outcome=Outcome.ABANDONED,
        error="worker went away",
        actor="sweeper",
        server_host="relay-b.example.com",
        server_address="192.0.2.25:25",
    )
    operations.mark_failed([delivery.pk], actor="admin:alice")

    response = admin_client.get(reverse("admin:outbox_delivery_change", args=[delivery.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert escape(delivery.message_id) in content
    assert delivery.recipient in content
    assert WORKER in content
    assert str(delivery.claim_token) in content
    assert "marked failed by admin:alice" in content  # last_error
    assert "outbox-status-failed" in content
    assert reverse("admin:outbox_email_change", args=[delivery.email_id]) in content
    # Where the attempt handed the message over (a pool of relays: which one).
    assert "relay-b.example.com (192.0.2.25:25)" in content
    # The attempt log, oldest first, with who did what.
    inline = response.context["inline_admin_formsets"][0]
    attempts = [form.original for form in inline]
    assert [(a.outcome, a.actor) for a in attempts] == [
        (Outcome.ABANDONED, "sweeper"),
        (Outcome.MARKED_FAILED, "admin:alice"),
    ]
    assert "abandoned (worker went away)" in content
    assert "marked failed" in content and "admin:alice" in content
    # Nothing to save, add or delete here.
    assert 'name="_save"' not in content
    assert 'name="_continue"' not in content
    assert "/delete/" not in content


def test_deliveries_cannot_be_added_edited_or_deleted(admin_client):
    rows = make_rows()
    pk = rows["abandoned"][0]
    before = snapshot()

    assert admin_client.get(reverse("admin:outbox_delivery_add")).status_code == 403
    response = admin_client.post(
        reverse("admin:outbox_delivery_change", args=[pk]),
        {"recipient": "evil@example.com", "status": "sent", "attempts": "0", "_save": "Save"},
    )
    assert response.status_code == 403
    assert admin_client.get(reverse("admin:outbox_delivery_delete", args=[pk])).status_code == 403
    assert admin_client.post(reverse("admin:outbox_delivery_delete", args=[pk])).status_code == 403
    response = run_action(admin_client, "delete_selected", [pk], post="yes")
    assert Delivery.objects.filter(pk=pk).exists()

    assert snapshot() == before
    assert not Attempt.objects.exists()
    model_admin = admin.site._registry[Delivery]
    assert isinstance(model_admin, DeliveryAdmin)
    assert not model_admin.has_delete_permission(response.wsgi_request)
