"""Migration 0017: PostgreSQL's PL/pgSQL functions, created whatever the database had before.

The test database is migrated from empty when the run starts, so it is a fresh
one; an older database is made by migrating back to 0016 and giving it the
functions an earlier release left (or none).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("outbox", "0016_attempt_esp_message_id")
AFTER = ("outbox", "0017_postgresql_functions")

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
    expected = CURRENT if connection.vendor == "postgresql" else set()
    if before == "previous release" and connection.vendor == "postgresql":
        expected = expected | KEPT
    assert functions() == expected
