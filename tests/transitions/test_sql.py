"""What the transitions table runs, as SQL (outbox/transitions/sql/) and on both paths.

- ``outbox/transitions/sql/<database>.sql`` is what the table renders now, and
  ``python -m outbox.transitions`` prints it;
- every transition renders to an ORM update as well as to its statement;
- the mark and the companions' mark write the same rows through the ORM as
  through the worker's statements, an expired row included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from outbox import enqueue_email, transitions
from outbox.models import Delivery
from outbox.transitions import dump, table
from outbox.worker import sql
from tests.paths import ROOT

Status = Delivery.Status
TOKEN = uuid.UUID(int=7)
WORKER = "w#1"
BEFORE = timezone.now() - timedelta(hours=1)
LATER = timezone.now() + timedelta(hours=1)
on_the_database = pytest.mark.django_db(transaction=True)


# -- the checked-in SQL ----------------------------------------------------------------------


@pytest.mark.parametrize("vendor", dump.DATABASES)
def test_the_checked_in_sql_is_what_the_table_renders(vendor):
    written = dump.path(vendor).read_text() if dump.path(vendor).exists() else ""
    assert written == dump.dump(vendor), (
        f"{dump.path(vendor).relative_to(ROOT)} is not what outbox/transitions/ renders now: "
        f"run {dump.COMMAND} and commit the result"
    )


@pytest.mark.parametrize("vendor", dump.DATABASES)
def test_each_statement_follows_a_comment_naming_where_it_comes_from(vendor):
    blocks = dump.dump(vendor).split("\n\n")
    statements = [b for b in blocks if not all(line.startswith("--") for line in b.splitlines())]
    for block in statements:
        comment, text = block.split("\n", 1)
        assert comment.startswith("-- ") and not text.startswith("--"), block
    functions = 2 if vendor == "postgresql" else 0  # outbox_step, outbox_steps
    assert len(statements) == len(transitions.ALL) + functions
    for name, change in vars(table).items():
        if isinstance(change, transitions.Transition):
            assert f'-- {name} ("{change.name}")' in dump.dump(vendor)


def test_one_command_prints_a_databases_sql_without_a_settings_module():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.transitions", "sqlite"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == dump.dump("sqlite")


# -- every transition on both paths -----------------------------------------------------------


def _params(now: Any) -> dict[str, Any]:
    """A value for every parameter a transition of the table names."""
    return {
        "now": now,
        "error": "why",
        "expired": sql.EXPIRED_ERROR,
        "retry_at": now + timedelta(minutes=5),
        "not_before": now,
        "host": "mx.example.com",
        "address": "192.0.2.1:25",
        "worker": WORKER,
        "email": 1,
        "id": 1,
    }


@pytest.mark.parametrize("vendor", dump.DATABASES)
@pytest.mark.parametrize("change", transitions.ALL, ids=lambda t: t.name)
def test_every_transition_renders_to_its_statement_and_to_the_orm(change, vendor):
    params = _params(timezone.now())
    assert change.sql(vendor).startswith("UPDATE outbox_delivery SET")
    assert set(change.values(vendor, token=TOKEN, **params)) == set(change.sets)
    assert change.match(TOKEN, vendor, **params)


# -- the mark: the worker's statement and the ORM, row for row ------------------------------


def _rows(count: int, **columns: Any) -> list[Delivery]:
    recipients = [f"to{n}@example.com" for n in range(count)]
    rows = enqueue_email("s", "b", "from@example.com", recipients)
    Delivery.objects.filter(pk__in=[r.pk for r in rows]).update(
        attempts=2, not_before=BEFORE, updated_at=BEFORE, **columns
    )
    return sorted(rows, key=lambda r: r.pk)


def _state(row: Delivery) -> dict[str, Any]:
    # What two rows of two messages share, once both are written alike.
    differ = {"id", "email_id", "message_id", "created_at"}
    fields = [f.attname for f in Delivery._meta.concrete_fields if f.attname not in differ]
    return Delivery.objects.filter(pk=row.pk).values(*fields).get()


# The rows the mark meets: due, expired (still queued past its expires_at), due with an
# expiry ahead, not yet due, and no longer queued.
MARK_CASES = {
    "due": {},
    "expired": {"expires_at": BEFORE},
    "expiring later": {"expires_at": LATER},
    "not due": {"not_before": LATER},
    "processing": {"status": Status.PROCESSING},
}


@on_the_database
@pytest.mark.parametrize("case", MARK_CASES)
def test_the_mark_writes_the_same_row_through_the_orm_as_the_workers_claim(case, queue):
    (by_sql,), (by_orm,) = _rows(1), _rows(1)
    Delivery.objects.filter(pk__in=[by_sql.pk, by_orm.pk]).update(**MARK_CASES[case])
    now = timezone.now()
    claimed = sql.mark_row(by_sql.pk, WORKER, TOKEN, now)
    changed = transitions.MARK.apply(
        by_orm.pk, TOKEN, now=now, worker=WORKER, expired=sql.EXPIRED_ERROR
    )
    assert changed == (claimed is not None)
    assert _state(by_sql) == _state(by_orm)
    expected = {
        "due": Status.PROCESSING,
        "expiring later": Status.PROCESSING,
        "expired": Status.CANCELLED,
        "not due": Status.QUEUED,
        "processing": Status.PROCESSING,
    }[case]
    assert _state(by_orm)["status"] == expected
    if case == "expired":
        assert _state(by_orm)["attempts"] == 2  # not an attempt
        assert _state(by_orm)["last_error"] == sql.EXPIRED_ERROR


@on_the_database
def test_the_companions_mark_writes_the_same_rows_through_the_orm_as_the_worker(queue):
    # A lead and four companions each: due, expired, not due, and one another worker holds.
    def message() -> list[Delivery]:
        lead, due, expired, early, held = _rows(5)
        Delivery.objects.filter(pk=lead.pk).update(status=Status.PROCESSING, claim_token=TOKEN)
        Delivery.objects.filter(pk=expired.pk).update(expires_at=BEFORE)
        Delivery.objects.filter(pk=early.pk).update(not_before=LATER)
        Delivery.objects.filter(pk=held.pk).update(status=Status.PROCESSING)
        return [Delivery.objects.get(pk=lead.pk), due, expired, early, held]

    by_sql, by_orm = message(), message()
    now = timezone.now()
    marked = sql.mark_companions(by_sql[0], WORKER, now)
    lead = by_orm[0]
    changed = transitions.MARK_COMPANIONS.apply(
        None, TOKEN, now=now, worker=WORKER, email=lead.email_id, id=lead.pk
    )
    assert [d.pk for d in marked] == [by_sql[1].pk]
    assert changed == 1
    assert [_state(r) for r in by_sql] == [_state(r) for r in by_orm]
