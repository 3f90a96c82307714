"""outbox.W016: PL/pgSQL functions of an earlier release left in the database (outbox/checks/functions.py)."""

from __future__ import annotations

import pytest
from django.db import connection

from outbox.checks.functions import CURRENT, check_earlier_functions

pytestmark = pytest.mark.django_db

# The enqueue function of the version before 0.1.0, which 0017 keeps (15 arguments).
EARLIER = (
    "CREATE FUNCTION outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, timestamptz, "
    "varchar, integer, timestamptz, timestamptz, text, text, text, varchar) "
    "RETURNS text[] LANGUAGE sql AS 'SELECT ARRAY[''1'']'"
)


def w016() -> list:
    return [m for m in check_earlier_functions(databases=["default"]) if m.id == "outbox.W016"]


def test_quiet_on_a_database_the_migrations_made():
    """The four functions this release calls are the migrations' four, and nothing else is there."""
    assert w016() == []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(to_regprocedure(s)) FROM unnest(%s::text[]) s", [list(CURRENT)]
            )
            assert cursor.fetchone()[0] == len(CURRENT)


def test_an_earlier_function_is_named_with_the_statement_that_drops_it():
    if connection.vendor != "postgresql":
        pytest.skip("PL/pgSQL exists on PostgreSQL only")
    with connection.cursor() as cursor:
        cursor.execute(EARLIER)  # rolled back with the test
    [warning] = w016()
    signature = (
        "outbox_enqueue_one(text,text,text,character varying,jsonb,jsonb,"
        "timestamp with time zone,character varying,integer,timestamp with time zone,"
        "timestamp with time zone,text,text,text,character varying)"
    )
    assert signature in warning.msg
    assert f"DROP FUNCTION {signature};" in warning.hint
    with connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {signature}")  # the hint's statement, as written
    assert w016() == []


def test_only_the_outbox_database_is_asked():
    assert check_earlier_functions(databases=["other"]) == []
