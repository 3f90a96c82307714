"""``outbox/db.py``: rows read by column name (``rows_by_name``), and which errors are refusals."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

import pytest
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction

from outbox.db import RowReader, refused_for_good

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's errors (the SQLite test is below)"
)
sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's errors (the PostgreSQL test is above)"
)


class Pair(NamedTuple):
    id: int
    name: str
    note: str = "none"


def cursor(sql: str) -> sqlite3.Cursor:
    return sqlite3.connect(":memory:").execute(sql)


def test_columns_are_matched_by_name_whatever_their_order():
    found = cursor("SELECT 'a' AS name, 7 AS id, 'n' AS note")
    assert RowReader().one(Pair, found, found.fetchone()) == Pair(id=7, name="a", note="n")


def test_a_field_with_a_default_may_have_no_column():
    found = cursor("SELECT 'a' AS name, 7 AS id UNION ALL SELECT 'b', 8")
    rows = RowReader().all(Pair, found, found.fetchall())
    assert rows == [Pair(7, "a"), Pair(8, "b")]


def test_a_missing_column_is_named():
    found = cursor("SELECT 7 AS id, 'x' AS label")
    with pytest.raises(LookupError, match="no column 'name'"):
        RowReader().one(Pair, found, found.fetchone())


# -- refused_for_good: real errors of each database ------------------------------------


def raised(sql: str, params: list | None = None) -> DatabaseError:
    """The error Django raises for ``sql``, run in a transaction of its own (rolled back)."""
    with (
        pytest.raises(DatabaseError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, params)
    return caught.value


def raise_code(code: str | None) -> DatabaseError:
    """What a PL/pgSQL ``RAISE EXCEPTION`` (a trigger's way to refuse) with ``code`` raises."""
    using = "" if code is None else f" USING ERRCODE = '{code}'"
    return raised(f"DO $$ BEGIN RAISE EXCEPTION 'refused by a rule'{using}; END $$")


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_everything_but_the_server_and_the_connection_is_refused_for_good():
    """The issue: a trigger's plain RAISE EXCEPTION (P0001) was retried for ever."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE refusing (n integer CHECK (n > 0), c circle)")
        cursor.execute("ALTER TABLE refusing ADD EXCLUDE USING gist (c WITH &&)")
    refused = {
        "a plain RAISE EXCEPTION (P0001)": raise_code(None),
        "a value too long (22001)": raise_code("22001"),
        "a code of the site's own": raise_code("OB001"),
        "an assert in a function (P0004)": raise_code("P0004"),
        "a check violation": raised("INSERT INTO refusing (n) VALUES (-1)"),
        "an exclusion violation": raised(
            "INSERT INTO refusing (n, c) VALUES (1, '<(0,0),1>'), (2, '<(1,0),1>')"
        ),
        "a NUL in a text": raised("SELECT %s::text", ["a\x00b"]),
    }
    retried = {
        "a serialization failure": raise_code("40001"),
        "a deadlock": raise_code("40P01"),
        "the server shutting down": raise_code("57P01"),
        "a disk full": raise_code("53100"),
        "a lock timeout": raise_code("55P03"),
        "an internal error": raise_code("XX000"),
        "a statement timeout": raised("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)"),
        "a read-only transaction (a standby)": raised(
            "SET TRANSACTION READ ONLY; DELETE FROM outbox_delivery"
        ),
        "a table not there yet": raised("SELECT * FROM outbox_not_migrated_yet"),
        "a lost connection": lost_connection(),
    }
    assert {why: refused_for_good(exc) for why, exc in refused.items()} == dict.fromkeys(
        refused, True
    )
    assert {why: refused_for_good(exc) for why, exc in retried.items()} == dict.fromkeys(
        retried, False
    )
    # Django's class says nothing: P0001 is psycopg 3's ProgrammingError, as a missing table is.
    assert type(refused["a plain RAISE EXCEPTION (P0001)"]) is type(
        retried["a table not there yet"]
    )


def lost_connection() -> DatabaseError:
    """The error of a statement on a connection the server has closed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()
    return caught.value


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_on_sqlite_a_constraint_or_a_trigger_is_refused_for_good_and_a_lock_retried():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE refusing (n integer CHECK (n > 0))")
        cursor.execute(
            "CREATE TEMP TRIGGER refuse_seven BEFORE INSERT ON refusing WHEN NEW.n = 7 "
            "BEGIN SELECT RAISE(ABORT, 'refused by a rule'); END"
        )
    assert refused_for_good(raised("INSERT INTO refusing VALUES (7)"))  # the trigger
    assert refused_for_good(raised("INSERT INTO refusing VALUES (-1)"))  # the check
    assert not refused_for_good(raised("SELECT * FROM outbox_not_migrated_yet"))
    assert not refused_for_good(database_is_locked())


def database_is_locked() -> DatabaseError:
    """ "database is locked": another connection holds the write lock, and we do not wait."""
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 0")
        try:
            return raised("CREATE TABLE outbox_locked_probe (n integer)")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout = 30000")
    finally:
        holder.close()
