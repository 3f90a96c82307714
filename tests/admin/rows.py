"""Deliveries in each status for the admin's tests, and the admin's actions run by the test client."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery

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
