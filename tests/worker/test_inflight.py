"""A delivery in flight (outbox/worker/inflight.py): what it carries, stage by stage.

From its claim it is an id and a priority; its claim token is drawn at the
first try to mark it and kept across that mark's retries; its row, email and
attachments are there once the mark answered, and reading them before says
so loudly.
"""

from __future__ import annotations

import uuid

import pytest
from django.core.mail.backends import locmem

from outbox import enqueue_email
from outbox.models import Delivery, Email
from outbox.worker import InFlight, Worker
from outbox.worker.loop import SenderLoop
from tests import protocol_faults as pf

Status = Delivery.Status


def test_before_its_mark_a_flight_is_its_claim_alone():
    flight = InFlight(7, "high")
    assert (flight.id, flight.priority, flight.tried) == (7, "high", False)
    for unmarked in ("token", "delivery", "email", "attachments"):
        with pytest.raises(RuntimeError, match="delivery 7"):
            getattr(flight, unmarked)


def test_its_token_is_drawn_at_the_first_try_and_kept_after():
    drawn: list[uuid.UUID] = []

    def new() -> uuid.UUID:
        drawn.append(uuid.uuid4())
        return drawn[-1]

    flight = InFlight(7, "normal")
    flight.draw_token(new)
    flight.draw_token(new)
    assert flight.tried and drawn == [flight.token]
    with pytest.raises(RuntimeError, match="not marked yet"):
        _ = flight.delivery  # tried, but the mark has not answered


def test_a_companion_is_a_flight_of_its_own_under_the_same_token():
    token = uuid.uuid4()
    email = Email(pk=3, mailer="esp")
    flight = InFlight.marked(Delivery(pk=7, priority="normal"), email, [], token, "w#1")
    companion = flight.companion(Delivery(pk=8, priority="normal"))
    assert companion is not flight
    assert (companion.id, companion.delivery.pk) == (8, 8) and companion.email is email
    assert (companion.token, companion.worker_id) == (token, "w#1")


@pytest.mark.django_db(transaction=True)
def test_a_mark_whose_reply_was_lost_is_tried_again_under_the_same_token(queue):
    """The step committed and its reply was lost: the flight is first in line again, its token on it."""
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    worker = Worker(burst=True)
    worker.queue.register(worker.worker_id)
    loop = SenderLoop(worker, 0, locmem.EmailBackend())
    faults = pf.Faults()
    pf.install_on_loop(faults, loop)  # and no pause before the retry
    assert loop._claim()
    faults.arm(["step:lose"])
    assert loop._mark(loop.pending.popleft()) is None
    [flight] = loop.pending
    after = Delivery.objects.get(pk=row.pk)
    assert (after.status, after.claim_token, after.attempts) == (Status.PROCESSING, flight.token, 1)
    assert loop._mark(loop.pending.popleft()) is flight
    assert flight.delivery.claim_token == flight.token and not loop.pending
    after = Delivery.objects.get(pk=row.pk)
    assert (after.status, after.claim_token, after.attempts) == (Status.PROCESSING, flight.token, 1)
