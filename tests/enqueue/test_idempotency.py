"""The same send twice: idempotency keys, one sender's Message-ID, the normalised address.

An idempotency key returns the first call's deliveries, also under a race and
however the address was written the second time (``recipient_key``, written on
every enqueue path); two concurrent drop-in sends of one Message-ID both
commit, as if one came after the other.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.core.mail import EmailMessage
from django.db import connection, connections, transaction

from outbox import aenqueue_email, enqueue_email, enqueue_many
from outbox.backends import OutboxBackend
from outbox.models import Delivery, Email
from tests.enqueue.ready import ready_ids
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


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
