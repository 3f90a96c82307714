"""How a transition is written: the values it sets, and its statement and ORM update for a database.

The table itself is :mod:`outbox.transitions.table`; the package's docstring says what a
transition is and why there is one source for each.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Case, DateTimeField, F, Field, Func, Q, Value, When
from django.db.models.functions import Greatest

from ..models import Delivery, Email, InstantField, outbox_alias

TABLE = Delivery._meta.db_table
_EMAILS = Email._meta.db_table
Placeholder = Callable[[str], str]  # a parameter's name -> its text in the statement


def named(**renamed: str) -> Placeholder:
    """Django's (and psycopg's) named parameters, ``%(name)s``, some of them renamed."""
    return lambda name: f"%({renamed.get(name, name)})s"


# -- the values a transition writes ------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """A value the caller passes, by name (``%(name)s`` in the SQL)."""

    name: str

    def sql(self, vendor: str, param: Placeholder) -> str:
        return param(self.name)

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        return params[self.name]


@dataclass(frozen=True)
class Const:
    """A constant: a status, an empty text, NULL, 0."""

    value: str | int | None

    def sql(self, vendor: str, param: Placeholder) -> str:
        if self.value is None:
            return "NULL"
        if isinstance(self.value, int):
            return str(self.value)
        # Only the app's own words are written out (statuses, ''): never a user's text.
        assert re.fullmatch(r"[a-z_]*", self.value), self.value
        return f"'{self.value}'"

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        return self.value


@dataclass(frozen=True)
class Column:
    """The row's own value of ``name``, plus ``add`` (``attempts + 1``)."""

    name: str
    add: int = 0

    def sql(self, vendor: str, param: Placeholder) -> str:
        return (
            f"{self.name} {'+' if self.add >= 0 else '-'} {abs(self.add)}"
            if self.add
            else self.name
        )

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        return F(self.name) + self.add if self.add else F(self.name)


@dataclass(frozen=True)
class _Clock:
    """The clock whether a row is due or expired is read by (module docstring).

    On SQLite it is the ``now`` passed in; ``instant`` is that clock as
    compared with or written to ``not_before`` and ``expires_at``, which are
    stored in UTC whatever ``USE_TZ`` says (``outbox.models.InstantField``), so a raw
    statement takes it as its own parameter, ``now_instant``
    (``outbox.models.stored(now, connection)``); so does a :class:`Param`
    written to one of them (``retry_at``, ``not_before``) when a transition
    runs as a raw statement rather than through :meth:`Transition.apply`.
    """

    instant: bool = False

    def sql(self, vendor: str, param: Placeholder) -> str:
        if vendor == "postgresql":
            return "now()"
        return param("now_instant" if self.instant else "now")

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        if vendor == "postgresql":
            return _TransactionNow()
        return Value(params["now"], InstantField()) if self.instant else params["now"]


class _TransactionNow(Func):
    """PostgreSQL's ``now()``: the transaction's start, as the statements read it.

    Not Django's ``Now()``, which is the statement's time on PostgreSQL: an
    operation reads ``now()`` first (``outbox.db.database_now``) and must
    write the same time its rows get.
    """

    template = "now()"
    output_field = DateTimeField()


CLOCK = _Clock()
INSTANT_CLOCK = _Clock(instant=True)


@dataclass(frozen=True)
class NotBefore:
    """A requeue that keeps a schedule still ahead: the later of ``not_before`` and the clock."""

    def sql(self, vendor: str, param: Placeholder) -> str:
        clock = INSTANT_CLOCK.sql(vendor, param)
        return (
            f"GREATEST(not_before, {clock})"
            if vendor == "postgresql"
            else f"MAX(not_before, {clock})"
        )

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        return Greatest(
            F("not_before"), INSTANT_CLOCK.orm(vendor, params), output_field=InstantField()
        )


@dataclass(frozen=True)
class IfExpired:
    """``then`` for a row past its ``expires_at`` by the clock, else ``otherwise`` (the mark)."""

    then: Any
    otherwise: Any

    def sql(self, vendor: str, param: Placeholder) -> str:
        return (
            f"CASE WHEN expires_at <= {INSTANT_CLOCK.sql(vendor, param)} THEN {self.then.sql(vendor, param)} "
            f"ELSE {self.otherwise.sql(vendor, param)} END"
        )

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        # Typed as the column it keeps, if either branch keeps one (a text
        # parameter and a TextField would otherwise be "mixed types").
        kept = [
            Delivery._meta.get_field(v.name)
            for v in (self.then, self.otherwise)
            if isinstance(v, Column)
        ]
        return Case(
            When(
                expires_at__lte=INSTANT_CLOCK.orm(vendor, params),
                then=_expression(self.then.orm(vendor, params)),
            ),
            default=_expression(self.otherwise.orm(vendor, params)),
            output_field=kept[0] if kept and isinstance(kept[0], Field) else None,
        )


def _expression(value: Any) -> Any:
    # Case and When would read a string as a column's name: a value is wrapped.
    return value if hasattr(value, "resolve_expression") else Value(value)


def _listed(columns: tuple[str, ...]) -> str:
    """``a, b, c``; an expression over several lines starts a line of its own."""
    text = columns[0]
    for column in columns[1:]:
        text += (",\n    " if "\n" in column else ", ") + column
    return text


# -- a transition ------------------------------------------------------------------------

TOKEN = "token"  # guard: the attempt's claim token, ``claim_token = %(token)s``
DUE = "due"  # guard: the row is due by the clock, ``not_before <= now``
UNEXPIRED = "unexpired"  # guard: not past its ``expires_at`` by the clock
# Not one row but the others of its message: ``email_id = %(email)s AND id <> %(id)s``.
COMPANIONS = "companions"
# guard: its email's content is still there (``Email.content_cleared_at IS NULL``): a row
# is never queued again with nothing to send (``outbox.sweeper.retention``).
CONTENT = "content"


@dataclass(frozen=True)
class Transition:
    """One conditional UPDATE of a delivery row (module docstring)."""

    name: str
    source: tuple[str, ...]
    sets: Mapping[str, Any]  # column -> Param, Const, Column, CLOCK, NotBefore, IfExpired
    guard: tuple[str, ...] = ()
    returns: tuple[str, ...] = ()
    # The Attempt outcome :func:`outbox.operations.transition` logs for each row
    # it changes (the worker logs its own attempts).
    logged_as: str = ""

    @property
    def target(self) -> Any:
        """The status written (an :class:`IfExpired` for the mark)."""
        return self.sets["status"]

    def sql(
        self,
        vendor: str,
        param: Placeholder | None = None,
        join: str = "",
        returning: tuple[str, ...] | None = None,
    ) -> str:
        """The statement for the row ``WHERE id = <id>`` (or its companions); ``param`` writes
        each parameter.

        ``param`` defaults to :func:`named`; the PL/pgSQL functions pass their
        own (their arguments, or the columns of a set of steps,
        joined in as ``FROM <join>``).

        The status test is ``(status ...) IS TRUE``, which no index serves:
        PostgreSQL may otherwise plan it on a partial index of queued rows
        when its statistics say few rows are queued, and each claim would
        then scan every queued row.
        """
        put = param or named()
        sets = ",\n    ".join(f"{col} = {v.sql(vendor, put)}" for col, v in self.sets.items())
        statuses = ", ".join(Const(s).sql(vendor, put) for s in self.source)
        if COMPANIONS in self.guard:
            where = [f"email_id = {put('email')}", f"id <> {put('id')}"]
        else:
            where = [f"id = {put('id')}"]
        where.append(f"(status IN ({statuses})) IS TRUE")
        if TOKEN in self.guard:
            where.append(f"claim_token = {put('token')}")
        if DUE in self.guard:
            where.append(f"not_before <= {INSTANT_CLOCK.sql(vendor, put)}")
        if UNEXPIRED in self.guard:
            clock = INSTANT_CLOCK.sql(vendor, put)
            where.append(f"(expires_at IS NULL OR expires_at > {clock})")
        if CONTENT in self.guard:
            where.append(f"email_id IN (SELECT id FROM {_EMAILS} WHERE content_cleared_at IS NULL)")
        text = f"UPDATE {TABLE} SET\n    {sets}\n"
        if join:
            text += f"FROM {join}\n"
        text += "WHERE " + "\n    AND ".join(where) + "\n"
        returns = self.returns if returning is None else returning
        if returns:
            text += f"RETURNING {_listed(returns)}\n"
        return text

    def match(self, token: Any = None, vendor: str = "", **params: Any) -> Q:
        """The rows it may change, for an ORM filter: the statement's ``WHERE`` but for the id.

        A guard on the clock (due, unexpired) needs ``vendor`` and ``now``;
        the companions' needs ``email`` and ``id`` (the claimed row's).
        """
        if {DUE, UNEXPIRED} & set(self.guard) and not vendor:
            raise ValueError(
                f"{self.name}: whose clock decides depends on the database: pass vendor"
            )
        found = Q(status__in=list(self.source))
        if COMPANIONS in self.guard:
            found &= Q(email_id=params["email"]) & ~Q(pk=params["id"])
        if TOKEN in self.guard:
            found &= Q(claim_token=token)
        if DUE in self.guard:
            found &= Q(not_before__lte=INSTANT_CLOCK.orm(vendor, params))
        if UNEXPIRED in self.guard:
            clock = INSTANT_CLOCK.orm(vendor, params)
            found &= Q(expires_at__isnull=True) | Q(expires_at__gt=clock)
        if CONTENT in self.guard:
            found &= Q(email__content_cleared_at__isnull=True)
        return found

    def values(self, vendor: str, **params: Any) -> dict[str, Any]:
        """The columns it writes, for ``QuerySet.update(**values)``."""
        return {col: v.orm(vendor, params) for col, v in self.sets.items()}

    def apply(self, pk: int | None, token: uuid.UUID | None = None, **params: Any) -> int:
        """Run it through the ORM, on the outbox's database; the rows changed.

        On the row ``pk`` (0 or 1), or on the companions of ``params["id"]``
        (``pk`` None). ``token`` is the attempt's claim token: the one
        the row must have when the transition is guarded by it, the one a
        mark writes; ``params`` are the values its ``sets``
        and guards name (extra ones are ignored).
        """
        if pk is None and COMPANIONS not in self.guard:
            raise ValueError(f"{self.name}: on one row: pass its pk")
        using = outbox_alias()
        vendor = connections[using].vendor
        rows = Delivery.objects.using(using).filter(self.match(token, vendor, **params))
        if pk is not None:
            rows = rows.filter(pk=pk)
        # One token, as in the statement: the guard's and the one written (the marks').
        return rows.update(**self.values(vendor, token=token, **params))

    def keeps_schedule(self) -> bool:
        """Whether a requeued row keeps a ``not_before`` still ahead (its push must too)."""
        return isinstance(self.sets.get("not_before"), NotBefore)
