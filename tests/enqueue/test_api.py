"""enqueue_email: rows per recipient, transactions, validation, idempotency, Redis mirror."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.db import connection, connections, transaction
from django.utils import timezone

from outbox import aenqueue_email, enqueue_email, enqueue_many
from outbox.backends import OutboxBackend
from outbox.mail.message_id import make_message_id
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Attachment, Delivery, Email
from outbox.queue import RedisQueue
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def ready_ids(queue: RedisQueue, priority: str = "normal") -> list[int]:
    return [int(x) for x in queue.redis.lrange(queue.ready_key(priority), 0, -1)]


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


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"recipient_list": []}, "recipient_list"),
        ({"recipient_list": [""]}, "recipient_list"),
        ({"recipient_list": ["not-an-address"]}, "recipient_list"),
        (
            {"recipient_list": ["a@example.com", "b@example.com\r\nBcc: x@evil.com"]},
            "recipient_list",
        ),
        ({"recipient_list": ["a@example.com, b@example.com"]}, "recipient_list"),
        ({"from_email": "nobody"}, "from_email"),
        ({"from_email": "a@example.com\nBcc: x@evil.com"}, "from_email"),
        ({"subject": "Hello\r\nBcc: x@evil.com"}, "subject"),
        ({"subject": "Hello\nthere"}, "subject"),
        ({"subject": "Hello\u2028there"}, "subject"),
        ({"message": "body with NUL \x00"}, "message"),
        ({"headers": {"X-Evil\r\nBcc": "x"}}, "headers"),
        ({"headers": {"X-Ok": "value\r\nBcc: x@evil.com"}}, "headers"),
        ({"headers": {"Message-ID": "<mine@example.com>"}}, "headers"),
        ({"reply_to": ["bad address"]}, "reply_to"),
        ({"priority": "urgent"}, "priority"),
        ({"send_at": datetime(2030, 1, 1)}, "send_at"),  # naive
        ({"max_attempts": 0}, "max_attempts"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"attachments": [("a\r\nb.txt", b"x", "text/plain")]}, "attachments"),
    ],
)
def test_bad_input_raises_validation_error_and_writes_nothing(kwargs, field, queue):
    args = {
        "subject": "s",
        "message": "b",
        "from_email": "shop@example.com",
        "recipient_list": ["a@example.com"],
    }
    args.update(kwargs)
    with pytest.raises(ValidationError) as info:
        enqueue_email(**args)
    assert field in info.value.message_dict
    assert Email.objects.count() == 0 and Delivery.objects.count() == 0
    assert queue.redis.dbsize() == 0


@pytest.mark.parametrize(
    ("field", "value", "code", "message"),
    [
        ("recipient_list", "bad@@x", "invalid", "'bad@@x' in recipient_list is not a valid"),
        ("recipient_list", "not-an-address", "invalid", "is not a valid email address"),
        ("recipient_list", "Bob <b@example.com", "invalid", "is not a valid email address"),
        ("recipient_list", "   ", "required", "An address in recipient_list is empty."),
        (
            "recipient_list",
            "a@example.com, b@example.com",
            "multiple",
            "recipient_list takes one address per string, "
            "and 'a@example.com, b@example.com' holds several.",
        ),
        ("recipient_list", "a@x.com; b@y.com", "multiple", "holds several"),
        ("recipient_list", "A <a@x.com>, B <b@y.com>", "multiple", "holds several"),
        ("from_email", "a@example.com, b@example.com", "multiple", "from_email takes one"),
        ("from_email", "bad@@x", "invalid", "'bad@@x' in from_email is not a valid"),
        ("from_email", "", "required", "An address in from_email is empty."),
        ("reply_to", "x@" + "a" * 320 + ".com", "max_length", "longer than 320 characters"),
        ("recipient_list", [], "required", "recipient_list is empty: at least one recipient"),
    ],
)
def test_each_bad_address_gets_its_own_message(field, value, code, message, queue):
    args = {
        "subject": "s",
        "message": "b",
        "from_email": "shop@example.com",
        "recipient_list": ["a@example.com"],
    }
    args[field] = value if field == "from_email" or isinstance(value, list) else [value]
    with pytest.raises(ValidationError) as info:
        enqueue_email(**args)
    [error] = info.value.error_dict[field]
    assert error.code == code
    assert message in error.messages[0]
    assert Email.objects.count() == 0 and Delivery.objects.count() == 0
    assert queue.redis.dbsize() == 0


@pytest.mark.parametrize(
    ("value", "translated"),
    [
        ("bad@@x", "%(value)r in %(field)s is not a valid email address."),
        (
            "a@x.com, b@x.com",
            "%(field)s takes one address per string, and %(value)r holds several.",
        ),
        ("", "An address in %(field)s is empty."),
    ],
)
def test_address_messages_go_through_gettext(value, translated, monkeypatch):
    from outbox.validation import addresses

    seen: list[str] = []
    monkeypatch.setattr(addresses, "_", lambda text: seen.append(text) or f"[{text}]")
    with pytest.raises(ValidationError) as info:
        addresses.normalize_address("reply_to", value)
    assert seen == [translated]
    message = info.value.message_dict["reply_to"][0]
    assert message.startswith("[") and message.endswith("]") and "reply_to" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"recipient_list": "a@example.com"},  # a string, not a list
        {"recipient_list": [42]},
        {"subject": None},
        {"message": b"bytes"},
        {"headers": ["X-A", "b"]},
        {"send_at": "tomorrow"},
        {"max_attempts": "3"},
        {"max_attempts": True},
        {"attachments": ["file.txt"]},
    ],
)
def test_wrong_types_raise_type_error(kwargs):
    args = {"subject": "s", "message": "b", "from_email": None, "recipient_list": ["a@example.com"]}
    args.update(kwargs)
    with pytest.raises(TypeError):
        enqueue_email(**args)
    assert Delivery.objects.count() == 0


def test_idempotency_key_returns_existing_deliveries():
    first = enqueue_email(
        "s", "b", None, ["a@example.com", "b@example.com"], idempotency_key="order-1"
    )
    again = enqueue_email(
        "s", "b", None, ["a@example.com", "b@example.com"], idempotency_key="order-1"
    )
    assert [d.pk for d in again] == [d.pk for d in first]
    assert Delivery.objects.count() == 2 and Email.objects.count() == 1
    # A new recipient under the same key gets a delivery; the old ones are reused.
    third = enqueue_email(
        "s", "b", None, ["b@example.com", "c@example.com"], idempotency_key="order-1"
    )
    assert third[0].pk == first[1].pk
    assert Delivery.objects.count() == 3


def test_idempotency_under_a_race(queue):
    barrier = threading.Barrier(4)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            barrier.wait()
            deliveries = enqueue_email(
                "s", "b", None, ["a@example.com", "b@example.com"], idempotency_key="race"
            )
            results.append(sorted(d.pk for d in deliveries))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert Delivery.objects.count() == 2
    assert len({tuple(r) for r in results}) == 1
    assert Email.objects.count() == 1  # the losers' Email rows were removed
    assert sorted(ready_ids(queue)) == results[0]


# The same person, written another way: the retry must find the first call's row.
SAME_ADDRESS = {
    "a display name": ("bob@example.com", "Bob <bob@example.com>"),
    "another case": ("alice@example.com", "ALICE@Example.com"),
    "an IDN domain in its Unicode and IDNA forms": ("a@bücher.de", "A@XN--BCHER-KVA.DE"),
}


@pytest.mark.parametrize("first, retry", SAME_ADDRESS.values(), ids=SAME_ADDRESS.keys())
def test_a_retry_under_the_same_key_matches_the_address_however_written(first, retry, queue):
    """Before, the key matched the recipient as written: a second delivery, a second email."""
    [made] = enqueue_email("s", "b", None, [first], idempotency_key="signup-7")
    [again] = enqueue_email("s", "b", None, [retry], idempotency_key="signup-7")
    assert again.pk == made.pk
    assert Delivery.objects.count() == 1 and Email.objects.count() == 1
    assert ready_ids(queue) == [made.pk]


def test_idempotency_under_a_race_of_differently_written_addresses(queue):
    """The unique constraint is on (key, normalised address): one row, whichever call wins."""
    forms = ["bob@example.com", "Bob <bob@example.com>", "BOB@example.com", "Bob <Bob@Example.COM>"]
    barrier = threading.Barrier(len(forms))
    results: list[int] = []
    errors: list[BaseException] = []

    def call(recipient: str) -> None:
        try:
            barrier.wait()
            [delivery] = enqueue_email("s", "b", None, [recipient], idempotency_key="race")
            results.append(delivery.pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(form,)) for form in forms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert Delivery.objects.count() == 1 and len(set(results)) == 1
    assert ready_ids(queue) == results[:1]


# The one way in for a sender's own Message-ID (enqueue_email refuses the header),
# for one recipient (the case where the sender's ID is kept as it is): the drop-in
# backend, through each write path (on PostgreSQL, an attachment takes the ORM's).
OWN_MESSAGE_ID_SENDS = {"the drop-in backend": [], "with an attachment": [("a.txt", "x", None)]}


def drop_in_send(message_id: str, attachments: list[tuple[str, str, None]]) -> Delivery:
    message = EmailMessage(
        "s",
        "b",
        None,
        ["customer@example.com"],
        headers={"Message-ID": message_id},
        attachments=attachments,
    )
    assert OutboxBackend().send_messages([message]) == 1
    return Delivery.objects.latest("pk")  # this caller's: the other's, if any, came first


def waiting_in_the_database(thread: threading.Thread, backend_pid: dict[str, int]) -> bool:
    """Whether ``thread`` waits for the database: a lock (PostgreSQL), the write lock (SQLite)."""
    if connection.vendor == "postgresql":
        if "second" not in backend_pid:
            return False
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                [backend_pid["second"]],
            )
            row = cursor.fetchone()
        return row is not None and row[0] == "Lock"
    # SQLite: in the driver's call that begins its transaction, in the busy
    # handler, where BEGIN IMMEDIATE waits for the first transaction's write lock.
    frame = sys._current_frames().get(thread.ident or 0)
    return (
        frame is not None
        and frame.f_code.co_filename.endswith(os.path.join("sqlite3", "base.py"))
        and str(frame.f_locals.get("query", "")).startswith("BEGIN")
    )


@pytest.mark.parametrize(
    "attachments", OWN_MESSAGE_ID_SENDS.values(), ids=OWN_MESSAGE_ID_SENDS.keys()
)
def test_two_concurrent_sends_of_one_message_id_both_commit_as_if_one_after_the_other(
    attachments, queue
):
    """Each caller sends in its transaction beside its own row; the first holds it open.

    Before, on PostgreSQL the second caller's insert waited for the first and
    then raised IntegrityError (outbox_delivery_message_id_uniq) inside its
    transaction, losing its own row too. On SQLite the second waits for the
    write lock before it looks, and finds the ID taken.
    """
    message_id = "<order-42@shop.example>"
    first_sent, second_waits = threading.Event(), threading.Event()
    backend_pid: dict[str, int] = {}
    sent: dict[str, Delivery] = {}
    errors: dict[str, BaseException] = {}

    def caller(name: str) -> None:
        try:
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_backend_pid()")
                        backend_pid[name] = cursor.fetchone()[0]
                Group.objects.create(name=f"{name} caller's own row")
                sent[name] = drop_in_send(message_id, attachments)
                if name == "first":
                    first_sent.set()
                    # Open until the second has tried: it waits on this transaction.
                    assert second_waits.wait(20)
        except BaseException as exc:
            errors[name] = exc
        finally:
            first_sent.set()
            connection.close()

    first = threading.Thread(target=caller, args=("first",))
    first.start()
    assert first_sent.wait(20)
    second = threading.Thread(target=caller, args=("second",))
    second.start()
    try:
        wait_until(lambda: waiting_in_the_database(second, backend_pid), 20)
    finally:
        second_waits.set()
        first.join(30)
        second.join(30)
    assert errors == {}
    # Both callers' own work committed, with their mail.
    assert set(Group.objects.values_list("name", flat=True)) == {
        "first caller's own row",
        "second caller's own row",
    }
    rows = {name: Delivery.objects.get(pk=d.pk) for name, d in sent.items()}
    # The first keeps the sender's ID; the second gets what a second send gets
    # (tests/backends/test_drop_in.py, test_a_reused_message_id_gets_a_unique_one).
    assert rows["first"].message_id == message_id
    assert re.fullmatch(r"<order-42\.[0-9a-f]{32}@shop\.example>", rows["second"].message_id)
    assert sent["second"].message_id == rows["second"].message_id
    assert Email.objects.count() == 2  # no email left without its delivery
    assert sorted(ready_ids(queue)) == sorted(d.pk for d in rows.values())


def test_every_enqueue_path_writes_the_normalised_address(queue):
    """recipient_key, what idempotency and the admin's search match on, on every insert path."""

    def every_path() -> dict[str, str]:
        enqueue_email("s", "b", None, ["One <ONE@Example.com>"])  # one recipient
        enqueue_email("s", "b", None, ["Two <two@EXAMPLE.com>", "three@bücher.de"])
        enqueue_email("s", "b", None, ["Four@Example.com"], idempotency_key="k")  # the ORM
        enqueue_email("s", "b", None, ["Five@Example.com"], attachments=[("a.txt", "x", None)])
        enqueue_many([{"subject": "s", "message": "b", "recipient_list": ["Six <SIX@x.org>"]}])
        OutboxBackend().send_messages([EmailMessage("s", "b", None, ["Seven <SEVEN@x.org>"])])
        asyncio.run(aenqueue_email("s", "b", None, ["Eight@X.org"]))
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
        rows = dict(Delivery.objects.values_list("recipient", "recipient_key"))
        Delivery.objects.all().delete()
        return rows

    expected = {
        "One <ONE@Example.com>": "one@example.com",
        "Two <two@EXAMPLE.com>": "two@example.com",
        "three@bücher.de": "three@xn--bcher-kva.de",
        "Four@Example.com": "four@example.com",
        "Five@Example.com": "five@example.com",
        "Six <SIX@x.org>": "six@x.org",
        "Seven <SEVEN@x.org>": "seven@x.org",
        "Eight@X.org": "eight@x.org",
    }
    assert every_path() == expected


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


# -- PostgreSQL: every common-case call runs a function -------------------------------------

# Calls with one recipient run outbox_enqueue_one(), the others outbox_enqueue().
FUNCTION_CASES = {
    "one recipient": dict(to=["a@example.com"]),
    "one suppressed recipient": dict(to=["Blocked@Example.com"]),
    "one recipient, scheduled, expiring, low priority, reply-to, headers, a mailer": dict(
        to=["a@example.com"],
        send_at=timezone.now() + timedelta(days=2),
        expires_at=timezone.now() + timedelta(days=3),
        priority="low",
        max_attempts=2,
        reply_to=["r@example.com"],
        headers={"X-Tag": "t"},
        html_message="<p>b</p>",
        mailer="bulk",
    ),
    "several, one suppressed with a reason, one without": dict(
        to=["a@example.com", "Blocked@Example.com", "quiet@example.com", "c@x.org"]
    ),
    "several, scheduled, expiring, high priority, a mailer": dict(
        to=["a@example.com", "b@example.com"],
        send_at=timezone.now() + timedelta(days=2),
        expires_at=timezone.now() + timedelta(days=3),
        priority="high",
        max_attempts=3,
        mailer="bulk",
    ),
}
DELIVERY_COLUMNS = (
    "recipient",
    "recipient_key",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "expires_at",
    "worker_id",
    "last_error",
    "claim_token",
)
EMAIL_COLUMNS = (
    "subject",
    "body",
    "html_message",
    "from_email",
    "reply_to",
    "headers",
    "mailer",
    "structure",
)


def _function_calls() -> dict[str, int]:
    """Calls of each PL/pgSQL function in this transaction (``track_functions`` set in it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions")
        return dict(cursor.fetchall())


@pytest.mark.parametrize("drop_in", [False, True], ids=["enqueue_email", "drop-in backend"])
@pytest.mark.parametrize("case", FUNCTION_CASES.values(), ids=FUNCTION_CASES.keys())
def test_postgresql_writes_through_a_function_the_rows_the_orm_path_writes(settings, case, drop_in):
    """enqueue_email and a drop-in message (its structure) both go through the functions.

    The rows must be those of the general path (the ORM's, taken with an
    idempotency key): the suppression list's text included.
    """
    if connection.vendor != "postgresql":
        pytest.skip("PL/pgSQL exists on PostgreSQL only")
    from dataclasses import replace

    from outbox import suppress
    from outbox.enqueue.api import write_prepared
    from outbox.enqueue.messages import prepare_message
    from outbox.enqueue.prepare import prepare

    suppress("blocked@example.com", "hard bounce")
    suppress("quiet@example.com")
    bulk = {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}
    if HAS_MAILERS:
        settings.MAILERS = {**settings.MAILERS, "bulk": bulk}
    else:
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {"bulk": bulk}}
    case = dict(case)
    to = case.pop("to")
    if drop_in:
        message = EmailMessage("s", "b", "from@example.com", to, headers=case.get("headers"))
        if case.get("html_message"):
            message = EmailMultiAlternatives(
                "s", "b", "from@example.com", to, headers=case.get("headers")
            )
            message.attach_alternative(case["html_message"], "text/html")
        message.reply_to = case.get("reply_to", [])
        p = prepare_message(
            message,
            priority=case.get("priority", "normal"),
            max_attempts=case.get("max_attempts"),
            mailer=case.get("mailer"),
        )
        p = replace(p, send_at=case.get("send_at"), expires_at=case.get("expires_at"))
        assert p.structure is not None
    else:
        p = prepare(
            "s",
            "b",
            "from@example.com",
            to,
            html_message=case.get("html_message", ""),
            reply_to=case.get("reply_to"),
            headers=case.get("headers"),
            attachments=None,
            send_at=case.get("send_at"),
            priority=case.get("priority", "normal"),
            idempotency_key=None,
            max_attempts=case.get("max_attempts"),
            expires_at=case.get("expires_at"),
            mailer=case.get("mailer"),
        )
        assert p.structure is None

    def written(deliveries: list[Delivery]) -> tuple[Any, ...]:
        rows = list(
            Delivery.objects.filter(pk__in=[d.pk for d in deliveries])
            .order_by("recipient")  # the two paths need not insert in the same order
            .values_list(*DELIVERY_COLUMNS)
        )
        (email,) = Email.objects.filter(pk=deliveries[0].email_id).values_list(*EMAIL_COLUMNS)
        returned = sorted((d.recipient, d.status, d.last_error) for d in deliveries)
        return returned, rows, email

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL track_functions = 'pl'")
        [by_function] = write_prepared([p])
        called = _function_calls()
    one = len(to) == 1
    assert called == {("outbox_enqueue_one" if one else "outbox_enqueue"): 1}
    [by_orm] = write_prepared([replace(p, idempotency_key="the ORM's path")])
    assert written(by_function) == written(by_orm)
    assert len(by_function) == len(to)
    suppressed = {"Blocked@Example.com", "quiet@example.com"}.intersection(to)
    cancelled = [d for d in by_function if d.status == Delivery.Status.CANCELLED]
    assert len(cancelled) == len(suppressed)  # the case did meet the suppression list
