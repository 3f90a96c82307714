"""enqueue_email: rows per recipient, content stored once, transactions, the Redis mirror, statements."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from outbox import enqueue_email
from outbox.mail.message_id import make_message_id
from outbox.models import Attachment, Delivery, Email
from outbox.queue import RedisQueue
from tests.enqueue.ready import ready_ids

pytestmark = pytest.mark.django_db(transaction=True)


def all_redis_values(queue: RedisQueue) -> list[bytes]:
    values: list[bytes] = []
    for key in queue.redis.keys("*"):
        kind = queue.redis.type(key)
        if kind == b"list":
            values += queue.redis.lrange(key, 0, -1)
        elif kind == b"set":
            values += list(queue.redis.smembers(key))
        elif kind == b"zset":
            values += queue.redis.zrange(key, 0, -1)
    return values


def test_one_delivery_per_recipient_with_its_own_message_id(queue):
    deliveries = enqueue_email(
        "Your receipt", "Thanks!", "shop@example.com", ["a@example.com", "Bob <b@example.com>"]
    )
    assert [d.recipient for d in deliveries] == ["a@example.com", "Bob <b@example.com>"]
    assert Email.objects.count() == 1
    assert Delivery.objects.count() == 2
    ids = {d.message_id for d in deliveries}
    assert len(ids) == 2
    assert all(m.startswith("<") and m.endswith("@example.com>") for m in ids)
    assert all(d.status == Delivery.Status.QUEUED and d.attempts == 0 for d in deliveries)
    assert all(d.max_attempts == 5 for d in deliveries)
    assert sorted(ready_ids(queue)) == sorted(d.pk for d in deliveries)


def test_message_ids_are_unique_and_come_in_time_order():
    # In order, a delivery's unique index entry goes to the index's last page
    # (see make_message_id); unique, whatever the clock does.
    before = time.time_ns() // 1_000_000
    ids = [make_message_id("example.com") for _ in range(5000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"<[0-9a-f]{32}@example\.com>", m) for m in ids)
    stamps = [int(m[1:13], 16) for m in ids]
    assert stamps == sorted(stamps)
    assert before <= stamps[0] and stamps[-1] <= after
    # The 80 random bits differ within one millisecond, too.
    same_ms = [m for m, s in zip(ids, stamps, strict=True) if s == stamps[0]]
    assert len({m[13:33] for m in same_ms}) == len(same_ms)


def test_duplicate_recipients_are_one_recipient():
    deliveries = enqueue_email(
        "s", "b", None, ["a@example.com", "A@Example.com", "x@example.com", "a@example.com"]
    )
    assert [d.recipient for d in deliveries] == ["a@example.com", "x@example.com"]


def test_default_from_email(settings):
    settings.DEFAULT_FROM_EMAIL = "Default <noreply@example.org>"
    enqueue_email("s", "b", None, ["a@example.com"])
    assert Email.objects.get().from_email == "Default <noreply@example.org>"


def test_content_and_attachments_are_stored_once():
    recipients = [f"user{i}@example.com" for i in range(1000)]
    enqueue_email(
        "Report",
        "See attached",
        "shop@example.com",
        recipients,
        html_message="<p>See attached</p>",
        reply_to=["support@example.com"],
        headers={"X-Campaign": "spring"},
        attachments=[
            ("report.pdf", b"%PDF-1.4 data", "application/pdf"),
            ("notes.txt", "hi", None),
        ],
    )
    assert Email.objects.count() == 1
    assert Attachment.objects.count() == 2
    assert Delivery.objects.count() == 1000
    email = Email.objects.get()
    assert email.reply_to == ["support@example.com"]
    assert email.headers == {"X-Campaign": "spring"}
    notes = Attachment.objects.get(name="notes.txt")
    assert bytes(notes.content) == b"hi" and notes.mimetype == "text/plain"


def test_rollback_leaves_nothing_and_pushes_nothing(queue):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_email("s", "b", None, ["a@example.com"])
        raise RuntimeError("the order failed")
    assert Delivery.objects.count() == 0
    assert Email.objects.count() == 0
    assert queue.redis.dbsize() == 0


def test_push_happens_only_after_commit(queue):
    with transaction.atomic():
        deliveries = enqueue_email("s", "b", None, ["a@example.com"])
        assert ready_ids(queue) == []  # not yet: the caller may still roll back
    assert ready_ids(queue) == [deliveries[0].pk]


def test_only_ids_go_into_redis(queue):
    enqueue_email(
        "Secret subject",
        "secret body",
        "shop@example.com",
        ["alice@example.com"],
        send_at=timezone.now() + timedelta(hours=1),
    )
    enqueue_email("Another", "text", "shop@example.com", ["bob@example.com"])
    values = all_redis_values(queue)
    assert values
    for value in values:
        text = value.decode()
        assert "@" not in text and "secret" not in text.lower()
        assert text.replace(":", "").isdigit()


def test_keys_share_one_hash_tag(queue):
    enqueue_email("s", "b", None, ["a@example.com"])
    enqueue_email("s", "b", None, ["b@example.com"], send_at=timezone.now() + timedelta(hours=1))
    keys = [k.decode() for k in queue.redis.keys("*")]
    assert keys and all(k.startswith("{outbox}:") for k in keys)


def test_priorities_and_schedule(queue):
    high = enqueue_email("s", "b", None, ["h@example.com"], priority="high")[0]
    low = enqueue_email("s", "b", None, ["l@example.com"], priority="low")[0]
    later = timezone.now() + timedelta(minutes=5)
    scheduled = enqueue_email("s", "b", None, ["s@example.com"], send_at=later)[0]
    assert ready_ids(queue, "high") == [high.pk]
    assert ready_ids(queue, "low") == [low.pk]
    assert ready_ids(queue, "normal") == []
    members = queue.redis.zrange(queue.scheduled_key, 0, -1, withscores=True)
    assert members == [(f"{scheduled.pk}:2".encode(), pytest.approx(later.timestamp()))]
    assert scheduled.not_before == later


def test_redis_down_at_enqueue_still_returns(settings, caplog):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }

    caplog.set_level("WARNING", logger="outbox.enqueue")
    deliveries = enqueue_email("s", "b", None, ["a@example.com"])
    assert Delivery.objects.filter(pk=deliveries[0].pk, status="queued").exists()
    assert "Redis is unreachable" in caplog.text


def test_ten_thousand_recipients_in_few_queries(django_assert_max_num_queries, queue):
    recipients = [f"user{i}@example.com" for i in range(10_000)]
    # One INSERT on PostgreSQL; SQLite caps parameters per statement, so
    # Django splits the insert into as many batches as that limit needs.
    fields = [f for f in Delivery._meta.concrete_fields if not f.primary_key]
    batch = connection.ops.bulk_batch_size(fields, recipients) or len(recipients)
    inserts = -(-len(recipients) // batch)
    with django_assert_max_num_queries(10 + inserts):
        deliveries = enqueue_email("Newsletter", "Hello", "news@example.com", recipients)
    assert len(deliveries) == 10_000
    assert len({d.pk for d in deliveries}) == 10_000
    assert queue.redis.llen(queue.ready_key("normal")) == 10_000
    assert queue.queued_count() == 10_000


def test_returned_deliveries_match_their_rows(django_assert_num_queries, queue):
    """The instances returned are the rows as written, their email at hand."""
    recipients = ["a@example.com", "Bob <b@example.com>", "c@example.com"]
    deliveries = enqueue_email(
        "Hello", "Body", "shop@example.com", recipients, reply_to=["r@example.com"]
    )
    with django_assert_num_queries(0):
        assert [d.email.subject for d in deliveries] == ["Hello"] * 3
        assert deliveries[0].email.reply_to == ["r@example.com"]
    fields = [f.attname for f in Delivery._meta.concrete_fields]
    for delivery in deliveries:
        row = Delivery.objects.get(pk=delivery.pk)
        assert {f: getattr(delivery, f) for f in fields} == {f: getattr(row, f) for f in fields}
        assert not delivery._state.adding
    assert [d.recipient for d in deliveries] == recipients
    assert Email.objects.get().headers == {}


def test_one_recipient_call_is_one_statement_on_postgresql(django_assert_num_queries):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: elsewhere the email and its deliveries are two INSERTs")
    with django_assert_num_queries(1):
        enqueue_email("s", "b", None, ["a@example.com"])
    assert Delivery.objects.get().email.subject == "s"


def test_max_attempts_setting_and_override(settings):
    settings.OUTBOX = {**settings.OUTBOX, "MAX_ATTEMPTS": 9}
    assert enqueue_email("s", "b", None, ["a@example.com"])[0].max_attempts == 9
    assert enqueue_email("s", "b", None, ["b@example.com"], max_attempts=2)[0].max_attempts == 2
