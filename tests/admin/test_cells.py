"""The cells of the admin's lists (``outbox/admin/cells.py``): status badges, cut text, compact times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils.html import escape
from django.utils.text import Truncator

from outbox import enqueue_email
from outbox.admin.cells import SUBJECT_CHARS, compact_time, truncated
from outbox.models import Delivery
from tests.admin.rows import (
    CHANGELIST,
    STATUSES,
    WORKER,
    make_rows,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
