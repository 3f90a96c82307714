"""The outbox dashboard in the admin: access, the numbers on known data, the chart, the cost of a render."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from outbox import enqueue_email
from outbox.admin import dashboard
from outbox.admin.dashboard import CHART_MINUTES, age, per_minute
from outbox.models import Delivery
from outbox.queue import RedisQueue

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/outbox/dashboard/"
STATUSES = ["queued", "processing", "sent", "failed", "abandoned", "cancelled"]
ABANDONED_LIST = reverse("admin:outbox_delivery_changelist") + "?status__exact=abandoned"


def staff(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
    )
    return user


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(staff(django_user_model, "viewer", "view_delivery"))
    return client


def register_worker(queue: RedisQueue, worker_id: str, age_seconds: float, *held: int) -> None:
    queue.redis.zadd(queue.workers_key, {worker_id: queue.time() - age_seconds})
    if held:
        queue.redis.rpush(queue.processing_key(worker_id), *held)


@pytest.fixture
def known_state(queue: RedisQueue) -> dict[str, list[Delivery]]:
    """Two sent (3 minutes ago), one failed (5 minutes ago), two abandoned, one cancelled,
    one processing (held by a live worker); three queued: two due (one for two minutes),
    one scheduled. A live worker and a silent one."""
    now = timezone.now()
    done = enqueue_email(
        "Done",
        "b",
        None,
        [f"{s}@example.com" for s in ("s1", "s2", "f", "a1", "a2", "c", "p")],
    )
    statuses = ["sent", "sent", "failed", "abandoned", "abandoned", "cancelled", "processing"]
    for delivery, status in zip(done, statuses, strict=True):
        Delivery.objects.filter(pk=delivery.pk).update(
            status=status,
            sent_at=now - timedelta(minutes=3) if status == "sent" else None,
            updated_at=now - timedelta(minutes=5 if status == "failed" else 3),
        )
    queue.redis.flushdb()  # their ids left Redis long ago
    due = enqueue_email("Due", "b", None, ["due1@example.com", "due2@example.com"])
    Delivery.objects.filter(pk=due[0].pk).update(not_before=now - timedelta(minutes=2))
    later = enqueue_email("Later", "b", None, ["l@example.com"], send_at=now + timedelta(hours=1))
    register_worker(queue, "mailhost:1:live-worker", 1, done[6].pk)
    register_worker(queue, "mailhost:1:silent-worker", 600)
    return {"done": done, "due": due, "later": later}


# -- access -------------------------------------------------------------------------


def test_the_url_is_named():
    assert reverse("admin:outbox_dashboard") == URL


def test_anonymous_is_sent_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_non_staff_is_sent_to_the_login_page(client, django_user_model):
    user = django_user_model.objects.create_user("customer", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_delivery"))
    client.force_login(user)
    assert client.get(URL).status_code == 302


def test_staff_without_view_delivery_is_403(client, django_user_model):
    client.force_login(staff(django_user_model, "other", "view_email"))
    assert client.get(URL).status_code == 403
    # And the app list does not offer it.
    assert URL not in client.get(reverse("admin:index")).content.decode()


def test_change_delivery_is_enough(client, django_user_model):
    client.force_login(staff(django_user_model, "changer", "change_delivery"))
    assert client.get(URL).status_code == 200


def test_superuser_sees_it(admin_client):
    response = admin_client.get(URL)
    assert response.status_code == 200
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]


# -- the numbers on known data --------------------------------------------------------


def test_the_numbers_match_known_data(viewer, known_state):
    response = viewer.get(URL)
    assert response.status_code == 200
    context = response.context
    assert {row["status"]: row["count"] for row in context["counts"]} == {
        "queued": 3,
        "processing": 1,
        "sent": 2,
        "failed": 1,
        "abandoned": 2,
        "cancelled": 1,
    }
    for status in STATUSES:
        assert (
            next(r["count"] for r in context["counts"] if r["status"] == status)
            == Delivery.objects.filter(status=status).count()
        )
    assert context["total"] == 10
    assert context["due"] == 2 and context["scheduled"] == 1
    assert context["oldest_due_age"].startswith("2 min")
    assert context["abandoned"] == 2
    page = response.content.decode()
    assert re.search(r'id="outbox-due">\s*2<', page)
    assert re.search(r'id="outbox-count-sent" href="[^"]*status__exact=sent">2<', page)
    assert f'id="outbox-abandoned-link" href="{escape(ABANDONED_LIST)}" class="big">2<' in page
    assert "Every number on this page is an exact count" in page and "≈" not in page


def test_workers_with_heartbeat_age_and_what_they_hold(viewer, known_state):
    response = viewer.get(URL)
    [worker] = response.context["live_workers"]
    processing = known_state["done"][6].pk
    assert worker["id"] == "mailhost:1:live-worker"
    assert worker["held_count"] == 1 and [row["id"] for row in worker["held"]] == [processing]
    assert worker["heartbeat_age"].endswith(" s")
    assert response.context["silent_workers"] == 1
    page = response.content.decode()
    assert "mailhost:1:live-worker" in page and "mailhost:1:silent-worker" not in page
    assert reverse("admin:outbox_delivery_change", args=[processing]) in page
    assert "1 live worker" in page


def test_a_worker_of_an_earlier_release_is_named(viewer, known_state, queue):
    """A rolling upgrade: 0.1.0's workers announce no level (outbox_status says the same)."""
    queue.register("mailhost:2:current")  # this release's: its level announced
    register_worker(queue, "mailhost:1:earlier", 1)  # as 0.1.0's register.lua writes it
    response = viewer.get(URL)
    workers = {w["id"]: w for w in response.context["live_workers"]}
    assert workers["mailhost:1:earlier"]["earlier_release"] == 1
    assert workers["mailhost:2:current"]["earlier_release"] is None
    page = response.content.decode()
    assert page.count("(an earlier release, level 1: content is kept)") == 2  # the fixture's too
    assert re.search(r"mailhost:1:earlier</code> <span[^>]*>\(an earlier release", page)
    assert not re.search(r"mailhost:2:current</code> <span", page)


def test_redis_agreement(viewer, known_state, queue):
    agreement = {p["key"]: p for p in viewer.get(URL).context["agreement"]}
    assert agreement["ready"]["agrees"] is True and agreement["scheduled"]["agrees"] is True
    queue.redis.delete(queue.ready_key("normal"))
    response = viewer.get(URL)
    agreement = {p["key"]: p for p in response.context["agreement"]}
    assert agreement["ready"]["agrees"] is False and agreement["ready"]["missing"] == 2
    assert "2 missing from Redis" in response.content.decode()


def test_the_chart_has_a_bar_for_the_minute_of_each_sent_and_failed_row(viewer, known_state):
    response = viewer.get(URL)
    page = response.content.decode()
    assert '<svg class="outbox-chart" role="img"' in page
    assert '<title id="outbox-chart-title">' in page and "2 sent, 1 failed" in page
    sent = Delivery.objects.filter(status="sent").first()
    failed = Delivery.objects.get(status="failed")
    assert sent is not None and sent.sent_at is not None
    sent_minute = timezone.localtime(sent.sent_at).strftime("%H:%M")
    failed_minute = timezone.localtime(failed.updated_at).strftime("%H:%M")
    bars = {(b.kind, b.minute): b.count for b in response.context["bars"]}
    assert bars == {("sent", sent_minute): 2, ("failed", failed_minute): 1}
    assert f'class="bar sent" data-minute="{sent_minute}" data-count="2"' in page
    assert f'class="bar failed" data-minute="{failed_minute}" data-count="1"' in page
    # Text labels: the peak, the zero line and clock times under the axis.
    assert 'class="peak">2</text>' in page
    assert ">0</text>" in page
    assert "<script" not in page.split('<div id="content-main">')[1]


def test_per_minute_groups_by_minute_and_ignores_older_rows(known_state):
    now = timezone.now()
    old = enqueue_email("Old", "b", None, ["old@example.com"])[0]
    Delivery.objects.filter(pk=old.pk).update(status="sent", sent_at=now - timedelta(hours=2))
    with CaptureQueriesContext(connection) as captured:
        chart = per_minute(now)
    assert len(captured) == 1
    assert len(chart.sent) == len(chart.failed) == CHART_MINUTES
    assert sum(chart.sent) == 2 and sum(chart.failed) == 1
    assert chart.sent[CHART_MINUTES - 1 - 3] == 2 or chart.sent[CHART_MINUTES - 1 - 4] == 2
    assert chart.peak == 2


def test_an_empty_outbox(viewer):
    response = viewer.get(URL)
    assert response.status_code == 200
    assert response.context["bars"] == []
    assert response.context["abandoned"] == 0
    assert "nothing is due" in response.content.decode()
    assert "0 live workers" in response.content.decode()


def test_everything_is_escaped(viewer, known_state, queue):
    register_worker(queue, "<script>alert(1)</script>", 1)
    page = viewer.get(URL).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert escape("<script>alert(1)</script>") in page


def test_redis_down_still_renders(viewer, known_state, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }
    response = viewer.get(URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="outbox-redis-down"' in page and "Redis is unavailable" in page
    assert "Not compared: Redis is unavailable." in page
    assert response.context["due"] == 2 and response.context["abandoned"] == 2
    assert "<svg" in page


# -- the link from the app list --------------------------------------------------------


def test_the_index_and_the_app_index_link_to_it(viewer):
    for url in (reverse("admin:index"), reverse("admin:app_list", args=["outbox"])):
        page = viewer.get(url).content.decode()
        assert re.search(rf'<tr class="model-dashboard[^"]*">\s*<th[^>]*>\s*<a href="{URL}"', page)
    # Other apps' sections are left alone.
    app_list = viewer.get(reverse("admin:index")).context["app_list"]
    [outbox_app] = [app for app in app_list if app["app_label"] == "outbox"]
    assert outbox_app["models"][0]["admin_url"] == URL
    others = [m for app in app_list if app["app_label"] != "outbox" for m in app["models"]]
    assert all(m.get("object_name") != "Dashboard" for m in others)


def test_install_is_idempotent_and_works_on_another_site():
    site = AdminSite(name="other")
    dashboard.install(site)
    get_urls = site.get_urls
    dashboard.install(site)
    assert site.get_urls is get_urls
    assert any(getattr(p, "name", None) == "outbox_dashboard" for p in site.get_urls())
    from outbox.compat.django import is_extended

    assert is_extended(admin.site)


# -- the cost of a render ------------------------------------------------------------


def test_a_render_runs_a_bounded_number_of_queries(viewer, queue):
    for n in range(3):
        enqueue_email(f"Batch {n}", "b", None, [f"u{n}-{i}@example.com" for i in range(1000)])
    first = Delivery.objects.order_by("pk").values("pk")
    now = timezone.now()
    Delivery.objects.filter(pk__in=first[:500]).update(status="sent", sent_at=now)
    Delivery.objects.filter(pk__in=first[500:600]).update(status="abandoned")
    assert Delivery.objects.count() == 3000
    viewer.get(URL)  # warm up (content types, connections)
    with CaptureQueriesContext(connection) as captured:
        response = viewer.get(URL)
    # The dashboard: every status but sent, sent (PostgreSQL: the table's estimated
    # size first), the due rows, the rows sent lately, the queued ids, the chart.
    expected = 7 if connection.vendor == "postgresql" else 6
    # Session, user, and the user's and group permissions: 4.
    assert len(captured) <= 4 + expected, [q["sql"] for q in captured.captured_queries]
    with CaptureQueriesContext(connection) as captured:
        dashboard.dashboard_context(admin.site)
    assert len(captured) == expected, [q["sql"] for q in captured.captured_queries]
    assert response.context["abandoned"] == 100
    assert sum(b.count for b in response.context["bars"] if b.kind == "sent") == 500


def test_the_page_marks_the_estimate_on_postgresql(viewer, monkeypatch):
    """Sent rows are estimated on PostgreSQL above ESTIMATE_ABOVE (here 20): the page says so.
    On SQLite they are counted, and the page says every number is exact."""
    monkeypatch.setattr("outbox.status.snapshot.ESTIMATE_ABOVE", 20)
    rows = enqueue_email("Sent", "b", None, [f"s{i}@example.com" for i in range(30)])
    Delivery.objects.filter(pk__in=[r.pk for r in rows]).update(
        status="sent", sent_at=timezone.now()
    )
    abandoned = enqueue_email("Abandoned", "b", None, ["a@example.com"])[0]
    Delivery.objects.filter(pk=abandoned.pk).update(status="abandoned")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE outbox_delivery")
    response = viewer.get(URL)
    page = response.content.decode()
    counts = {row["status"]: row for row in response.context["counts"]}
    assert counts["sent"]["count"] == 30 and counts["abandoned"]["count"] == 1
    estimate = '<abbr class="estimate" title="estimate, not a count">≈</abbr>'
    if connection.vendor == "postgresql":
        assert counts["sent"]["estimated"] and not counts["abandoned"]["estimated"]
        assert f'{estimate}<a id="outbox-count-sent"' in page
        assert f'{estimate}<span id="outbox-count-total">31<' in page
        assert page.count(estimate) == 2
        assert "Numbers marked ≈ are estimates, not counts" in page
        assert "Every number on this page is an exact count" not in page
    else:
        assert not any(row["estimated"] for row in counts.values())
        assert "≈" not in page
        assert "Every number on this page is an exact count" in page
    # The chart counts, whatever the table's size.
    assert sum(b.count for b in response.context["bars"] if b.kind == "sent") == 30


def test_the_agreement_over_the_limit_shows_the_counts(viewer, known_state, monkeypatch):
    monkeypatch.setattr("outbox.status.snapshot.COMPARE_LIMIT", 2)
    page = viewer.get(URL).content.decode()
    assert "not compared id by id (more than 2 ids); database 2, Redis 2" in page
    assert "not compared id by id (more than 2 ids); database 1, Redis 1" in page


def test_age():
    assert age(None) == ""
    assert age(0.43) == "0.4 s"
    assert age(42) == "42 s"
    assert age(185) == "3 min 5 s"
    assert age(7800) == "2 h 10 min"
    assert age(3 * 86400 + 4 * 3600 + 5) == "3 d 4 h"


def test_a_site_class_with_the_mixin_has_the_dashboard_through_its_own_hooks(rf, admin_user):
    from outbox.admin import DashboardSiteMixin
    from outbox.compat.django import is_extended

    class Site(DashboardSiteMixin, AdminSite):
        pass

    # Named as the routed site, so that the app list's links reverse.
    site = Site(name="admin")
    site.register(Delivery)
    dashboard.install(site)  # nothing to do: the class has it

    assert not is_extended(site)
    names = [getattr(p, "name", None) for p in site.get_urls()]
    assert names[:2] == ["outbox_dashboard", "outbox_control"]
    request = rf.get("/")
    request.user = admin_user
    outbox_app = next(a for a in site.get_app_list(request) if a["app_label"] == "outbox")
    assert outbox_app["models"][0]["object_name"] == "Dashboard"
