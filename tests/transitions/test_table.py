"""The transitions table (outbox/transitions/table.py): one source for every change of a row's status.

- each transition's two renderings, its statement and its ORM update, write the
  same row, on this database;
- each changes nothing on a row outside its source statuses, or claimed under
  another token: the count of rows it changed is the caller's answer;
- nothing else in the package writes a delivery's status;
- the PL/pgSQL step functions the newest migration installs are the ones the
  table renders now (``outbox.transitions.hotpath``).
"""

from __future__ import annotations

import ast
import importlib
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from outbox import enqueue_email, transitions
from outbox.models import Delivery, stored
from outbox.worker import functions
from tests.paths import ROOT

Status = Delivery.Status
TOKEN = uuid.UUID(int=7)
OTHER = uuid.UUID(int=8)
BEFORE = timezone.now() - timedelta(hours=1)
PACKAGE = ROOT / "outbox"

# Every transition these rows and parameters fit; the mark and its companions'
# (a due row, a message's rows) are compared on both paths in tests/transitions/test_sql.py.
ORM = [t for t in transitions.ALL if not {transitions.DUE, transitions.COMPANIONS} & set(t.guard)]
# Enqueue pushes after its commit: real transactions.
on_the_database = pytest.mark.django_db(transaction=True)


def _params(now: Any) -> dict[str, Any]:
    return {
        "now": now,
        "error": "why",
        "retry_at": now + timedelta(minutes=5),
        "not_before": now,
        "host": "mx.example.com",
        "address": "192.0.2.1:25",
    }


def _row(status: str) -> Delivery:
    (row,) = enqueue_email("s", "b", "from@example.com", ["to@example.com"])
    Delivery.objects.filter(pk=row.pk).update(
        status=status,
        claim_token=TOKEN,
        worker_id="w#1",
        attempts=2,
        not_before=BEFORE,
        updated_at=BEFORE,
    )
    return row


def _state(pk: int) -> dict[str, Any]:
    fields = [f.attname for f in Delivery._meta.concrete_fields if f.attname not in ("id",)]
    found = Delivery.objects.filter(pk=pk).values(*fields).get()
    # Written as "the clock": the database's now() on PostgreSQL, which differs
    # between the two writes; compared as "recent" instead.
    for name in ("updated_at", "not_before", "created_at", "message_id", "email_id"):
        found.pop(name)
    return found


def _run_sql(change: transitions.Transition, pk: int, params: dict[str, Any]) -> int:
    token_field = Delivery._meta.get_field("claim_token")
    values = {
        **params,
        "id": pk,
        "token": token_field.get_db_prep_value(TOKEN, connection),
        "now": connection.ops.adapt_datetimefield_value(params["now"]),
        # The instant columns' values, as they store them (outbox/models/instants.py).
        "now_instant": stored(params["now"], connection),
        "retry_at": stored(params["retry_at"], connection),
        "not_before": stored(params["not_before"], connection),
    }
    with connection.cursor() as cursor:
        cursor.execute(change.sql(connection.vendor), values)
        return cursor.rowcount


@on_the_database
@pytest.mark.parametrize("change", ORM, ids=lambda t: t.name)
def test_the_statement_and_the_orm_update_write_the_same_row(change, queue):
    now = timezone.now()
    params = _params(now)
    by_sql, by_orm = _row(change.source[0]), _row(change.source[0])
    assert _run_sql(change, by_sql.pk, params) == 1
    assert change.apply(by_orm.pk, TOKEN, **params) == 1
    assert _state(by_sql.pk) == _state(by_orm.pk)
    assert _state(by_sql.pk)["status"] == str(change.target.value)


@on_the_database
@pytest.mark.parametrize("change", ORM, ids=lambda t: t.name)
def test_a_row_in_another_status_or_under_another_token_is_left_alone(change, queue):
    params = _params(timezone.now())
    for status in Status.values:
        row = _row(status)
        before = _state(row.pk)
        if status in change.source:
            if transitions.TOKEN not in change.guard:
                continue
            assert change.apply(row.pk, OTHER, **params) == 0
        else:
            assert change.apply(row.pk, TOKEN, **params) == 0
            assert _run_sql(change, row.pk, params) == 0
        assert _state(row.pk) == before


@on_the_database
def test_a_requeue_keeps_a_later_schedule_and_requeue_now_does_not(queue):
    later = timezone.now() + timedelta(days=2)
    kept, now_row = _row(Status.FAILED), _row(Status.FAILED)
    Delivery.objects.filter(pk__in=[kept.pk, now_row.pk]).update(not_before=later)
    params = _params(timezone.now())
    assert transitions.REQUEUE.apply(kept.pk, **params) == 1
    assert transitions.REQUEUE_NOW.apply(now_row.pk, **params) == 1
    assert Delivery.objects.get(pk=kept.pk).not_before == later
    assert Delivery.objects.get(pk=now_row.pk).not_before < later - timedelta(days=1)


@on_the_database
def test_a_release_without_a_time_keeps_the_rows_not_before(queue):
    row = _row(Status.PROCESSING)
    changed = transitions.RELEASE.apply(
        row.pk, TOKEN, now=timezone.now(), not_before=F("not_before")
    )
    after = Delivery.objects.get(pk=row.pk)
    assert (changed, after.status, after.attempts, after.not_before) == (1, "queued", 1, BEFORE)
    assert (after.claim_token, after.worker_id) == (None, "")


# -- nothing else writes a status ----------------------------------------------------------

_WRITES_STATUS = re.compile(r"UPDATE\s+outbox_delivery\b", re.IGNORECASE)
# Modules whose ``.update(status=...)`` is a dict's, not a QuerySet's: the
# values of rows being inserted (an insert writes a new row's first status).
_DICTS = {"enqueue/sql.py"}


def _status_updates(tree: ast.AST) -> list[int]:
    """Lines of ``.update(status=...)`` calls: an ORM write of a status."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "update"
        and any(k.arg == "status" for k in node.keywords)
    ]


def test_no_module_but_the_table_writes_a_status():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("transitions/") or rel.startswith("migrations/"):
            continue
        text = path.read_text()
        if rel not in _DICTS:
            offenders += [f"{rel}:{line}" for line in _status_updates(ast.parse(text))]
        offenders += [f"{rel}: UPDATE outbox_delivery" for _ in _WRITES_STATUS.findall(text)]
    assert offenders == [], "write statuses through outbox/transitions/table.py"


# -- the PL/pgSQL functions ------------------------------------------------------------------


def _newest_ddl(function: str) -> str:
    """The DDL of ``function`` in the newest migration that creates it."""
    found = ""
    for path in sorted((PACKAGE / "migrations").glob("0*.py")):
        module = importlib.import_module(f"outbox.migrations.{path.stem}")
        for value in vars(module).values():
            if isinstance(value, str) and f"CREATE OR REPLACE FUNCTION {function}(" in value:
                found = value
    return found


def _words(sql: str) -> list[str]:
    return sql.split()


@pytest.mark.parametrize(
    ("function", "render"),
    [("outbox_step", functions.step_function), ("outbox_steps", functions.steps_function)],
)
def test_the_newest_migration_installs_the_step_functions_the_table_renders(function, render):
    assert _words(_newest_ddl(function)) == _words(render()), (
        f"outbox/transitions/table.py changed {function}: add a migration with the DDL that "
        "outbox.worker.functions.print_ddl() prints"
    )
