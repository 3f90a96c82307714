"""The tables: attempt outcomes, worker id columns, and --worker-id checks.

Their migrations: tests/project/test_migrations.py.
"""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from outbox import enqueue_email, operations
from outbox.management.commands.outbox_worker import MAX_WORKER_ID_LENGTH
from outbox.models import WORKER_ID_MAX_LENGTH, Attempt, Delivery

Outcome = Attempt.Outcome

# The longest id the command accepts, with the incarnation suffix the worker may add.
LONGEST_WORKER_ID = "w" * MAX_WORKER_ID_LENGTH + "#" + "0123456789ab"


def test_outcomes_have_ambiguous_and_no_in_progress():
    assert "in_progress" not in Outcome.values
    assert Outcome.AMBIGUOUS == "ambiguous"
    assert str(Outcome.AMBIGUOUS.label) == "in doubt"
    field = Attempt._meta.get_field("outcome")
    assert all(len(value) <= field.max_length for value in Outcome.values)


def test_outcome_has_no_default():
    assert not Attempt._meta.get_field("outcome").has_default()


def test_worker_id_columns_hold_the_longest_id_with_its_incarnation():
    assert len(LONGEST_WORKER_ID) <= WORKER_ID_MAX_LENGTH
    for model, name in (
        (Delivery, "worker_id"),
        (Attempt, "worker_id"),
        (Attempt, "actor"),
    ):
        assert model._meta.get_field(name).max_length == WORKER_ID_MAX_LENGTH


@pytest.mark.django_db(transaction=True)
def test_the_longest_worker_id_round_trips(queue):
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.PROCESSING,
        worker_id=LONGEST_WORKER_ID,
        claim_token=uuid.uuid4(),
        attempts=1,
    )
    Attempt.objects.create(
        delivery_id=delivery.pk,
        number=1,
        worker_id=LONGEST_WORKER_ID,
        actor=LONGEST_WORKER_ID,
        outcome=Outcome.AMBIGUOUS,
    )
    attempt = Attempt.objects.get(delivery_id=delivery.pk)
    assert attempt.worker_id == attempt.actor == LONGEST_WORKER_ID
    assert attempt.get_outcome_display() == "in doubt"
    assert Delivery.objects.get(pk=delivery.pk).worker_id == LONGEST_WORKER_ID


@pytest.mark.django_db(transaction=True)
def test_an_operator_with_the_longest_username_is_logged_in_full(queue):
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    actor = "admin:" + "u" * 150  # auth's usernames are up to 150 characters
    assert operations.cancel([delivery.pk], actor).changed == [delivery.pk]
    attempt = Attempt.objects.get(delivery_id=delivery.pk)
    assert (attempt.actor, attempt.outcome) == (actor, Outcome.CANCELLED)


# -- outbox_worker --worker-id ------------------------------------------------------


@pytest.mark.parametrize(
    ("worker_id", "says"),
    [
        ("w" * (MAX_WORKER_ID_LENGTH + 1), "the limit is 200"),
        ("", "must not be empty"),
        ("web 1", "whitespace"),
        ("web\t1", "whitespace"),
        ("web\n1", "whitespace"),
        ("web\x001", "control character"),
        ("web-1#0123456789ab", "reserved for the worker's incarnation suffix"),
        ("#", "'#'"),
    ],
)
def test_worker_command_refuses_a_bad_worker_id(worker_id, says):
    # Refused before the worker starts: no Redis or database is touched.
    with pytest.raises(CommandError, match=says):
        call_command("outbox_worker", "--worker-id", worker_id, "--burst")


def test_worker_command_accepts_the_longest_worker_id():
    from outbox.management.commands.outbox_worker import check_worker_id

    check_worker_id("w" * MAX_WORKER_ID_LENGTH)
    check_worker_id("web-1.example.com:42_é")
