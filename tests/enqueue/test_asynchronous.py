"""aenqueue_email, aenqueue_template, aenqueue_many: the sync write path, awaited from async code.

Two ways in, as sites have them. An async view under Django's AsyncClient,
driven by ``async_to_sync`` as Django's own async tests are: the sync write
then runs in the test's thread. And plain ``asyncio.run``: it runs in
asgiref's one shared thread, whose database connection the fixture below
closes. This module is its own URLconf (``pytest.mark.urls``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation, ValidationError
from django.db import connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path

import outbox
import outbox.enqueue
from outbox import (
    aenqueue_email,
    aenqueue_many,
    aenqueue_template,
    enqueue_email,
    enqueue_many,
    enqueue_template,
)
from outbox.models import Delivery, Email
from outbox.queue import RedisQueue
from outbox.signals import email_enqueued
from outbox.worker import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]

Status = Delivery.Status
TEMPLATE = "outbox_test/welcome"  # tests/templates/outbox_test/welcome/


async def order_placed(request: HttpRequest) -> JsonResponse:
    """An async view that mails its customer: the README's, answering bad input with a 400."""
    try:
        deliveries = await aenqueue_email(
            "Your order", "Thanks for your order!", None, [request.POST["email"]]
        )
    except ValidationError as exc:
        return JsonResponse(exc.message_dict, status=400)
    return JsonResponse({"ids": [d.pk for d in deliveries]})


urlpatterns = [path("order/", order_placed)]


@pytest.fixture(autouse=True)
def _close_shared_thread_connection() -> Iterator[None]:
    """Close the connection that ``asyncio.run`` code opened in asgiref's shared thread."""
    yield
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


def deliver() -> None:
    assert Worker(burst=True).run(install_signal_handlers=False) == 0


def post_order(email: str) -> Any:
    return async_to_sync(AsyncClient().post)("/order/", {"email": email})


# -- the same functions, awaitable --------------------------------------------------


@pytest.mark.parametrize(
    ("asynchronous", "synchronous"),
    [
        (aenqueue_email, enqueue_email),
        (aenqueue_template, enqueue_template),
        (aenqueue_many, enqueue_many),
    ],
)
def test_the_signatures_are_the_sync_ones(asynchronous, synchronous):
    assert inspect.signature(asynchronous) == inspect.signature(synchronous)
    assert inspect.iscoroutinefunction(asynchronous)
    assert asynchronous.__name__ == f"a{synchronous.__name__}"
    assert asynchronous.__module__ == "outbox.enqueue.asynchronous"
    assert (
        asynchronous.__name__ in outbox.__all__ and asynchronous.__name__ in outbox.enqueue.__all__
    )
    assert getattr(outbox, asynchronous.__name__) is asynchronous


def test_the_sync_function_is_refused_in_async_code_and_writes_nothing():
    """Why the a-functions exist: Django refuses the sync ORM under a running event loop."""

    async def main() -> None:
        enqueue_email("s", "b", None, ["a@example.com"])

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(main())
    assert not Delivery.objects.exists()


# -- an async view under the async test client ---------------------------------------


def test_an_async_view_enqueues_and_a_worker_delivers(queue, outbox_mail):
    response = post_order("Ann <ann@example.com>")
    assert response.status_code == 200
    ids = response.json()["ids"]
    [delivery] = Delivery.objects.filter(pk__in=ids)
    assert delivery.recipient == "Ann <ann@example.com>" and delivery.status == Status.QUEUED
    assert queue.waiting_ids() == set(ids)  # the view's call committed, then pushed

    deliver()
    delivery.refresh_from_db()
    assert delivery.status == Status.SENT
    [message] = outbox_mail
    assert message.to == ["Ann <ann@example.com>"] and message.subject == "Your order"


def test_an_async_view_gets_the_sync_validation_error_and_writes_nothing(queue):
    response = post_order("not-an-address")
    with pytest.raises(ValidationError) as sync:
        enqueue_email("Your order", "Thanks for your order!", None, ["not-an-address"])
    assert response.status_code == 400
    assert response.json() == sync.value.message_dict
    assert "recipient_list" in response.json()
    assert not Email.objects.exists() and not Delivery.objects.exists()
    assert queue.redis.dbsize() == 0


# -- plain asyncio ---------------------------------------------------------------------


def test_plain_asyncio_enqueues_with_all_three_and_a_worker_delivers(queue, outbox_mail):
    async def main() -> tuple[list[Delivery], list[Delivery], list[list[Delivery]]]:
        return await asyncio.gather(
            aenqueue_email("Hello", "Hi!", "shop@example.com", ["a@example.com", "b@example.com"]),
            aenqueue_template(TEMPLATE, {"name": "Ann"}, None, ["ann@example.com"], language="de"),
            aenqueue_many(
                [
                    {"subject": "One", "message": "1", "recipient_list": ["one@example.com"]},
                    {
                        "template": TEMPLATE,
                        "context": {"name": "Bo"},
                        "recipient_list": ["bo@x.org"],
                    },
                ]
            ),
        )

    plain, templated, many = asyncio.run(main())
    assert [d.recipient for d in plain] == ["a@example.com", "b@example.com"]
    assert [d.recipient for d in templated] == ["ann@example.com"]
    assert [[d.recipient for d in ds] for ds in many] == [["one@example.com"], ["bo@x.org"]]
    rows = plain + templated + many[0] + many[1]
    assert all(isinstance(d, Delivery) and d.status == Status.QUEUED for d in rows)
    # Written by another thread's connection, seen by this one: committed.
    assert set(Delivery.objects.values_list("pk", flat=True)) == {d.pk for d in rows}
    assert Email.objects.get(pk=templated[0].email_id).subject == "Willkommen, Ann!"
    assert queue.waiting_ids() == {d.pk for d in rows}

    deliver()
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT}
    assert sorted(m.to[0] for m in outbox_mail) == sorted(d.recipient for d in rows)


BAD_ITEMS = [
    {"subject": "s", "message": "b", "recipient_list": ["a@example.com"]},
    {"subject": "s\nBcc: x@evil.com", "message": "b", "recipient_list": ["b@example.com"]},
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("enqueue_email", ("s", "b", None, ["a@example.com", "not-an-address"]), {}),
        ("enqueue_email", ("s", "b", None, ["a@example.com"]), {"priority": "urgent"}),
        ("enqueue_email", ("s", "b", None, ["a@example.com"]), {"colour": "red"}),
        ("enqueue_template", ("no/such/template", {}, None, ["a@example.com"]), {}),
        ("enqueue_many", (BAD_ITEMS,), {}),
        ("enqueue_many", ([BAD_ITEMS[0], ["not", "a", "dict"]],), {}),
    ],
)
def test_plain_asyncio_gets_the_sync_errors_and_writes_nothing(queue, name, args, kwargs):
    synchronous, asynchronous = getattr(outbox, name), getattr(outbox, f"a{name}")
    with pytest.raises((ValidationError, TypeError)) as sync:
        synchronous(*args, **kwargs)
    with pytest.raises(sync.type) as awaited:
        asyncio.run(asynchronous(*args, **kwargs))
    if sync.type is ValidationError:
        assert awaited.value.message_dict == sync.value.message_dict
    else:
        assert str(awaited.value) == str(sync.value)
    assert not Email.objects.exists() and not Delivery.objects.exists()
    assert queue.redis.dbsize() == 0


# -- the transaction rules are the sync ones -------------------------------------------


def test_from_sync_code_it_joins_the_callers_transaction_and_pushes_after_commit(queue):
    """Thread-sensitive: through ``async_to_sync`` the write runs in the caller's thread."""
    with pytest.raises(RuntimeError), transaction.atomic():
        async_to_sync(aenqueue_email)("s", "b", None, ["a@example.com"])
        raise RuntimeError("the order failed")
    assert not Delivery.objects.exists() and queue.redis.dbsize() == 0

    with transaction.atomic():
        [delivery] = async_to_sync(aenqueue_email)("s", "b", None, ["a@example.com"])
        assert queue.waiting_ids() == set()  # not yet: the caller may still roll back
    assert queue.waiting_ids() == {delivery.pk}


def test_in_async_code_each_call_commits_then_pushes(queue):
    seen: list[tuple[bool, bool, set[int]]] = []

    def on_enqueued(sender: Any, email: Email, deliveries: list[Delivery], **kwargs: Any) -> None:
        # Sent after the commit, in the thread that wrote: asgiref's shared thread,
        # no transaction open any more, the ids pushed.
        seen.append(
            (
                threading.current_thread() is threading.main_thread(),
                connections["default"].in_atomic_block,
                RedisQueue().waiting_ids(),
            )
        )

    async def main() -> list[list[Delivery]]:
        first = await aenqueue_email("s", "b", None, ["a@example.com"])
        assert await sync_to_async(Delivery.objects.filter(pk=first[0].pk).exists)()
        second = await aenqueue_email("s", "b", None, ["b@example.com"])
        return [first, second]

    email_enqueued.connect(on_enqueued)
    try:
        first, second = asyncio.run(main())
    finally:
        email_enqueued.disconnect(on_enqueued)
    assert seen == [(False, False, {first[0].pk}), (False, False, {first[0].pk, second[0].pk})]
