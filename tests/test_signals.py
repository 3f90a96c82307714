"""The outbox's signals: each received exactly once, after commit, with its arguments."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.mail import send_mail
from django.db import transaction
from django.dispatch import Signal

from outbox import enqueue_email, operations, signals, transitions
from outbox.models import Delivery, Email
from outbox.worker import Worker
from tests.delivery import use_outbox, use_smtp_delivery

pytestmark = pytest.mark.django_db(transaction=True)


class Received:
    """Records every sending of one signal (from any thread)."""

    def __init__(self, signal: Signal) -> None:
        self.signal = signal
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal")
        with self.lock:
            self.calls.append({"sender": sender, **kwargs})

    def for_delivery(self, pk: int) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("delivery_id") == pk]


@pytest.fixture
def received() -> Iterator[dict[str, Received]]:
    names = ["email_enqueued", "delivery_sent", "delivery_failed", "delivery_abandoned"]
    receivers = {name: Received(getattr(signals, name)) for name in names}
    for receiver in receivers.values():
        receiver.signal.connect(receiver, weak=False)
    yield receivers
    for receiver in receivers.values():
        receiver.signal.disconnect(receiver)


def run_worker() -> Worker:
    worker = Worker(burst=True)
    worker.run(install_signal_handlers=False)
    return worker


def processing_row(worker_id: str) -> Delivery:
    """A row a worker marked processing, as the worker does it."""
    [delivery] = enqueue_email("s", "b", None, ["held@example.com"])
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.PROCESSING, worker_id=worker_id, attempts=1
    )
    return delivery


# -- email_enqueued -------------------------------------------------------------------


def test_email_enqueued_once_after_commit(received):
    with transaction.atomic():
        deliveries = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
        assert received["email_enqueued"].calls == []
    [call] = received["email_enqueued"].calls
    assert call["sender"] is Email
    assert call["email"].pk == deliveries[0].email_id
    assert [d.pk for d in call["deliveries"]] == [d.pk for d in deliveries]


def test_email_enqueued_not_sent_on_rollback(received):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_email("s", "b", None, ["a@example.com"])
        raise RuntimeError
    assert received["email_enqueued"].calls == []


def test_email_enqueued_only_for_new_deliveries(received):
    enqueue_email("s", "b", None, ["a@example.com"], idempotency_key="k")
    enqueue_email("s", "b", None, ["a@example.com"], idempotency_key="k")  # nothing new
    third = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"], idempotency_key="k")
    calls = received["email_enqueued"].calls
    assert len(calls) == 2
    assert [d.pk for d in calls[1]["deliveries"]] == [third[1].pk]


def test_email_enqueued_by_the_backend(received, settings):
    use_outbox(settings)
    send_mail("s", "b", None, ["a@example.com", "b@example.com"])
    [call] = received["email_enqueued"].calls
    assert call["email"] == Email.objects.get()
    assert sorted(d.recipient for d in call["deliveries"]) == ["a@example.com", "b@example.com"]


@pytest.mark.parametrize("recipients", [["a@example.com"], ["a@example.com", "b@example.com"]])
def test_model_init_signals_reach_the_instances_enqueue_returns(recipients):
    """The fast instances of the enqueue path still honour pre_init/post_init receivers."""
    from django.db.models.signals import post_init

    seen: list[Delivery] = []

    def receiver(sender: Any, instance: Delivery, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Delivery, weak=False)
    try:
        deliveries = enqueue_email("s", "b", None, recipients)
    finally:
        post_init.disconnect(receiver, sender=Delivery)
    assert {id(d) for d in deliveries} <= {id(d) for d in seen}
    assert [d.recipient for d in deliveries] == recipients
    assert all(not d._state.adding and d.pk for d in deliveries)
    # Built without __init__ when nobody listens: the same values all the same.
    again = enqueue_email("s", "b", None, recipients)
    fields = ["recipient", "status", "priority", "attempts", "max_attempts", "last_error"]
    for d in again:
        row = Delivery.objects.get(pk=d.pk)
        assert [getattr(d, f) for f in fields] == [getattr(row, f) for f in fields]
        assert d.email.subject == "s" and not d._state.adding


# -- delivery_sent / delivery_failed from the worker ------------------------------------


def test_delivery_sent_once_per_delivery(received, outbox_mail):
    deliveries = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    worker = run_worker()
    assert len(outbox_mail) == 2
    for delivery in deliveries:
        [call] = received["delivery_sent"].for_delivery(delivery.pk)
        assert call == {
            "sender": Delivery,
            "delivery_id": delivery.pk,
            "worker_id": worker.worker_id,
            "by": "worker",
        }
    assert len(received["delivery_sent"].calls) == 2
    assert received["delivery_failed"].calls == []
    # Sent after the commit: a receiver sees the row already sent.
    assert set(Delivery.objects.values_list("status", flat=True)) == {"sent"}


def test_delivery_failed_once_on_a_permanent_refusal(received, settings, smtp_server):
    use_smtp_delivery(settings, smtp_server)
    smtp_server.refuse["gone@example.com"] = "550 5.1.1 no such user"
    [gone, ok] = enqueue_email("s", "b", "shop@example.com", ["gone@example.com", "ok@example.com"])
    run_worker()
    [call] = received["delivery_failed"].calls
    assert call["sender"] is Delivery
    assert call["delivery_id"] == gone.pk
    assert call["by"] == "worker"
    assert call["error"].startswith("SMTPRecipientsRefused: ")
    assert "no such user" in call["error"]
    assert Delivery.objects.get(pk=gone.pk).last_error == call["error"]
    [sent] = received["delivery_sent"].calls
    assert sent["delivery_id"] == ok.pk


def test_delivery_failed_once_after_the_last_attempt(received, settings, smtp_server):
    use_smtp_delivery(settings, smtp_server)
    smtp_server.refuse["busy@example.com"] = "451 4.3.0 try later"
    [delivery] = enqueue_email("s", "b", "shop@example.com", ["busy@example.com"], max_attempts=1)
    run_worker()
    [call] = received["delivery_failed"].calls
    assert call["delivery_id"] == delivery.pk and call["by"] == "worker"
    assert "try later" in call["error"]
    assert received["delivery_sent"].calls == []


# -- from the sweeper and from operators (operations.transition) ---------------------------


def test_delivery_abandoned_once(received):
    delivery = processing_row("host:123:abcdef")
    result = operations.transition(
        [delivery.pk, delivery.pk],
        transitions.ABANDON,
        actor="sweeper",
        error="worker went away mid-send",
    )
    assert result.changed == [delivery.pk]
    assert received["delivery_abandoned"].calls == [
        {"sender": Delivery, "delivery_id": delivery.pk, "worker_id": "host:123:abcdef"}
    ]
    # Doing it again changes nothing and signals nothing.
    operations.transition(
        [delivery.pk],
        transitions.ABANDON,
        actor="sweeper",
    )
    assert len(received["delivery_abandoned"].calls) == 1


def test_delivery_abandoned_not_sent_on_rollback(received):
    delivery = processing_row("w")
    with pytest.raises(RuntimeError), transaction.atomic():
        operations.transition(
            [delivery.pk],
            transitions.ABANDON,
            actor="sweeper",
        )
        raise RuntimeError
    assert received["delivery_abandoned"].calls == []
    assert Delivery.objects.get(pk=delivery.pk).status == "processing"


def test_operator_settling_an_abandoned_row(received):
    first = processing_row("w1")
    [second] = enqueue_email("s", "b", None, ["other@example.com"])
    Delivery.objects.filter(pk=second.pk).update(status=Delivery.Status.PROCESSING, worker_id="w2")
    for pk in (first.pk, second.pk):
        operations.transition(
            [pk],
            transitions.ABANDON,
            actor="sweeper",
        )
    operations.mark_sent([first.pk], actor="alice")
    operations.mark_failed([second.pk], actor="bob")
    assert received["delivery_sent"].calls == [
        {"sender": Delivery, "delivery_id": first.pk, "worker_id": "w1", "by": "alice"}
    ]
    assert received["delivery_failed"].calls == [
        {
            "sender": Delivery,
            "delivery_id": second.pk,
            "error": "marked failed by bob",
            "by": "bob",
        }
    ]
