"""Check outbox.E022 and ``manage.py outbox_functions``: a database migrated with the functions off.

A site whose role may not create functions migrates with POSTGRESQL_FUNCTIONS
False, and the migrations create none. If the setting is turned on later, the
hot paths would call functions that do not exist: the check says so, the
worker refuses to start, and the command creates them.
"""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.checks import Tags, run_checks
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.statements.functions import (
    CURRENT,
    DROP_STEPS,
    STEPS_FUNCTION_V1,
    function_states,
)
from outbox.worker import sql

pytestmark = pytest.mark.django_db(transaction=True)


def e022() -> list:
    messages = run_checks(tags=[Tags.database], databases=["default"])
    return [m for m in messages if m.id == "outbox.E022"]


@pytest.fixture
def postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("the functions exist on PostgreSQL only")


@pytest.fixture
def without_steps(postgresql):
    """outbox_steps dropped, as after migrating 0012 with the functions off; put back after."""
    with connection.cursor() as cursor:
        cursor.execute(DROP_STEPS)
    yield
    with connection.cursor() as cursor:
        cursor.execute(STEPS_FUNCTION_V1)  # CREATE OR REPLACE: whatever the test left


def test_a_migrated_database_has_every_function(postgresql):
    assert function_states(connection) == {name: "present" for name in CURRENT}
    assert e022() == []


def test_a_missing_function_is_an_error_and_the_worker_refuses_to_start(without_steps):
    [error] = e022()
    assert "'default' has no outbox_steps:" in error.msg
    assert "outbox_functions --create --database default" in error.hint
    with pytest.raises(SystemCheckError, match=r"outbox\.E022"):
        call_command("outbox_worker", "--burst", skip_checks=False)


def test_with_the_functions_off_a_missing_one_is_not_an_error(settings, without_steps):
    settings.OUTBOX = {**settings.OUTBOX, "POSTGRESQL_FUNCTIONS": False}
    assert e022() == []


def test_a_function_whose_migration_is_not_applied_is_not_missing(without_steps):
    recorder = MigrationRecorder(connection)
    recorder.record_unapplied("outbox", "0012_batched_steps_function")
    try:
        assert function_states(connection)["outbox_steps"] == "unmigrated"
        assert e022() == []
        out = StringIO()
        call_command("outbox_functions", "--create", stdout=out)
        assert "outbox_steps: not migrated yet" in out.getvalue()
        assert function_states(connection)["outbox_steps"] == "unmigrated"
    finally:
        recorder.record_applied("outbox", "0012_batched_steps_function")


def test_outbox_functions_lists_then_creates_what_is_missing(without_steps):
    out = StringIO()
    call_command("outbox_functions", stdout=out)
    assert "outbox_steps: missing" in out.getvalue()
    assert "outbox_step: present" in out.getvalue()
    assert function_states(connection)["outbox_steps"] == "missing"  # listing changes nothing

    out = StringIO()
    call_command("outbox_functions", "--create", stdout=out)
    assert "outbox_steps: created" in out.getvalue()
    assert e022() == []

    # The created function is the one the worker's batch calls: two steps claim two rows.
    enqueue_email("s", "b", "from@example.com", ["a@example.com", "b@example.com"])
    ids = sorted(Delivery.objects.values_list("pk", flat=True))
    now = timezone.now()
    steps = [sql.Step(None, pk, "w", uuid.uuid4(), now, 0) for pk in ids]
    results = sql.run_steps(steps)
    assert [claimed.delivery.pk for _, claimed in results] == ids
    assert set(Delivery.objects.values_list("status", flat=True)) == {"processing"}


def test_outbox_functions_names_an_unknown_database():
    with pytest.raises(CommandError, match="No database 'nope' in DATABASES"):
        call_command("outbox_functions", "--database", "nope")


def test_outbox_functions_refuses_a_database_other_than_postgresql():
    if connection.vendor == "postgresql":
        pytest.skip("this one is about the other databases")
    with pytest.raises(CommandError, match="on PostgreSQL only"):
        call_command("outbox_functions")
    assert e022() == []
