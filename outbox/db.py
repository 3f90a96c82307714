"""Database helpers shared by the enqueue path and the worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, signals
from django.db.models.base import ModelState

_M = TypeVar("_M", bound=Model)
_CONCRETE: dict[type[Model], frozenset[str]] = {}


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


def database_now(using: str) -> datetime | None:
    """The database server's clock, ``now()``, on PostgreSQL; None on SQLite (it has none).

    Inside a transaction this is the transaction's start, the value every
    ``now()`` of its statements reads; in autocommit, the statement's. It is
    what Django stores: naive in ``TIME_ZONE`` without ``USE_TZ`` (the
    session's zone then), so that it compares with the values the ORM reads.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        moment: datetime = cursor.fetchone()[0]
    if not settings.USE_TZ and moment.tzinfo is not None:
        moment = moment.astimezone(connection.timezone).replace(tzinfo=None)
    return moment


def database_time(using: str) -> float | None:
    """:func:`database_now` as epoch seconds; None on SQLite."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now())")
        return float(cursor.fetchone()[0])


def loaded_instance(model: type[_M], values: dict[str, Any], using: str = DEFAULT_DB_ALIAS) -> _M:
    """A model instance as the database would have loaded it.

    ``Model.__init__`` walks every field with its default: the largest piece
    of the worker's own CPU per email, and a tenth of an ``enqueue_email``
    call's. So the instance is built without it, unless a ``pre_init`` or
    ``post_init`` receiver listens to the model: then it is built by
    ``Model.from_db``, like any loaded row, and the receivers run. ``values``
    must name every concrete field, so that no attribute is left deferred
    (and read back from the database on first use).
    """
    concrete = _CONCRETE.get(model)
    if concrete is None:
        concrete = _CONCRETE[model] = frozenset(f.attname for f in model._meta.concrete_fields)
    assert values.keys() >= concrete, f"{model.__name__}: a field is missing"
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model.from_db(using, list(values), list(values.values()))
    obj = model.__new__(model)
    state = ModelState()
    state.adding = False
    state.db = using
    obj._state = state
    obj.__dict__.update(values)
    return obj
