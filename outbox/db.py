"""Database helpers shared by the enqueue path and the worker."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def binding_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor that sends parameters separately, so its statements can be prepared.

    Django's default psycopg 3 cursor binds parameters client-side, so every
    execution is parsed and planned anew; for the outbox's one-statement hot
    paths, planning costs PostgreSQL about as much CPU as running them. A
    server-binding cursor lets psycopg prepare them, but only when the
    connection allows prepared statements: Django turns them off unless
    ``OPTIONS["prepare_threshold"]`` is set, because transaction-pooling
    PgBouncer (before 1.21) breaks them. So this follows the project's choice,
    and is a plain Django cursor otherwise (and on psycopg 2).
    """
    connection.ensure_connection()
    raw = connection.connection
    if getattr(raw, "prepare_threshold", None) is None:
        return connection.cursor()
    import psycopg  # a prepare_threshold means psycopg 3

    cursor: Any = psycopg.Cursor(raw)  # wrapped like Django's own cursors
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)
