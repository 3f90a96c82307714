"""The admin: read-only views, lists that stay fast, and the operator actions."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import urlencode
from django.utils.text import Truncator

from outbox import enqueue_email, operations
from outbox.admin.cells import SUBJECT_CHARS, compact_time, truncated
from outbox.admin.deliveries import DeliveryAdmin, EstimatedCountPaginator, skip_reasons
from outbox.models import Attempt, Delivery, Email
from outbox.queue import RedisQueue

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
Outcome = Attempt.Outcome
STATUSES = [s.value for s in Status]
ACTIONS = ["requeue", "requeue_now", "mark_sent", "mark_failed", "cancel"]
CHANGELIST = "admin:outbox_delivery_changelist"
WORKER = "mailhost:4242:worker-1"

# What a row in each status looks like when the admin finds it.
STATE: dict[str, dict[str, Any]] = {
    "queued": {},
    "processing": {"worker_id": WORKER, "attempts": 1},
    "sent": {"worker_id": WORKER, "attempts": 1},
    "failed": {"attempts": 5, "last_error": "550 5.1.1 no such user"},
    "abandoned": {"worker_id": WORKER, "attempts": 1, "last_error": "worker went away"},
    "cancelled": {},
}


def set_status(ids: list[int], status: str) -> None:
    now = timezone.now()
    values = dict(STATE[status])
    if status in ("processing", "abandoned"):
        values.update(claim_token=uuid.uuid4(), processing_started_at=now - timedelta(minutes=5))
    if status == "sent":
        values.update(processing_started_at=now - timedelta(minutes=5), sent_at=now)
    Delivery.objects.filter(pk__in=ids).update(status=status, updated_at=now, **values)


def make_rows(
    counts: dict[str, int] | None = None, subject: str = "Your receipt", **kwargs: Any
) -> dict[str, list[int]]:
    """One email with deliveries in the given statuses (default: one in each)."""
    counts = counts if counts is not None else dict.fromkeys(STATUSES, 1)
    recipients = [f"{status}{i}@example.com" for status, n in counts.items() for i in range(n)]
    deliveries = enqueue_email(subject, "Thanks!", "shop@example.com", recipients, **kwargs)
    rows: dict[str, list[int]] = {}
    position = 0
    for status, n in counts.items():
        rows[status] = [d.pk for d in deliveries[position : position + n]]
        position += n
        if status != "queued":
            set_status(rows[status], status)
    return rows


def snapshot(ids: list[int] | None = None) -> dict[int, tuple[Any, ...]]:
    """Every column an action might touch, by row id."""
    queryset = Delivery.objects.all() if ids is None else Delivery.objects.filter(pk__in=ids)
    return {
        row[0]: row[1:]
        for row in queryset.values_list(
            "pk",
            "status",
            "attempts",
            "worker_id",
            "claim_token",
            "processing_started_at",
            "sent_at",
            "last_error",
            "not_before",
            "updated_at",
        )
    }


def run_action(client, action: str, ids: list[int], query: str = "", **data: str):
    return client.post(
        reverse(CHANGELIST) + query,
        {"action": action, "_selected_action": [str(pk) for pk in ids], "index": "0", **data},
    )


def message_texts(response) -> list[str]:
    return [str(m.message) for m in get_messages(response.wsgi_request)]


def staff_user(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
    )
    return user


def action_names(response) -> list[str]:
    form = response.context["action_form"]
    return [] if form is None else [name for name, _label in form.fields["action"].choices]


# -- the delivery list ------------------------------------------------------------


def test_changelist_shows_every_status_with_a_badge(admin_client):
    rows = make_rows()
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    content = response.content.decode()
    for status in STATUSES:
        assert f"{status}0@example.com" in content
        assert f"outbox-status-{status}" in content
    assert "Your receipt" in content  # the subject, under the recipient
    assert "1/5" in content  # attempts of max_attempts
    # Priority is a filter and the worker is on the delivery's page, not in the list.
    assert WORKER not in content
    assert "priority__exact=high" in content
    headers = [h["text"] for h in response.context["result_headers"]]
    assert [str(h).lower() for h in headers[1:]] == [
        "recipient and subject",
        "status",
        "attempts",
        "sent",
        "updated",
    ]
    # Newest first.
    listed = [d.pk for d in response.context["cl"].result_list]
    assert listed == sorted((pk for ids in rows.values() for pk in ids), reverse=True)


def test_changelist_cuts_long_subjects_and_keeps_them_in_a_tooltip(admin_client):
    subject = 'A <b>very</b> long "subject" & more: ' + "x" * 100
    [delivery] = enqueue_email(subject, "b", None, ["someone@example.com"])
    response = admin_client.get(reverse(CHANGELIST))
    content = response.content.decode()
    shown = Truncator(subject).chars(SUBJECT_CHARS)
    assert len(shown) == SUBJECT_CHARS and shown.endswith("\u2026")
    # Escaped both in the cell and in the title; the tag never reaches the page as a tag.
    assert f'title="{escape(subject)}"' in content
    assert f">{escape(shown)}</span>" in content
    assert "<b>very</b>" not in content
    # The recipient cell links to the delivery's page.
    assert reverse("admin:outbox_delivery_change", args=[delivery.pk]) in content


def test_truncated_cell_is_one_line_and_bounded():
    cell = truncated("Line one\nline   two", 60, 20)
    assert cell.startswith('<span class="outbox-cut" title="Line one line two" style="')
    assert "max-width:20em" in cell and "white-space:nowrap" in cell
    assert cell.endswith(">Line one line two</span>")
    assert len(truncated("y" * 50_000, 60, 20)) < 1300  # the tooltip is bounded too


def test_compact_times_with_the_full_time_in_a_tooltip(admin_client, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    now = datetime(2026, 11, 23, 13, 5, 7, tzinfo=UTC)
    this_year = compact_time(now, now=now)
    assert this_year is not None
    assert ">Nov 23 14:05</time>" in this_year
    assert 'title="2026-11-23 14:05:07 CET"' in this_year
    assert 'datetime="2026-11-23T13:05:07+00:00"' in this_year
    last_year = compact_time(now - timedelta(days=365), now=now)
    assert last_year is not None and ">Nov 23, 2025</time>" in last_year
    assert compact_time(None) is None

    rows = make_rows({"sent": 1})
    response = admin_client.get(reverse(CHANGELIST))
    content = response.content.decode()
    sent_at = Delivery.objects.get(pk=rows["sent"][0]).sent_at
    assert sent_at is not None
    assert f'datetime="{sent_at.isoformat()}"' in content


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


# -- the delivery page --------------------------------------------------------------


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


# -- the actions ------------------------------------------------------------------

EXPECTED = {
    "requeue": (
        {"abandoned", "failed", "cancelled"},
        "queued",
        Outcome.REQUEUED,
        "Requeued 3 deliveries. Skipped 3: 1 queued, 1 processing, 1 sent.",
    ),
    "requeue_now": (
        {"abandoned", "failed", "cancelled"},
        "queued",
        Outcome.REQUEUED,
        "Requeued 3 deliveries to send now. Skipped 3: 1 queued, 1 processing, 1 sent.",
    ),
    "mark_sent": (
        {"abandoned"},
        "sent",
        Outcome.MARKED_SENT,
        "Marked 1 delivery as sent. "
        "Skipped 5: 1 queued, 1 processing, 1 sent, 1 failed, 1 cancelled.",
    ),
    "mark_failed": (
        {"abandoned"},
        "failed",
        Outcome.MARKED_FAILED,
        "Marked 1 delivery as failed. "
        "Skipped 5: 1 queued, 1 processing, 1 sent, 1 failed, 1 cancelled.",
    ),
    "cancel": (
        {"queued", "abandoned"},
        "cancelled",
        Outcome.CANCELLED,
        "Cancelled 2 deliveries. Skipped 4: 1 processing, 1 sent, 1 failed, 1 cancelled.",
    ),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_action_on_rows_in_every_status(admin_client, action):
    rows = make_rows()
    before = snapshot()
    allowed, target, outcome, expected_message = EXPECTED[action]

    response = run_action(admin_client, action, [pk for ids in rows.values() for pk in ids])
    assert response.status_code == 302
    assert message_texts(response) == [expected_message]

    after = snapshot()
    changed = {pk for status in allowed for pk in rows[status]}
    for status, ids in rows.items():
        for pk in ids:
            if pk in changed:
                assert after[pk][0] == target, (status, after[pk])
            else:
                assert after[pk] == before[pk], status  # not touched at all
    log = list(Attempt.objects.values_list("delivery_id", "outcome", "actor", "number"))
    assert {pk for pk, *_ in log} == changed
    assert all(o == outcome and a == "admin:admin" for _pk, o, a, _n in log)
    # The attempt is numbered after the row's attempts so far.
    assert {pk: n for pk, _o, _a, n in log} == {pk: before[pk][1] for pk in changed}


def test_skip_message_names_each_status(admin_client):
    rows = make_rows({"abandoned": 3, "processing": 1, "sent": 1})
    response = run_action(admin_client, "mark_sent", [pk for ids in rows.values() for pk in ids])
    assert message_texts(response) == [
        "Marked 3 deliveries as sent. Skipped 2: 1 processing, 1 sent."
    ]
    assert [m.level_tag for m in get_messages(response.wsgi_request)] == ["warning"]
    assert Delivery.objects.filter(status="sent", sent_at__isnull=False).count() == 4


def test_skip_reasons_in_life_cycle_order():
    # "deleted": a row removed between the selection and the action.
    skipped = Counter({"deleted": 1, "sent": 2, "processing": 1, "mystery": 1})
    assert skip_reasons(skipped) == "1 processing, 2 sent, 1 deleted, 1 mystery"


def test_success_message_when_nothing_is_skipped(admin_client):
    rows = make_rows({"queued": 2})
    response = run_action(admin_client, "cancel", rows["queued"])
    assert message_texts(response) == ["Cancelled 2 deliveries."]
    assert [m.level_tag for m in get_messages(response.wsgi_request)] == ["success"]


def test_requeue_pushes_the_ids_to_redis(admin_client, queue: RedisQueue):
    rows = make_rows()
    high = make_rows({"failed": 1}, subject="Password reset", priority="high")
    queue.redis.flushdb()  # forget the pushes of enqueue_email

    ids = [pk for ids in rows.values() for pk in ids] + high["failed"]
    response = run_action(admin_client, "requeue", ids)
    assert message_texts(response) == [
        "Requeued 4 deliveries. Skipped 3: 1 queued, 1 processing, 1 sent."
    ]
    requeued = rows["abandoned"] + rows["failed"] + rows["cancelled"]
    ready = [int(x) for x in queue.redis.lrange(queue.ready_key("normal"), 0, -1)]
    assert sorted(ready) == sorted(requeued)
    assert [int(x) for x in queue.redis.lrange(queue.ready_key("high"), 0, -1)] == high["failed"]
    # A fresh start: no attempts used, no worker, no claim.
    for d in Delivery.objects.filter(pk__in=requeued):
        assert (d.status, d.attempts, d.worker_id, d.claim_token, d.sent_at) == (
            "queued",
            0,
            "",
            None,
            None,
        )


def test_select_all_across_pages_acts_on_the_filtered_list(admin_client):
    rows = make_rows({"queued": 3, "processing": 2, "abandoned": 1})
    response = run_action(
        admin_client,
        "cancel",
        rows["queued"][:1],
        query="?status__exact=queued",
        select_across="1",
    )
    assert message_texts(response) == ["Cancelled 3 deliveries."]
    assert set(Delivery.objects.filter(status="cancelled").values_list("pk", flat=True)) == set(
        rows["queued"]
    )
    assert Delivery.objects.filter(status="abandoned").count() == 1


@pytest.mark.parametrize("action", ACTIONS)
def test_processing_rows_are_never_changed(admin_client, action):
    rows = make_rows({"processing": 2})
    before = snapshot()
    response = run_action(admin_client, action, rows["processing"])
    assert response.status_code == 302
    assert snapshot() == before
    assert not Attempt.objects.exists()
    done = {
        "requeue": "Requeued 0 deliveries.",
        "requeue_now": "Requeued 0 deliveries to send now.",
        "mark_sent": "Marked 0 deliveries as sent.",
        "mark_failed": "Marked 0 deliveries as failed.",
        "cancel": "Cancelled 0 deliveries.",
    }[action]
    assert message_texts(response) == [f"{done} Skipped 2: 2 processing."]


# -- permissions --------------------------------------------------------------------


def test_staff_with_change_permission_runs_the_actions(client, django_user_model):
    user = staff_user(django_user_model, "operator", "view_delivery", "change_delivery")
    client.force_login(user)
    rows = make_rows()

    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert action_names(response) == ["", *ACTIONS]  # and no "delete_selected"

    response = run_action(client, "mark_sent", rows["abandoned"] + rows["processing"])
    assert message_texts(response) == ["Marked 1 delivery as sent. Skipped 1: 1 processing."]
    assert Delivery.objects.get(pk=rows["abandoned"][0]).status == "sent"
    assert Delivery.objects.get(pk=rows["processing"][0]).status == "processing"
    attempt = Attempt.objects.get()
    assert (attempt.actor, attempt.outcome) == ("admin:operator", Outcome.MARKED_SENT)

    # The delivery page shows its attempt log without a separate permission.
    response = client.get(reverse("admin:outbox_delivery_change", args=[rows["sent"][0]]))
    assert response.status_code == 200
    assert len(response.context["inline_admin_formsets"]) == 1
    assert 'name="_save"' not in response.content.decode()


def test_view_only_staff_sees_no_actions_and_cannot_forge_one(client, django_user_model):
    user = staff_user(django_user_model, "viewer", "view_delivery")
    client.force_login(user)
    rows = make_rows()
    before = snapshot()

    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert response.context["action_form"] is None
    assert "Requeue (send again)" not in response.content.decode()

    every_id = [pk for ids in rows.values() for pk in ids]
    for action in ACTIONS:
        response = run_action(client, action, every_id)
        assert response.status_code == 200  # the list again, nothing done
    assert snapshot() == before
    assert not Attempt.objects.exists()

    # The page is visible, and the attempt log with it.
    response = client.get(reverse("admin:outbox_delivery_change", args=[rows["failed"][0]]))
    assert response.status_code == 200
    assert len(response.context["inline_admin_formsets"]) == 1


def test_staff_without_delivery_permissions_is_turned_away(client, django_user_model):
    user = staff_user(django_user_model, "stranger")
    client.force_login(user)
    rows = make_rows()
    before = snapshot()
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert run_action(client, "cancel", rows["queued"]).status_code == 403
    assert snapshot() == before


def test_action_labels(admin_client):
    make_rows()
    response = admin_client.get(reverse(CHANGELIST))
    labels = dict(response.context["action_form"].fields["action"].choices)
    assert labels["requeue"] == "Requeue (send again)"
    assert labels["mark_sent"] == "Mark as sent (confirmed in the mail logs)"
    assert labels["mark_failed"] == "Mark as failed"
    assert labels["cancel"] == "Cancel"
    assert "delete_selected" not in labels


# -- read-only ----------------------------------------------------------------------


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


def test_emails_cannot_be_added_edited_or_deleted(admin_client):
    make_rows({"queued": 1})
    email = Email.objects.get()
    assert admin_client.get(reverse("admin:outbox_email_add")).status_code == 403
    response = admin_client.post(
        reverse("admin:outbox_email_change", args=[email.pk]),
        {"subject": "Changed", "body": "changed", "from_email": "x@example.com"},
    )
    assert response.status_code == 403
    assert (
        admin_client.post(reverse("admin:outbox_email_delete", args=[email.pk])).status_code == 403
    )
    email.refresh_from_db()
    assert (email.subject, email.body) == ("Your receipt", "Thanks!")
    response = admin_client.get(reverse("admin:outbox_email_changelist"))
    assert response.status_code == 200
    assert response.context["action_form"] is None


# -- the email page -----------------------------------------------------------------


def test_email_page_shows_content_deliveries_and_attachments(admin_client):
    deliveries = enqueue_email(
        "Report for March",
        "See attached.\nRegards",
        "Shop <shop@example.com>",
        ["a@example.com", "b@example.com"],
        html_message="<p>See <b>attached</b></p><script>alert(1)</script>",
        reply_to=["support@example.com"],
        headers={"X-Campaign": "spring"},
        attachments=[
            ("report.pdf", b"%PDF-1.4 data", "application/pdf"),
            ("big.bin", b"x" * 3000, "application/octet-stream"),
        ],
    )
    set_status([deliveries[1].pk], "sent")
    email = Email.objects.get()

    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse("admin:outbox_email_change", args=[email.pk]))
    assert response.status_code == 200
    # The attachments' sizes come from the database, their content is not read.
    for query in captured.captured_queries:
        sql = query["sql"].replace('LENGTH("outbox_attachment"."content")', "")
        assert '"outbox_attachment"."content"' not in sql
    content = response.content.decode()
    assert "Report for March" in content
    assert "See attached.<br>Regards" in content
    assert "support@example.com" in content and "X-Campaign" in content
    # The HTML alternative is shown as text, never rendered.
    assert "<script>alert(1)</script>" not in content
    assert escape("<script>alert(1)</script>") in content
    # Attachments: name, type and size, not the content.
    assert "report.pdf" in content and "application/pdf" in content
    assert "13\xa0bytes" in content
    assert "2.9\xa0KB (3000 bytes)" in content
    # Deliveries, with links to their pages and to the filtered list.
    for d in deliveries:
        assert d.recipient in content
        assert reverse("admin:outbox_delivery_change", args=[d.pk]) in content
    assert "2 deliveries: 1 queued, 1 sent." in content
    assert f"{reverse(CHANGELIST)}?email__id__exact={email.pk}" in content
    assert 'name="_save"' not in content


def test_email_page_queries_do_not_grow_with_recipients(admin_client):
    small = enqueue_email("Small", "b", None, [f"s{i}@example.com" for i in range(3)])
    big = enqueue_email("Big", "b", None, [f"b{i}@example.com" for i in range(150)])
    queries = []
    admin_client.get(reverse("admin:outbox_email_change", args=[small[0].email_id]))  # warm caches
    for deliveries in (small, big):
        url = reverse("admin:outbox_email_change", args=[deliveries[0].email_id])
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(url)
        assert response.status_code == 200
        queries.append([q["sql"] for q in captured.captured_queries])
    assert len(queries[0]) == len(queries[1]), queries
    content = response.content.decode()
    assert "150 deliveries: 150 queued. The first 100 are listed below." in content
    assert len(response.context["inline_admin_formsets"][0].formset.forms) == 100


# -- Django >= 6.1: the actions on the delivery page ------------------------------------


@pytest.mark.skipif(not hasattr(admin, "ActionLocation"), reason="Django >= 6.1")
def test_actions_on_the_delivery_page(admin_client):
    rows = make_rows({"abandoned": 1, "processing": 1})
    pk = rows["abandoned"][0]
    url = reverse("admin:outbox_delivery_change", args=[pk])
    response = admin_client.get(url)
    assert "Mark as sent (confirmed in the mail logs)" in response.content.decode()

    response = admin_client.post(
        url, {"CHANGE_FORM-action": "mark_sent", "_selected_action": str(pk), "index": "0"}
    )
    assert response.status_code == 302
    assert message_texts(response) == ["Marked 1 delivery as sent."]
    assert Delivery.objects.get(pk=pk).status == "sent"
    response = admin_client.get(url)  # shows (and so uses up) the message
    assert "Marked 1 delivery as sent." in response.content.decode()
    assert "outbox-status-sent" in response.content.decode()

    processing = rows["processing"][0]
    before = snapshot([processing])
    response = admin_client.post(
        reverse("admin:outbox_delivery_change", args=[processing]),
        {"CHANGE_FORM-action": "cancel", "_selected_action": str(processing), "index": "0"},
    )
    assert message_texts(response) == ["Cancelled 0 deliveries. Skipped 1: 1 processing."]
    assert snapshot([processing]) == before
