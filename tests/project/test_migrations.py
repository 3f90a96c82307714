"""The outbox's migrations: the squashed one and the chain it replaces, and what each step did.

- ``0001_squashed_0018_delivery_instants`` gives a new database what 0001 to
  0018 give (tables, columns, indexes, constraints and, on PostgreSQL, the
  functions), and a database migrated through them upgrades in place;
- 0002, 0015: old rows relabelled and filled; 0017: PostgreSQL's PL/pgSQL
  functions, created whatever the database had before; 0018: ``not_before``
  and ``expires_at`` as instants, SQLite's local times rewritten in UTC;
- 0019: ``Email.sensitive`` and ``content_cleared_at``, beside a previous
  release's inserts.

The test database is migrated from empty when the run starts (through the
squashed migration, as a new install is), so it is a fresh one. An older
database is made by migrating back through the chain (:func:`chain`), to 0016
say, and giving it the functions an earlier release left (or none).
"""

from __future__ import annotations

import importlib
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Email

pytestmark = pytest.mark.django_db(transaction=True)

SQUASHED = ("outbox", "0001_squashed_0018_delivery_instants")
BEFORE = ("outbox", "0016_attempt_esp_message_id")
AFTER = ("outbox", "0017_postgresql_functions")
LATEST = ("outbox", "0018_delivery_instants")

# What the hot path calls (outbox/statements/postgresql.py), by argument types.
_ENQUEUE = (
    "text,text,text,character varying,jsonb,jsonb,timestamp with time zone,character varying,"
    "integer,timestamp with time zone,timestamp with time zone"
)
CURRENT = {
    "outbox_step(bigint,uuid,bigint,character varying,uuid,timestamp with time zone,bigint,text)",
    "outbox_steps(bigint[],uuid[],bigint[],character varying[],uuid[],"
    "timestamp with time zone[],bigint[],text)",
    f"outbox_enqueue({_ENQUEUE},text[],text[],text[],character varying,jsonb)",
    f"outbox_enqueue_one({_ENQUEUE},text,text,text,character varying,jsonb)",
}

# The previous release's enqueue functions, which 0017 keeps (its web processes
# call them until they restart).
KEPT = {
    f"outbox_enqueue({_ENQUEUE},text[],text[],text[],character varying)",
    f"outbox_enqueue_one({_ENQUEUE},text,text,text,character varying)",
}

# The enqueue functions as the previous release left them: the signature
# without p_structure (their body does not matter here).
PREVIOUS = [
    "CREATE FUNCTION outbox_enqueue(text, text, text, varchar, jsonb, jsonb, timestamptz, "
    "varchar, integer, timestamptz, timestamptz, text[], text[], text[], varchar) "
    "RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text) "
    "LANGUAGE sql AS 'SELECT 1::bigint, 1::bigint, ''''::varchar, ''''::text'",
    "CREATE FUNCTION outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, timestamptz, "
    "varchar, integer, timestamptz, timestamptz, text, text, text, varchar) "
    "RETURNS text[] LANGUAGE sql AS 'SELECT ARRAY[''1'']'",
    "CREATE FUNCTION outbox_step(bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text) "
    "RETURNS integer LANGUAGE sql AS 'SELECT 0'",
]


def functions() -> set[str]:
    """The outbox's functions this database has, each with its argument types."""
    if connection.vendor != "postgresql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT oid::regprocedure::text FROM pg_proc "
            "WHERE proname LIKE 'outbox%%' AND pg_function_is_visible(oid)"
        )
        return {name for (name,) in cursor.fetchall()}


def chain() -> MigrationExecutor:
    """An executor that sees 0001 to 0018 one by one, not the migration that replaces them.

    Django's own loader hides a squashed migration's ``replaces`` once they are
    all applied (or none is), so going back to one of them takes this one.
    Going forward again, Django's loader takes the chain where this left a
    database part-way through it.
    """
    executor = MigrationExecutor(connection)
    executor.loader = MigrationLoader(connection, replace_migrations=False)
    return executor


def migrate(target: tuple[str, str]) -> None:
    chain().migrate([target])


def latest() -> None:
    """Migrate forward to the newest migration, as ``manage.py migrate`` would."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("outbox"))


def test_a_fresh_database_has_the_four_functions():
    if connection.vendor != "postgresql":
        pytest.skip("PL/pgSQL exists on PostgreSQL only")
    assert functions() == CURRENT


@pytest.mark.parametrize("before", ["none", "previous release"])
def test_0017_replaces_whatever_functions_the_database_had(before):
    """None (migrated while the functions were off) or the previous release's: the four after.

    The previous release's enqueue functions (without ``p_structure``) are
    kept beside the new ones: its web processes still call them until they
    restart after the migration.
    """
    try:
        migrate(BEFORE)
        assert functions() == set()  # the reverse drops the four
        if before == "previous release" and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                for sql in PREVIOUS:
                    cursor.execute(sql)
            assert len(functions()) == len(PREVIOUS)
    finally:
        migrate(AFTER)
    migrate(LATEST)
    latest()  # and the migrations after the chain
    expected = CURRENT if connection.vendor == "postgresql" else set()
    if before == "previous release" and connection.vendor == "postgresql":
        expected = expected | KEPT
    assert functions() == expected
    # What a later release's migration will do; until then, later tests start without them.
    with connection.cursor() as cursor:
        for name in KEPT & functions():
            cursor.execute(f"DROP FUNCTION {name}")


def stored_times(pk: int) -> tuple[str, str]:
    """The row's ``not_before`` and ``expires_at`` as the database holds them (seconds, no zone)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT to_char(not_before AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), "
                "to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
                "FROM outbox_delivery WHERE id = %s",
                [pk],
            )
        else:
            cursor.execute(
                "SELECT CAST(not_before AS TEXT), CAST(expires_at AS TEXT) "
                "FROM outbox_delivery WHERE id = %s",
                [pk],
            )
        not_before, expires_at = cursor.fetchone()
    return str(not_before)[:19], str(expires_at)[:19]


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
def test_0018_keeps_what_each_stored_time_meant():
    """Without USE_TZ, SQLite held local times: 0018 rewrites them in UTC, and back.

    PostgreSQL's ``timestamptz`` already held instants: nothing changes there.
    """
    send_at = datetime(2031, 7, 1, 12, 0, tzinfo=UTC)  # 08:00 in New York (EDT)
    [row] = enqueue_email(
        "s", "b", None, ["a@example.com"], send_at=send_at, expires_at=send_at + timedelta(days=1)
    )
    utc = ("2031-07-01 12:00:00", "2031-07-02 12:00:00")
    assert stored_times(row.pk) == utc
    try:
        migrate(AFTER)
        local = ("2031-07-01 08:00:00", "2031-07-02 08:00:00")
        assert stored_times(row.pk) == (utc if connection.vendor == "postgresql" else local)
    finally:
        migrate(LATEST)
        latest()
    assert stored_times(row.pk) == utc
    # Read as Django reads it without USE_TZ: naive, in TIME_ZONE.
    delivery = Delivery.objects.get(pk=row.pk)
    assert delivery.not_before == datetime(2031, 7, 1, 8, 0)
    assert delivery.expires_at == datetime(2031, 7, 2, 8, 0)


def test_no_model_change_lacks_a_migration():
    out = io.StringIO()
    call_command("makemigrations", "outbox", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_migration_0002_relabels_leftover_in_progress_attempts():
    """An attempt the first worker version logged at claim time ends up ``abandoned``."""
    executor = chain()
    executor.migrate([("outbox", "0001_initial")])
    try:
        old = executor.loader.project_state([("outbox", "0001_initial")]).apps
        email = old.get_model("outbox", "Email").objects.create(subject="s", from_email="a@x.com")
        delivery = old.get_model("outbox", "Delivery").objects.create(
            email=email, recipient="b@x.com", message_id="<m@x.com>"
        )
        attempts = old.get_model("outbox", "Attempt").objects
        attempts.create(delivery=delivery, number=1)  # the old default: in_progress
        attempts.create(delivery=delivery, number=1, outcome="sent")
    finally:
        latest()
    assert sorted(Attempt.objects.values_list("outcome", flat=True)) == ["abandoned", "sent"]
    assert Delivery.objects.count() == 1


def test_migration_0015_fills_recipient_key_in_batches_and_marks_old_duplicates(monkeypatch):
    """Existing rows get their normalised address; copies the old matching let through
    under one idempotency key keep a marked key, and a retry now finds the first."""
    migration = importlib.import_module("outbox.migrations.0015_delivery_recipient_key")
    monkeypatch.setattr(migration, "BATCH", 2)  # several batches of a few rows
    before = [("outbox", "0014_scale_indexes")]
    executor = chain()
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps
        email = old.get_model("outbox", "Email").objects.create(subject="s", from_email="a@x.com")
        deliveries = old.get_model("outbox", "Delivery").objects
        made = {
            recipient: deliveries.create(
                email=email, recipient=recipient, message_id=f"<{n}@x.com>", idempotency_key=key
            ).pk
            for n, (recipient, key) in enumerate(
                [
                    ("bob@example.com", "signup-7"),
                    ("Bob <BOB@example.com>", "signup-7"),  # the second email the bug sent
                    ("ALICE@Example.com", None),
                    ("x@bücher.de", None),
                    ("Carol <carol@example.com>", "signup-8"),
                ]
            )
        }
    finally:
        latest()
    rows = {
        d.recipient: (d.recipient_key, d.idempotency_key) for d in Delivery.objects.order_by("pk")
    }
    first = made["bob@example.com"]
    assert rows == {
        "bob@example.com": ("bob@example.com", "signup-7"),
        "Bob <BOB@example.com>": ("bob@example.com", f"signup-7 (duplicate of {first})"),
        "ALICE@Example.com": ("alice@example.com", None),
        "x@bücher.de": ("x@xn--bcher-kva.de", None),
        "Carol <carol@example.com>": ("carol@example.com", "signup-8"),
    }
    [again] = enqueue_email("s", "b", None, ["BOB <bob@Example.com>"], idempotency_key="signup-7")
    assert again.pk == first
    [carol] = enqueue_email("s", "b", None, ["carol@example.com"], idempotency_key="signup-8")
    assert carol.pk == made["Carol <carol@example.com>"]
    assert Delivery.objects.count() == 5


# -- the squashed migration ----------------------------------------------------------------


def catalogue() -> dict[str, Any]:
    """The outbox's tables as the database describes them: what two paths must agree on.

    Django's introspection (columns with their types, sizes, nullability and
    database defaults; every constraint and index with its columns), and the
    database's own catalogue, which also has each index's condition and
    operator class: ``sqlite_master``'s statements on SQLite; on PostgreSQL,
    the columns' order and defaults, each index's and constraint's definition
    and each function's whole text.
    """
    found: dict[str, Any] = {}
    with connection.cursor() as cursor:
        introspection = connection.introspection
        for table in sorted(introspection.table_names(cursor)):
            if table.startswith("outbox_"):
                found[table] = (
                    [
                        tuple(column)
                        for column in introspection.get_table_description(cursor, table)
                    ],
                    introspection.get_constraints(cursor, table),
                )
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master "
                "WHERE tbl_name LIKE 'outbox%%' ORDER BY type, name"
            )
            found["sqlite_master"] = cursor.fetchall()
        else:
            queries = {
                "columns": "SELECT table_name, ordinal_position, column_name, data_type, "
                "character_maximum_length, is_nullable, column_default, is_identity "
                "FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name LIKE 'outbox%%' ORDER BY table_name, ordinal_position",
                "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = current_schema() AND tablename LIKE 'outbox%%' "
                "ORDER BY indexname",
                "constraints": "SELECT conrelid::regclass::text, conname, "
                "pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid::regclass::text LIKE 'outbox%%' ORDER BY conname",
                "functions": "SELECT oid::regprocedure::text, pg_get_functiondef(oid) FROM pg_proc "
                "WHERE proname LIKE 'outbox%%' AND pg_function_is_visible(oid) ORDER BY 1",
            }
            for name, sql in queries.items():
                cursor.execute(sql)
                found[name] = cursor.fetchall()
    return found


def applied() -> set[tuple[str, str]]:
    """The outbox's migrations ``django_migrations`` records."""
    return {key for key in MigrationRecorder(connection).applied_migrations() if key[0] == "outbox"}


def test_a_new_database_gets_through_the_squashed_migration_what_the_chain_gives():
    """Migrated from empty, once by 0001 to 0018 and once by the one that replaces them."""
    executor = MigrationExecutor(connection)
    replaced = set(executor.loader.get_migration(*SQUASHED).replaces)
    try:
        executor.migrate([("outbox", None)])
        assert applied() == set()
        # From empty, Django takes the squashed migration alone, and records it
        # with all it replaces (so that the release that deletes them finds it).
        executor = MigrationExecutor(connection)
        assert [m.name for m, _ in executor.migration_plan([SQUASHED])] == [SQUASHED[1]]
        executor.migrate([SQUASHED])
        assert applied() == replaced | {SQUASHED}
        squashed = catalogue()
        if connection.vendor == "postgresql":
            assert {name for name, _ in squashed["functions"]} == CURRENT

        MigrationExecutor(connection).migrate([("outbox", None)])
        assert applied() == set()
        executor = chain()
        plan = executor.migration_plan([LATEST])
        assert [(m.app_label, m.name) for m, _ in plan] == sorted(replaced)
        executor.migrate([LATEST])
        assert catalogue() == squashed
    finally:
        latest()
    [row] = enqueue_email("s", "b", None, ["a@example.com"])
    assert Delivery.objects.get(pk=row.pk).status == Delivery.Status.QUEUED


def test_a_database_migrated_through_the_chain_upgrades_in_place():
    """The previous release's database: 0001 to 0018 recorded, the squashed one unknown to it.

    ``migrate`` runs nothing, changes nothing, and records the squashed
    migration as applied.
    """
    try:
        MigrationExecutor(connection).migrate([("outbox", None)])
        chain().migrate([LATEST])
        MigrationRecorder(connection).record_unapplied(*SQUASHED)
        before = catalogue()
        assert SQUASHED not in applied() and len(applied()) == 18
    finally:
        out = io.StringIO()
        # Up to the squashed migration: the ones after it (0019 on) are this release's own.
        call_command("migrate", "outbox", SQUASHED[1], verbosity=1, stdout=out)
    try:
        assert "No migrations to apply." in out.getvalue()
        assert SQUASHED in applied()
        assert catalogue() == before
    finally:
        latest()


def test_the_squashed_migration_creates_the_functions_with_0017s_text():
    """The DDL is copied, as a migration runs as it shipped: the copy must be 0017's, word for word."""
    squashed = importlib.import_module(f"outbox.migrations.{SQUASHED[1]}")
    old = importlib.import_module("outbox.migrations.0017_postgresql_functions")
    names = ["OUTBOX_STEP", "OUTBOX_STEPS", "OUTBOX_ENQUEUE", "OUTBOX_ENQUEUE_ONE"]
    names += ["DROP_STEP", "DROP_STEPS", "DROP_ENQUEUE", "DROP_ENQUEUE_ONE"]
    for name in names:
        assert getattr(squashed, name) == getattr(old, name), name


def test_0019_adds_the_retention_columns_beside_a_previous_release():
    """Back to 0018 and forward again; an insert naming neither new column (the previous
    release's, during a rolling upgrade) gets an email that is not sensitive, its content kept."""
    try:
        migrate(LATEST)
    finally:
        latest()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox_email (subject, body, html_message, from_email, reply_to, "
            "headers, mailer, created_at) VALUES ('s', 'b', '', 'f@x.test', '[]', '{}', '', %s)",
            [connection.ops.adapt_datetimefield_value(timezone.now())],
        )
    email = Email.objects.get()
    assert (email.sensitive, email.content_cleared_at, email.body) == (False, None, "b")
