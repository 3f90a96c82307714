"""enqueue_many: personalised bulk mail, all or nothing, a fixed number of statements per chunk."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox import enqueue_many
from outbox.enqueue.bulk import CHUNK
from outbox.models import Attachment, Delivery, Email, EmailTemplate

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


@pytest.fixture
def template() -> EmailTemplate:
    return EmailTemplate.objects.create(
        name="invoice",
        subject="Invoice {{ number }} for {{ name }}",
        text="Dear {{ name }}, you owe {{ amount }}.",
        html="<p>Dear {{ name }}</p>",
    )


def items(n: int) -> list[dict]:
    return [
        {
            "template": "invoice",
            "context": {"name": f"<User {i}>", "number": i, "amount": f"{i}.00"},
            "recipient_list": [f"user{i}@example.com"],
        }
        for i in range(n)
    ]


def test_each_item_is_rendered_with_its_own_context(template, queue):
    results = enqueue_many(items(3))
    assert [len(r) for r in results] == [1, 1, 1]
    for i, [delivery] in enumerate(results):
        assert delivery.recipient == f"user{i}@example.com"
        assert delivery.status == Status.QUEUED and delivery.pk is not None
        email = Email.objects.get(pk=delivery.email_id)
        assert email.subject == f"Invoice {i} for <User {i}>"
        assert email.body == f"Dear <User {i}>, you owe {i}.00."
        assert email.html_message == f"<p>Dear &lt;User {i}&gt;</p>"
        assert delivery.email.pk == email.pk
    assert queue.waiting_ids() == {r[0].pk for r in results}


def test_plain_items_templates_keys_attachments_and_options_mix(template, queue):
    at = timezone.now() + timedelta(hours=1)
    expires = at + timedelta(hours=1)
    results = enqueue_many(
        [
            {"subject": "Plain", "message": "m", "recipient_list": ["a@example.com", "b@example.com"]},
            {"template": "invoice", "context": {"name": "x"}, "recipient_list": ["c@example.com"],
             "send_at": at, "expires_at": expires, "priority": "high", "max_attempts": 2},
            {"subject": "Keyed", "message": "m", "recipient_list": ["d@example.com"],
             "idempotency_key": "once"},
            {"subject": "Files", "message": "m", "recipient_list": ["e@example.com"],
             "attachments": [("a.txt", b"hello", "text/plain")]},
        ]
    )  # fmt: skip
    assert [[d.recipient for d in r] for r in results] == [
        ["a@example.com", "b@example.com"],
        ["c@example.com"],
        ["d@example.com"],
        ["e@example.com"],
    ]
    scheduled = Delivery.objects.get(pk=results[1][0].pk)
    assert (scheduled.not_before, scheduled.expires_at) == (at, expires)
    assert (scheduled.priority, scheduled.max_attempts) == ("high", 2)
    assert Attachment.objects.get().email_id == results[3][0].email_id
    # The keyed item is idempotent as enqueue_email is.
    [again] = enqueue_many([{"subject": "Keyed", "message": "m",
                             "recipient_list": ["d@example.com"], "idempotency_key": "once"}])  # fmt: skip
    assert [d.pk for d in again] == [results[2][0].pk]
    # Scheduled or ready, every row waits in Redis.
    assert queue.waiting_ids() == {d.pk for r in results for d in r}


@pytest.mark.parametrize(
    ("bad", "key"),
    [
        ({"recipient_list": ["not an address"]}, "items[2].recipient_list"),
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "items[2].expires_at"),
        ({"template": "no-such-template"}, "items[2].template"),
        ({"context": {"name": "x"}, "template": "broken"}, "items[2].template"),
    ],
)
def test_one_bad_item_names_its_index_and_nothing_is_written(template, queue, bad, key):
    EmailTemplate.objects.create(name="broken", subject="{% if %}", text="x")
    batch = items(5)
    batch[2] = {**batch[2], **bad}
    with pytest.raises(ValidationError) as info:
        enqueue_many(batch)
    assert key in info.value.message_dict
    assert not Email.objects.exists() and not Delivery.objects.exists()
    assert queue.waiting_ids() == set()


def test_an_item_of_the_wrong_shape_is_a_type_error_naming_its_index(template):
    with pytest.raises(TypeError, match=r"items\[1\]"):
        enqueue_many([items(1)[0], ["not", "a", "dict"]])
    with pytest.raises(TypeError, match=r"items\[0\].*unexpected keyword"):
        enqueue_many([{"subject": "s", "message": "m", "recipient_list": ["a@x.com"], "colour": 1}])
    assert not Delivery.objects.exists()


def test_written_in_the_callers_transaction_and_pushed_after_commit(template, queue):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many(items(10))
        raise RuntimeError("roll back")
    assert not Delivery.objects.exists() and queue.waiting_ids() == set()
    with transaction.atomic():
        results = enqueue_many(items(10))
        assert queue.waiting_ids() == set()  # not before the commit
    assert queue.waiting_ids() == {r[0].pk for r in results}


def statements(n: int) -> int:
    batch = items(n)
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many(batch)
    assert len(results) == n
    return len(queries.captured_queries)


def test_the_number_of_statements_does_not_grow_with_the_items_in_a_chunk(template):
    assert CHUNK >= 1000
    counts = {n: statements(n) for n in (1, 100, 1000)}
    assert counts[1] == counts[100] == counts[1000], counts
    # Template look-up, suppression look-up, the inserts (plus savepoints): a handful.
    assert counts[1] <= 8, counts
    assert Delivery.objects.count() == 1101
    assert Email.objects.count() == 1101
    # Every email got its own deliveries, none crossed over.
    mismatched = Delivery.objects.exclude(email__subject__endswith=" for <User 0>").filter(
        recipient="user0@example.com"
    )
    assert not mismatched.exists()
    for delivery in Delivery.objects.filter(
        recipient__in=["user7@example.com", "user999@example.com"]
    ):
        number = delivery.recipient.removeprefix("user").split("@")[0]
        assert delivery.email.subject == f"Invoice {number} for <User {number}>"
