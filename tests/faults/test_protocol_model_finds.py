"""The protocol model's finds, replayed by hand, step by step.

Each test drives ``ProtocolMachine`` (``tests/faults/protocol_machine.py``, the
machine of ``tests/faults/test_protocol_model.py``) through the steps of one
failure that its random search found, checking the invariants between them.
"""

from __future__ import annotations

import contextlib

import pytest
from django.db import transaction
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Delivery
from tests import protocol_faults as pf
from tests.faults.protocol_machine import ProtocolMachine
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def test_retried_claim_keeps_the_ids_it_claimed() -> None:
    """The machine's first find, replayed step by step.

    A claim whose reply was lost is retried with the same nonce; ``claim.lua``
    then applies the acks a second time. When the lost call had claimed one of
    the acked ids again (a retried row that came due), the second LREM takes
    that fresh copy out of the processing list: the row is then marked
    processing while no processing list holds it (invariant 4), so a crash
    leaves it to the stuck-row rule, or strands it while still queued.
    """
    machine = ProtocolMachine()
    try:
        machine.setup(policy="review", workers="w1")
        with transaction.atomic():
            enqueue_email(
                "Order", "Thanks", None, ["a@x.com", "b@x.com", "c@x.com"], priority="high"
            )
        w = machine.workers[0]
        t = w.threads[0]
        assert machine._claim(w, t, 2)  # a, b
        machine._mark(t)  # a processing
        machine._send(t, "transient")  # a: retry in a few milliseconds
        machine._mark(t)  # a queued again (acked), b processing
        machine._send(t, "ok")
        # Until a is due again.
        wait_until(
            lambda: (
                not Delivery.objects.filter(
                    status=Status.QUEUED, not_before__gt=timezone.now()
                ).exists()
            ),
            5,
        )
        with machine._driving(w, t, ["claim:lose"]):
            assert machine._claim(w, t, 2)  # c and a again; the reply is lost
            assert machine._claim(w, t, 2)  # the same claim, replayed
        machine._mark(t)  # b sent, c processing
        machine._send(t, "ok")
        machine._mark(t)  # c sent, a processing
        machine.protocol_holds()
    finally:
        machine.teardown()


def test_outcomes_refused_for_good_are_settled_and_the_thread_goes_on() -> None:
    """The ``refuse`` faults, step by step: each outcome kind, in the step and alone.

    Before the fix the thread retried a refused write for ever: in the step
    its row stayed ``processing`` first in line, alone ``persist()`` never
    returned (the fault counts the tries and stops it).
    """
    machine = ProtocolMachine()
    with contextlib.ExitStack() as stack:
        stack.enter_context(pf.module_sites())  # the settle site: persist() in settling.py
        stack.callback(machine.teardown)
        machine.setup(policy="review", workers="w1")
        with transaction.atomic():
            rows = enqueue_email(
                "Order", "Thanks", None, ["a@x.com", "b@x.com", "c@x.com", "d@x.com"]
            )
        a, b, c, d = (row.pk for row in rows)
        w = machine.workers[0]
        t = w.threads[0]
        assert machine._claim(w, t, 4)
        machine._mark(t)  # a processing
        machine._send(t, "permanent")  # a: failed, 550
        with machine._driving(w, t, ["step:refuse"]):
            machine._mark(t)  # a's outcome refused in the step: settled alone; b processing
        machine.protocol_holds()
        row = Delivery.objects.get(pk=a)
        assert row.status == Status.FAILED, row.status
        assert "550" in row.last_error and "refused to record the outcome" in row.last_error
        machine._send(t, "ok")  # b: accepted
        with machine._driving(w, t, ["step:refuse"]):
            machine._mark(t)  # b's success refused in the step: `sent` alone; c processing
        machine.protocol_holds()
        assert Delivery.objects.get(pk=b).status == Status.SENT
        machine._send(t, "ambiguous")  # c: in doubt
        with machine._driving(w, t, ["settle:refuse"]):
            t.loop._settle_alone()  # c's outcome refused alone: abandoned all the same
        machine.protocol_holds()
        assert Delivery.objects.get(pk=c).status == Status.ABANDONED
        machine._mark(t)  # the thread goes on: d processing
        machine._send(t, "ok")
        machine.protocol_holds()
    assert Delivery.objects.get(pk=d).status == Status.SENT
