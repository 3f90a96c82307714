"""Secrets that do not linger: the content retention, sensitive mail, and who may see content.

Through the doors users use: ``enqueue_email``, the drop-in backend and Django's
password-reset view, a worker, ``outbox_sweep``, the admin's pages and actions.
After the retention every outbox table is read, column by column, for a
marker the content carried.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.mail import EmailMultiAlternatives
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from outbox import enqueue_email, enqueue_many, enqueue_template, operations
from outbox.models import Attempt, Delivery, Email
from outbox.queue import QueueEntry
from outbox.sweeper import Sweeper, retention
from tests.delivery import deliver, use_outbox
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
MARKER = "s3cret-Reset-Token-7f3a9c"


@pytest.fixture
def outbox(settings) -> None:
    use_outbox(settings)


def outbox_cells() -> Iterator[tuple[str, str, object]]:
    """Every value of every column of every outbox table: (table, column, value)."""
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            if not table.startswith("outbox_"):
                continue
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            names = [column[0] for column in cursor.description]
            for row in cursor.fetchall():
                for name, value in zip(names, row, strict=True):
                    yield table, name, value


def where_marker() -> set[tuple[str, str]]:
    """The (table, column) pairs holding the marker, as text or as bytes."""
    found = set()
    for table, column, value in outbox_cells():
        if isinstance(value, memoryview | bytes | bytearray):
            value = bytes(value).decode("latin-1")
        if value is not None and MARKER in str(value):
            found.add((table, column))
    return found


def sweep() -> str:
    out = io.StringIO()
    call_command("outbox_sweep", stdout=out)
    return out.getvalue()


def drop_in_message(to: list[str]) -> EmailMultiAlternatives:
    message = EmailMultiAlternatives(
        "Your reset link", f"Text {MARKER}", None, to, headers={"X-Token": MARKER}
    )
    message.attach_alternative(f"<p>{MARKER}</p>", "text/html")
    message.attach_alternative(f"plain alternative {MARKER}", "text/x-other")
    message.attach("secret.txt", f"file {MARKER}".encode(), "text/plain")
    message.metadata = {"token": MARKER}  # anymail's attribute: stored in the structure
    return message


def every_way_in(outbox) -> None:
    """The marker in every place content is stored, by every path."""
    enqueue_email(
        "Welcome",
        f"Body {MARKER}",
        None,
        ["a@example.com", "b@example.com"],
        html_message=f"<b>{MARKER}</b>",
        headers={"X-Ref": MARKER},
        attachments=[("a.bin", f"bytes {MARKER}".encode(), "application/octet-stream")],
    )
    drop_in_message(["c@example.com", "d@example.com"]).send()
    enqueue_many([{"subject": "Bulk", "message": MARKER, "recipient_list": ["e@example.com"]}])


def test_after_the_retention_no_content_is_left_in_any_outbox_table(outbox, settings):
    every_way_in(outbox)
    assert {("outbox_email", c) for c in ("body", "html_message", "headers", "structure")} | {
        ("outbox_attachment", "content")
    } <= where_marker()
    deliver()
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT}
    before = list(
        Delivery.objects.order_by("pk").values_list(
            "recipient", "email__subject", "status", "message_id", "attempts"
        )
    )
    attempts = Attempt.objects.count()
    # Within the retention (the default three days) the content stays.
    assert "content cleared" not in sweep()
    assert where_marker()

    settings.OUTBOX = {**settings.OUTBOX, "CONTENT_RETENTION": 0.5}
    wait_until(lambda: sweep() and not Email.objects.filter(content_cleared_at=None).exists())
    assert where_marker() == set()
    # The rows keep what says who got what, when, and how it went.
    after = Delivery.objects.order_by("pk").values_list(
        "recipient", "email__subject", "status", "message_id", "attempts"
    )
    assert list(after) == before
    assert Attempt.objects.count() == attempts
    assert Email.objects.filter(content_cleared_at__isnull=True).count() == 0
    assert sweep().count("content cleared") == 0  # nothing twice


def test_content_stays_while_a_delivery_may_still_be_sent(outbox, settings, queue):
    later = timezone.now() + timedelta(hours=1)
    enqueue_email("Later", MARKER, None, ["a@example.com"], send_at=later)
    [doubt, cancelled] = enqueue_email("Now", MARKER, None, ["b@example.com", "c@example.com"])
    operations.cancel([cancelled.pk], "admin:test")
    Delivery.objects.filter(pk=doubt.pk).update(status=Status.ABANDONED)  # for a person
    settings.OUTBOX = {**settings.OUTBOX, "CONTENT_RETENTION": 0.5}
    settled = timezone.now().timestamp()
    wait_until(lambda: queue.time() > settled + 1)
    sweep()
    # Queued (scheduled) and abandoned rows may still be sent: their content stays.
    assert Email.objects.filter(content_cleared_at__isnull=True).count() == 2
    assert where_marker() >= {("outbox_email", "body")}


def test_sensitive_mail_is_cleared_at_the_first_sweep_after_it_is_settled(outbox):
    enqueue_email("Your code", f"Code {MARKER}", None, ["a@example.com"], sensitive=True)
    message = drop_in_message(["b@example.com"])
    message.outbox_sensitive = True
    message.send()
    enqueue_email("Newsletter", "no secret here", None, ["c@example.com"])
    assert list(Email.objects.order_by("pk").values_list("sensitive", flat=True)) == [
        True,
        True,
        False,
    ]
    assert "content cleared" not in sweep()  # not settled yet
    deliver()
    assert "content cleared 2" in sweep()
    assert where_marker() == set()
    assert Email.objects.get(subject="Newsletter").body == "no secret here"


def test_sensitive_is_true_or_false():
    with pytest.raises(TypeError, match="sensitive"):
        enqueue_email("s", "b", None, ["a@example.com"], sensitive="yes")


def test_sensitive_on_every_enqueue_path(outbox):
    enqueue_template("outbox_test/welcome", {"name": "A"}, None, ["a@x.com"], sensitive=True)
    enqueue_many(
        [
            {"subject": "s", "message": "b", "recipient_list": ["b@x.com"], "sensitive": True},
            {"template": "outbox_test/welcome", "recipient_list": ["c@x.com"], "sensitive": True},
            {"subject": "s", "message": "b", "recipient_list": ["d@x.com"]},
        ]
    )
    sensitive = Email.objects.order_by("pk").values_list("sensitive", flat=True)
    assert list(sensitive) == [True, True, True, False]


def requeue_in_admin(client: Client, delivery: Delivery) -> str:
    url = reverse("admin:outbox_delivery_changelist")
    response = client.post(
        url, {"action": "requeue", "_selected_action": [delivery.pk]}, follow=True
    )
    return " ".join(str(m) for m in response.context["messages"])


def test_a_row_whose_content_is_cleared_cannot_be_requeued(outbox, admin_client, outbox_mail):
    [row] = enqueue_email("Your code", MARKER, None, ["a@example.com"], sensitive=True)
    operations.cancel([row.pk], "admin:test")
    assert "content cleared 1" in sweep()
    said = requeue_in_admin(admin_client, row)
    assert "Requeued 0 deliveries" in said
    assert "1 whose content was cleared" in said
    assert Delivery.objects.get(pk=row.pk).status == Status.CANCELLED
    result = operations.requeue([row.pk], "admin:test")
    assert (result.changed, dict(result.skipped)) == ([], {operations.CONTENT_CLEARED: 1})
    # A requeue within the retention still works.
    [other] = enqueue_email("Order", "kept", None, ["b@example.com"])
    operations.cancel([other.pk], "admin:test")
    sweep()
    assert "Requeued 1 delivery" in requeue_in_admin(admin_client, other)


def test_a_worker_never_sends_an_empty_message(outbox, queue, outbox_mail):
    """A requeue that crossed the clearing (the race the module docstring names): failed, unsent."""
    [row] = enqueue_email("Your code", MARKER, None, ["a@example.com"], sensitive=True)
    operations.cancel([row.pk], "admin:test")
    sweep()
    # What a requeue committing during the clearing's UPDATE leaves behind.
    Delivery.objects.filter(pk=row.pk).update(status=Status.QUEUED, attempts=0)
    queue.push([QueueEntry(row.pk, "normal", 0.0)], force=True)
    deliver()
    row.refresh_from_db()
    assert row.status == Status.FAILED and "content was cleared" in row.last_error
    assert outbox_mail == []


def test_no_content_is_cleared_while_a_worker_of_an_earlier_release_runs(outbox, queue):
    """A rolling upgrade: 0.1.0's workers announce no release level, and would send a
    cleared email empty if that release's requeue gave them one (queue/reliable.py)."""
    [row] = enqueue_email("Your code", MARKER, None, ["a@example.com"], sensitive=True)
    operations.cancel([row.pk], "admin:test")
    queue.register("current#1")  # this release's worker: its level first
    # 0.1.0's registration, as its register.lua writes it: no level.
    queue.redis.zadd(queue.workers_key, {"earlier#1": queue.time()})
    assert queue.earlier_releases() == ["earlier#1"]
    assert "content cleared" not in sweep()
    assert ("outbox_email", "body") in where_marker()
    queue.give_back("earlier#1", [], deregister=True)  # the old worker stops
    assert queue.earlier_releases() == []
    assert "content cleared 1" in sweep()
    assert where_marker() == set()
    queue.give_back("current#1", [], deregister=True)
    assert queue.redis.hlen(queue.releases_key) == 0  # a level lives as long as its incarnation


# -- the admin -------------------------------------------------------------------------


def staff(django_user_model, name: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(name, password="pw-12345-abc", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def admin_pages(email: Email, delivery: Delivery) -> dict[str, str]:
    return {
        "email": reverse("admin:outbox_email_change", args=[email.pk]),
        "email history": reverse("admin:outbox_email_history", args=[email.pk]),
        "emails": reverse("admin:outbox_email_changelist"),
        "emails searched": reverse("admin:outbox_email_changelist") + "?q=Welcome",
        "delivery": reverse("admin:outbox_delivery_change", args=[delivery.pk]),
        "delivery history": reverse("admin:outbox_delivery_history", args=[delivery.pk]),
        "deliveries": reverse("admin:outbox_delivery_changelist"),
        "dashboard": reverse("admin:outbox_dashboard"),
    }


def test_content_needs_its_own_permission_on_every_admin_page(outbox, django_user_model):
    every_way_in(outbox)
    deliver()
    viewer = staff(django_user_model, "viewer", "view_email", "view_delivery")
    reader = staff(django_user_model, "reader", "view_email", "view_delivery", "view_email_content")
    for email in Email.objects.all():
        delivery = email.deliveries.first()
        for name, url in admin_pages(email, delivery).items():
            response = viewer.get(url)
            assert response.status_code == 200, name
            assert MARKER not in response.content.decode(), name
        page = viewer.get(admin_pages(email, delivery)["email"]).content.decode()
        assert "outbox.view_email_content" in page
        assert "secret.txt" not in page  # the attachments too
        assert MARKER in reader.get(admin_pages(email, delivery)["email"]).content.decode()
    # A filter on the body would tell it match by match: refused without the permission.
    probe = reverse("admin:outbox_email_changelist") + f"?body__contains={MARKER[:6]}"
    assert viewer.get(probe).status_code == 400
    assert reader.get(probe).status_code == 200
    drop_in = Email.objects.get(subject="Your reset link")
    assert (
        "secret.txt"
        in reader.get(admin_pages(drop_in, drop_in.deliveries.first())["email"]).content.decode()
    )


def test_the_admin_says_when_the_content_was_cleared(outbox, admin_client):
    [row] = enqueue_email("Your code", MARKER, None, ["a@example.com"], sensitive=True)
    operations.cancel([row.pk], "admin:test")
    sweep()
    page = admin_client.get(reverse("admin:outbox_email_change", args=[row.email_id]))
    assert "Cleared on" in page.content.decode() and MARKER not in page.content.decode()


# -- Django's password reset, marked by one setting -------------------------------------


def test_the_password_reset_view_is_sensitive_with_one_setting(
    outbox, settings, client, outbox_mail
):
    settings.OUTBOX = {**settings.OUTBOX, "SENSITIVE_LINKS": ["password_reset_confirm"]}
    User.objects.create_user("alice", "alice@example.com", "old-password-1")
    response = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    assert response.status_code == 302
    email = Email.objects.get()
    assert email.sensitive
    link = re.search(r"/accounts/reset/\S+/", email.body)
    assert link
    deliver()
    assert link.group(0) in outbox_mail[0].body
    assert "content cleared 1" in sweep()
    email.refresh_from_db()
    assert email.body == "" and email.content_cleared_at is not None
    token = link.group(0).rstrip("/").rsplit("/", 1)[1]
    assert not any(token in str(value) for _t, _c, value in outbox_cells())
    # Mail that links elsewhere is not sensitive.
    enqueue_email("News", "see http://testserver/accounts/login/", None, ["b@example.com"])
    assert not Email.objects.get(subject="News").sensitive


def test_without_the_setting_a_password_reset_keeps_its_content_for_the_retention(outbox, client):
    User.objects.create_user("alice", "alice@example.com", "old-password-1")
    client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    deliver()
    assert "content cleared" not in sweep()
    assert not Email.objects.get().sensitive and Email.objects.get().body


def test_the_sweeper_clears_in_batches(outbox, settings, monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 2)
    for n in range(5):
        enqueue_email(f"s{n}", MARKER, None, [f"a{n}@example.com"], sensitive=True)
    operations.cancel(Delivery.objects.values_list("pk", flat=True), "admin:test")
    report = Sweeper().run_pass()
    assert report.content_cleared == 5 and where_marker() == set()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite has one writer: nothing to take turns on"
)
def test_a_requeue_in_progress_keeps_its_email_from_the_clearing(outbox, queue):
    """The requeue holds the email's row (with its delivery): the pass leaves it, then sees it queued."""
    [row] = enqueue_email("Your code", MARKER, None, ["a@example.com"], sensitive=True)
    operations.cancel([row.pk], "admin:test")
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def requeue() -> None:
        try:
            with transaction.atomic():
                assert operations.requeue([row.pk], "admin:test").changed == [row.pk]
                locked.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
            locked.set()
        finally:
            connection.close()

    thread = threading.Thread(target=requeue)
    thread.start()
    assert locked.wait(10)
    assert retention.clear_content(timezone.now()) == 0  # skipped, not waited on
    release.set()
    thread.join()
    assert not errors
    assert retention.clear_content(timezone.now()) == 0  # now queued: kept
    assert Email.objects.get(pk=row.email_id).body == MARKER
