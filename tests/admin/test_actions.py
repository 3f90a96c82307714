"""The operator's actions on deliveries in the admin (``outbox/admin/deliveries.py``, ``outbox.operations``).

What each action does to rows in every status and says about the rest, what it
pushes to Redis, a selection across pages, ``processing`` rows never touched,
who may run them, and (Django 6.1) the actions on the delivery page.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.urls import reverse

from outbox.admin.deliveries import skip_reasons
from outbox.models import Attempt, Delivery
from outbox.queue import RedisQueue
from tests.admin.rows import (
    ACTIONS,
    CHANGELIST,
    Outcome,
    action_names,
    make_rows,
    message_texts,
    run_action,
    snapshot,
    staff_user,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
