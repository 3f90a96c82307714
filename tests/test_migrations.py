"""Migration 0017: PostgreSQL's PL/pgSQL functions, created whatever the database had before;
0018: ``not_before`` and ``expires_at`` as instants, SQLite's local times rewritten in UTC.

The test database is migrated from empty when the run starts, so it is a fresh
one; an older database is made by migrating back to 0016 and giving it the
functions an earlier release left (or none).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from outbox import enqueue_email
from outbox.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

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


def migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


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
    expected = CURRENT if connection.vendor == "postgresql" else set()
    if before == "previous release" and connection.vendor == "postgresql":
        expected = expected | KEPT
    assert functions() == expected


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
    assert stored_times(row.pk) == utc
    # Read as Django reads it without USE_TZ: naive, in TIME_ZONE.
    delivery = Delivery.objects.get(pk=row.pk)
    assert delivery.not_before == datetime(2031, 7, 1, 8, 0)
    assert delivery.expires_at == datetime(2031, 7, 2, 8, 0)
