"""Database helpers shared by the enqueue path and the worker."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def binding_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor that sends its parameters apart from the statement (psycopg 3).

    Django's default psycopg 3 cursor binds parameters client-side: psycopg
    quotes every value into the SQL text, which for the outbox's one-statement
    hot paths costs the client more than anything else it does (a quarter of
    an ``enqueue_email`` call). A server-binding cursor sends them separately,
    in the same round trip, as an unnamed statement of the extended protocol,
    which transaction-pooling PgBouncer passes through like any other.

    It is prepared (a named statement, planned once per connection) only when
    the project allows prepared statements: Django leaves psycopg's
    ``prepare_threshold`` unset unless ``OPTIONS["prepare_threshold"]`` is
    given, because PgBouncer in transaction mode (before 1.21) breaks them.
    Elsewhere (SQLite, psycopg 2) this is a plain Django cursor.
    """
    connection.ensure_connection()
    if connection.vendor != "postgresql":
        return connection.cursor()
    raw = connection.connection
    try:
        import psycopg
    except ImportError:  # psycopg 2: client-side binding only
        return connection.cursor()
    if not isinstance(raw, psycopg.Connection):
        return connection.cursor()
    cursor: Any = psycopg.Cursor(raw)  # wrapped like Django's own cursors
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)
