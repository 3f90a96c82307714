"""The emails in the admin (``outbox/admin/emails.py``): the email page, its queries, read-only rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from outbox import enqueue_email
from outbox.models import Email
from tests.admin.rows import (
    CHANGELIST,
    make_rows,
    set_status,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
