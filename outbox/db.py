"""Database helpers shared by the enqueue path, the worker and the operator commands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, Literal, NamedTuple, TypeVar

from django.apps import apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, DataError, IntegrityError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

_M = TypeVar("_M", bound=Model)
_R = TypeVar("_R", bound=NamedTuple)

# Errors the database raises about itself, the session or the connection, never
# about a write: the same write may pass once the cause is gone, so it is
# retried. Everything else a database raises is about the write (a value too
# long, a NUL, a constraint, a site's trigger or rule, whatever its code) and
# refused again however often it is retried (``refused_for_good``).
# PostgreSQL's SQLSTATE classes (its manual, appendix A):
RETRIED_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # the connection: lost, refused, a pooler's protocol error
        "0A",  # "cached plan must not change result type" after a migration
        "25",  # a read-only transaction: a failover to a standby not yet promoted
        "26",  # a prepared statement a pooler's new server connection lacks
        "28",  # authentication on reconnecting (a password being rotated)
        "3D",  # a database not there yet (being restored)
        "40",  # a serialization failure or a deadlock: retry, says PostgreSQL
        "42",  # a table, column, function or grant missing: a deployment half done
        "53",  # out of disk, memory or connections
        "55",  # a lock timeout (55P03), an object in use
        "57",  # a statement timeout or cancel (57014), the server shutting down (57P)
        "58",  # an I/O error of the server
        "XX",  # the server's own internal error
    }
)
# SQLite's primary result codes of the same kind (sqlite3's ``sqlite_errorcode``,
# whose low byte it is): the plain error of a missing table or column (SQLITE_ERROR,
# as class 42 above), no permission, an abort, busy and locked, out of memory, a
# read-only or unopenable file, an interrupt, I/O, corruption, a full disk, the
# locking protocol, a schema changed, not a database. Left to refusals: a constraint
# or a trigger's RAISE (SQLITE_CONSTRAINT, ``IntegrityError``), a value too big, a
# type mismatch, a site's authorizer (SQLITE_AUTH), and any code not listed.
RETRIED_SQLITE_CODES = frozenset({1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 17, 26})
# Without a code (an error of the client library or of Django itself), only these
# are about the write; Django raises them for psycopg's and sqlite3's own classes.
REFUSED_FOR_GOOD = (DataError, IntegrityError)
_CONCRETE: dict[type[Model], tuple[str, ...]] = {}


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


class RowReader:
    """Reads a cursor's rows into a ``NamedTuple`` by column name, never by position.

    Each field of the named type takes the column of its name in
    ``cursor.description``; a field with a default may have no column (a
    statement that does not return it). Which column feeds which field is
    worked out once per named type and column list, so a row costs a tuple
    of the column names, one dictionary look-up and the tuple's own
    construction: about 3 us for the worker's 17-column step row (the reads by
    position it replaced took 0.4 us), against hundreds per email. A
    statement whose columns lack a field without a default raises
    ``LookupError`` naming it.
    """

    def __init__(self) -> None:
        # (named type, column names) -> the column of each field, or None
        # where the field takes its default; () when they are the same list.
        self._plans: dict[tuple[type, tuple[str, ...]], tuple[int | None, ...]] = {}

    def one(self, row_type: type[_R], cursor: Any, row: Sequence[Any]) -> _R:
        """``row`` (one of ``cursor``'s rows) as ``row_type``."""
        return self._read(row_type, self._plan(row_type, cursor), row)

    def all(self, row_type: type[_R], cursor: Any, rows: Sequence[Sequence[Any]]) -> list[_R]:
        """``rows`` (all of ``cursor``'s) as ``row_type``."""
        plan = self._plan(row_type, cursor)
        return [self._read(row_type, plan, row) for row in rows]

    def _plan(self, row_type: type[_R], cursor: Any) -> tuple[int | None, ...]:
        # The DB-API's description: one sequence per column, its name first.
        names = tuple(map(_first, cursor.description))
        plan = self._plans.get((row_type, names))
        if plan is None:
            plan = self._plans[(row_type, names)] = _plan(row_type, names)
        return plan

    @staticmethod
    def _read(row_type: type[_R], plan: tuple[int | None, ...], row: Sequence[Any]) -> _R:
        if not plan:
            return row_type._make(row)
        defaults = row_type._field_defaults
        return row_type._make(
            [
                row[i] if i is not None else defaults[name]
                for name, i in zip(row_type._fields, plan, strict=True)
            ]
        )


def _plan(row_type: type[NamedTuple], names: tuple[str, ...]) -> tuple[int | None, ...]:
    if names == row_type._fields:
        return ()
    where = {name: i for i, name in enumerate(names)}
    for name in row_type._fields:
        if name not in where and name not in row_type._field_defaults:
            raise LookupError(f"{row_type.__name__}: no column {name!r} among {names}")
    return tuple(where.get(name) for name in row_type._fields)


_first = itemgetter(0)

# One for the process: a plan depends only on the named type and the columns.
rows_by_name = RowReader()


def refused_for_good(exc: BaseException) -> bool:
    """Whether retrying the write that raised ``exc`` cannot help: the database refuses it.

    Read from the code the database gave, not from Django's class for it (a
    trigger's plain ``RAISE EXCEPTION``, SQLSTATE P0001, is a
    ``ProgrammingError`` with psycopg 3 and an ``InternalError`` with
    psycopg 2): a ``DatabaseError`` is refused for good unless its code is
    the connection's, the session's or the server's (``RETRIED_SQLSTATE_CLASSES``,
    ``RETRIED_SQLITE_CODES``). A code of a site's own (``RAISE ... USING ERRCODE
    = 'XY001'``) is a refusal too. Without a code (the client library's own
    errors: a connection closed, an interface error) only ``REFUSED_FOR_GOOD``
    is; the rest is retried.
    """
    if not isinstance(exc, DatabaseError):
        return False
    # Django's wrapper keeps the driver's exception as __cause__ (documented).
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        return sqlstate[:2].upper() not in RETRIED_SQLSTATE_CLASSES
    sqlite_code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return sqlite_code & 0xFF not in RETRIED_SQLITE_CODES
    return isinstance(exc, REFUSED_FOR_GOOD)


def storable(text: str) -> str:
    """``text`` as any database stores it: NULs and lone surrogates escaped, nothing lost.

    PostgreSQL refuses a NUL in a text value, and psycopg cannot encode a lone
    surrogate (which an exception's message may hold): either would make the
    write that records an error fail for good.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
    """A model instance as the database would have loaded it: ``Model.from_db``.

    ``values`` must name every concrete field (a KeyError names a missing
    one), so that no attribute is left deferred; they are passed
    in the fields' order, which is ``Model.__init__``'s fast path (measured:
    about 3 µs more per Delivery than an instance built without
    ``__init__``, which needed Django's private ``_state``).
    """
    names = _CONCRETE.get(model)
    if names is None:
        names = _CONCRETE[model] = tuple(f.attname for f in model._meta.concrete_fields)
    return model.from_db(using, names, [values[name] for name in names])


def database_address(alias: str) -> str:
    """Where database ``alias`` is, for an error message (never its password)."""
    connection = connections[alias]
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"database {alias!r} (SQLite file {settings.get('NAME')})"
    host = settings.get("HOST") or "localhost"
    port = settings.get("PORT")
    where = f"{host}:{port}" if port else str(host)
    return f"database {alias!r} ({connection.vendor} {settings.get('NAME')!r} at {where})"


@dataclass(frozen=True)
class DatabaseProblem:
    """Why the outbox cannot use a database: it does not answer, or lacks the tables."""

    kind: Literal["unreachable", "not migrated"]
    alias: str
    detail: str

    def __str__(self) -> str:
        where = database_address(self.alias)
        if self.kind == "unreachable":
            return f"{where} is unreachable: {self.detail}"
        return f"{where} is not migrated: {self.detail}; run manage.py migrate"


def database_problem(alias: str) -> DatabaseProblem | None:
    """None when the outbox's migrations are all applied on ``alias``; else what is wrong.

    Tells "the database does not answer" from "it answers, but the outbox's
    tables are missing", which both surface as a ``DatabaseError`` on the first
    query (``no such table``, ``relation ... does not exist``). Asks the
    migration recorder, as ``migrate --plan`` does; reads the migration files,
    so it is for a command's start or its error path, not for every query.
    """
    from django.db.migrations.loader import MigrationLoader

    label = apps.get_containing_app_config(__name__).label  # type: ignore[union-attr]
    connection = connections[alias]
    try:
        loader = MigrationLoader(connection, ignore_no_migrations=True)
        tables = set(connection.introspection.table_names())
    except DatabaseError as exc:
        return DatabaseProblem("unreachable", alias, f"{type(exc).__name__}: {exc}")
    wanted = {
        key
        for leaf in loader.graph.leaf_nodes(label)
        for key in loader.graph.forwards_plan(leaf)
        if key[0] == label
    }
    pending = sorted(name for app, name in wanted - set(loader.applied_migrations))
    if pending:
        shown = ", ".join(pending[:3]) + (
            f" and {len(pending) - 3} more" if len(pending) > 3 else ""
        )
        return DatabaseProblem("not migrated", alias, f"{label} migrations {shown} not applied")
    missing = sorted(
        model._meta.db_table
        for model in apps.get_app_config(label).get_models()
        if model._meta.managed and not model._meta.proxy and model._meta.db_table not in tables
    )
    if missing:
        return DatabaseProblem("not migrated", alias, f"no table {', '.join(missing)}")
    return None
