"""Group commit (outbox/worker/group_commit.py): threads' steps written together.

The rule it must keep: a thread hands its next message to the mail server
only after the commit that recorded its previous outcome. The end-to-end test
checks exactly that from inside a real delivery backend, on the test database;
the others pin the batching itself.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import datetime

import pytest
from django.core.mail.backends.base import BaseEmailBackend
from django.db import DatabaseError, DataError
from django.db.backends.signals import connection_created

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.worker import Worker
from outbox.worker.group_commit import GroupCommit
from outbox.worker.sql import Step, StepResult
from tests.servers import wait_until


def _step(n: int) -> Step:
    return Step(None, n, "w", uuid.uuid4(), datetime(2026, 1, 1), 0)


class Writes:
    """A write function that records each batch; the first one waits to be released."""

    def __init__(self, fail_batch: int | None = None, refuse_step: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.fail_batch = fail_batch
        self.refuse_step = refuse_step  # a step whose row the database refuses for good

    def __call__(self, steps: Sequence[Step]) -> list[StepResult]:
        ids = [s.claim_id or 0 for s in steps]
        self.batches.append(ids)
        if len(self.batches) == 1:
            self.first_started.set()
            assert self.release_first.wait(10)
        if self.fail_batch == len(self.batches):
            raise DatabaseError("the connection went away")
        if self.refuse_step in ids:
            raise DataError("value too long for type character varying(320)")
        return [(claim_id, None) for claim_id in ids]


def _run_all(group: GroupCommit, writes: Writes, waiting: int) -> dict[int, object]:
    """Step 0 leads; ``waiting`` more steps queue while it writes; then it finishes."""
    results: dict[int, object] = {}

    def run(n: int) -> None:
        try:
            results[n] = group.run(_step(n))
        except DatabaseError as exc:
            results[n] = exc

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert writes.first_started.wait(10)
    others = []
    for n in range(1, waiting + 1):
        thread = threading.Thread(target=run, args=(n,))
        thread.start()
        others.append(thread)
        # In order: each is queued before the next starts.
        wait_until(lambda n=n: len(group._queue) == n, 10)
    writes.release_first.set()
    for thread in [first, *others]:
        thread.join(10)
        assert not thread.is_alive()
    return results


def test_steps_that_wait_while_another_is_written_are_written_together_in_order():
    writes = Writes()
    group = GroupCommit(writes, limit=16)
    results = _run_all(group, writes, waiting=5)
    assert writes.batches == [[0], [1, 2, 3, 4, 5]]
    # Each thread got its own step's result, not a neighbour's.
    assert results == {n: (n, None) for n in range(6)}
    assert (group.batches, group.steps) == (2, 6)
    assert group._writing is False and group._queue == []


def test_a_batch_holds_at_most_the_limit_and_the_rest_follows():
    writes = Writes()
    group = GroupCommit(writes, limit=2)
    results = _run_all(group, writes, waiting=5)
    assert writes.batches == [[0], [1, 2], [3, 4], [5]]
    assert results == {n: (n, None) for n in range(6)}


def test_a_failed_write_fails_every_step_in_it_and_the_next_batch_goes_on():
    writes = Writes(fail_batch=2)
    group = GroupCommit(writes, limit=2)
    results = _run_all(group, writes, waiting=3)
    assert writes.batches == [[0], [1, 2], [3]]
    assert results[0] == (0, None) and results[3] == (3, None)
    assert all(isinstance(results[n], DatabaseError) for n in (1, 2))
    assert group._writing is False


def test_a_batch_refused_for_good_is_written_again_step_by_step_and_only_one_fails():
    """One step's row the database cannot store must not fail its neighbours' steps."""
    writes = Writes(refuse_step=2)
    group = GroupCommit(writes, limit=16)
    results = _run_all(group, writes, waiting=3)
    assert writes.batches == [[0], [1, 2, 3], [1], [2], [3]]
    assert results[1] == (1, None) and results[3] == (3, None)
    assert isinstance(results[2], DataError)
    assert group._writing is False and group._queue == []


class OrderCheckingBackend(BaseEmailBackend):
    """Delivers nothing; checks that this thread's previous message is already `sent`.

    It asks the database on the worker thread's own connection, outside any
    transaction: so it sees what was committed, and nothing else.
    """

    violations: list[str] = []
    delivered: list[str] = []
    lock = threading.Lock()

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.previous: str | None = None

    def send_messages(self, email_messages: Sequence[object]) -> int:
        for message in email_messages:
            message_id = message.extra_headers["Message-ID"]  # type: ignore[attr-defined]
            if self.previous is not None:
                status = Delivery.objects.get(message_id=self.previous).status
                if status != Delivery.Status.SENT:
                    with self.lock:
                        self.violations.append(f"{self.previous} was {status}")
            with self.lock:
                self.delivered.append(message_id)
            self.previous = message_id
        return len(email_messages)


@pytest.mark.django_db(transaction=True)
def test_each_thread_sends_only_after_its_previous_outcome_is_committed(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "EMAIL_BACKEND": f"{__name__}.OrderCheckingBackend",
    }
    OrderCheckingBackend.violations = []
    OrderCheckingBackend.delivered = []
    n = 300
    for i in range(0, n, 50):
        enqueue_email("s", "b", None, [f"r{j}@example.com" for j in range(i, i + 50)])
    worker = Worker(burst=True, concurrency=8)
    assert worker.run(install_signal_handlers=False) == 0
    assert OrderCheckingBackend.violations == []
    assert len(OrderCheckingBackend.delivered) == len(set(OrderCheckingBackend.delivered)) == n
    assert Delivery.objects.filter(status=Delivery.Status.SENT).count() == n
    # Every success and every claim went through the group commit.
    assert worker.group_commit.steps >= n


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_writes_every_step_on_one_database_connection(outbox_mail):
    """Successes and claims all go through the group commit's connection.

    Sender threads open none of their own: with CONN_MAX_AGE=0 each would be a
    new server session (and, on PostgreSQL, plans made again) per thread.
    """
    opened: list[str] = []

    def count(sender: object, connection: object, **kwargs: object) -> None:
        opened.append(threading.current_thread().name)

    enqueue_email("s", "b", None, [f"r{j}@example.com" for j in range(100)])
    connection_created.connect(count)
    try:
        worker = Worker(burst=True, concurrency=8)
        assert worker.run(install_signal_handlers=False) == 0
    finally:
        connection_created.disconnect(count)
    assert len(outbox_mail) == 100
    assert len(opened) == 1, opened
