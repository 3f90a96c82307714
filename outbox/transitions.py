"""Every change of a delivery's status, written once: where it starts, what guards it, what it sets.

Each :class:`Transition` below is one conditional UPDATE of ``outbox_delivery``:
the statuses the row must be in (``source``), what else must hold (``guard``:
the claim token of the attempt, or that the row is due), and the columns it
writes (``sets``). Nothing else in the package writes a status. Two renderings
are derived from the same entry:

- :meth:`Transition.sql`: the statement's text for one database, which the
  worker's step runs (``CLAIM`` and ``SENT``: see ``outbox/worker/sql.py``);
- :meth:`Transition.values` and :meth:`Transition.match`: the same write as a
  Django ``QuerySet.update()``, which the worker's other outcomes and every
  operator or sweeper change run (:mod:`outbox.operations`).

What a database does differently is one branch, in :meth:`_Clock.sql` and
:meth:`_Clock.orm`: whether a row is due or expired, and the time written where
the table says "the clock", is the database server's ``now()`` on PostgreSQL,
and the ``now`` the caller passes (Redis time, or an operator's host time) on
SQLite, which has no server clock.

A count of the rows changed is the answer of every transition: 0 means the row
was not in a source status (settled by someone else, a stale id, a late
worker), and the caller acts on that, never on a status it read before.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import DateTimeField, F, Func, Q, Value
from django.db.models.functions import Greatest

from .models import Attempt, Delivery, outbox_alias

Status = Delivery.Status
Outcome = Attempt.Outcome
TABLE = Delivery._meta.db_table
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
    """The clock whether a row is due or expired is read by (module docstring)."""

    def sql(self, vendor: str, param: Placeholder) -> str:
        return "now()" if vendor == "postgresql" else param("now")

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        return _TransactionNow() if vendor == "postgresql" else params["now"]


class _TransactionNow(Func):
    """PostgreSQL's ``now()``: the transaction's start, as the statements read it.

    Not Django's ``Now()``, which is the statement's time on PostgreSQL: an
    operation reads ``now()`` first (``outbox.db.database_now``) and must
    write the same time its rows get.
    """

    template = "now()"
    output_field = DateTimeField()


CLOCK = _Clock()


@dataclass(frozen=True)
class NotBefore:
    """A requeue that keeps a schedule still ahead: the later of ``not_before`` and the clock."""

    def sql(self, vendor: str, param: Placeholder) -> str:
        clock = CLOCK.sql(vendor, param)
        return (
            f"GREATEST(not_before, {clock})"
            if vendor == "postgresql"
            else f"MAX(not_before, {clock})"
        )

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        clock = CLOCK.orm(vendor, params)
        return Greatest(
            F("not_before"), clock if vendor == "postgresql" else Value(clock, DateTimeField())
        )


@dataclass(frozen=True)
class IfExpired:
    """``then`` for a row past its ``expires_at`` by the clock, else ``otherwise`` (the claim)."""

    then: Any
    otherwise: Any

    def sql(self, vendor: str, param: Placeholder) -> str:
        return (
            f"CASE WHEN expires_at <= {CLOCK.sql(vendor, param)} THEN {self.then.sql(vendor, param)} "
            f"ELSE {self.otherwise.sql(vendor, param)} END"
        )

    def orm(self, vendor: str, params: Mapping[str, Any]) -> Any:
        raise TypeError("the claim runs as its statement only (the worker's step)")


# -- a transition ------------------------------------------------------------------------

TOKEN = "token"  # guard: the attempt's claim token, ``claim_token = %(token)s``
DUE = "due"  # guard: the row is due by the clock, ``not_before <= now``


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
        """The status written (an :class:`IfExpired` for the claim)."""
        return self.sets["status"]

    def sql(
        self,
        vendor: str,
        param: Placeholder | None = None,
        join: str = "",
        returning: tuple[str, ...] | None = None,
    ) -> str:
        """The statement for the row ``WHERE id = <id>``; ``param`` writes each parameter.

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
        where = [f"id = {put('id')}", f"(status IN ({statuses})) IS TRUE"]
        if TOKEN in self.guard:
            where.append(f"claim_token = {put('token')}")
        if DUE in self.guard:
            where.append(f"not_before <= {CLOCK.sql(vendor, put)}")
        text = f"UPDATE {TABLE} SET\n    {sets}\n"
        if join:
            text += f"FROM {join}\n"
        text += "WHERE " + " AND ".join(where) + "\n"
        returns = self.returns if returning is None else returning
        if returns:
            text += "RETURNING " + ", ".join(returns) + "\n"
        return text

    def match(self, token: Any = None) -> Q:
        """The rows it may change, for an ORM filter (ids and other conditions are the caller's)."""
        found = Q(status__in=list(self.source))
        if TOKEN in self.guard:
            found &= Q(claim_token=token)
        if DUE in self.guard:
            raise ValueError(f"{self.name}: the due test is the worker's statement's only")
        return found

    def values(self, vendor: str, **params: Any) -> dict[str, Any]:
        """The columns it writes, for ``QuerySet.update(**values)``."""
        return {col: v.orm(vendor, params) for col, v in self.sets.items()}

    def apply(self, pk: int, token: uuid.UUID | None = None, **params: Any) -> int:
        """Run it on one row through the ORM, on the outbox's database; the rows changed (0 or 1).

        ``token`` is the attempt's claim token when the transition is guarded
        by it; ``params`` are the values its ``sets`` name (extra ones are ignored).
        """
        using = outbox_alias()
        vendor = connections[using].vendor
        rows = Delivery.objects.using(using).filter(self.match(token), pk=pk)
        return rows.update(**self.values(vendor, **params))

    def keeps_schedule(self) -> bool:
        """Whether a requeued row keeps a ``not_before`` still ahead (its push must too)."""
        return isinstance(self.sets.get("not_before"), NotBefore)


# -- the table ---------------------------------------------------------------------------

_NOW = Param("now")
_ERROR = Param("error")
_UNCLAIMED = {"claim_token": Const(None), "worker_id": Const("")}

# The worker's, one row under the claim token of its attempt.

CLAIM = Transition(
    "claim",
    source=(Status.QUEUED,),
    guard=(DUE,),
    # A row past its expires_at is claimed into cancelled instead, without
    # counting an attempt; its status, returned last, tells the worker to drop it.
    sets={
        "status": IfExpired(Const(Status.CANCELLED), Const(Status.PROCESSING)),
        "last_error": IfExpired(Param("expired"), Column("last_error")),
        "worker_id": Param("worker"),
        "claim_token": Param("token"),
        "processing_started_at": _NOW,
        "updated_at": _NOW,
        "attempts": IfExpired(Column("attempts"), Column("attempts", 1)),
    },
    returns=(
        "email_id",
        "recipient",
        "priority",
        "attempts",
        "max_attempts",
        "message_id",
        "status",
    ),
)
SENT = Transition(
    "sent",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.SENT),
        "sent_at": _NOW,
        "updated_at": _NOW,
        "last_error": Const(""),
    },
)
FAILED = Transition(
    "failed",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
)
IN_DOUBT = Transition(
    "in doubt",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={"status": Const(Status.ABANDONED), "last_error": _ERROR, "updated_at": _NOW},
)
# Not sent, and never to be (the staging valve refused it, or it expired at
# the send): the attempt does not count.
DROPPED = Transition(
    "dropped",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.CANCELLED),
        "attempts": Column("attempts", -1),
        "last_error": _ERROR,
        "updated_at": _NOW,
    },
)
RETRY = Transition(
    "retry",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.QUEUED),
        "not_before": Param("retry_at"),
        "last_error": _ERROR,
        **_UNCLAIMED,
        "updated_at": _NOW,
    },
)
# Given back unsent (the lease ran out, the process stops): not an attempt.
RELEASE = Transition(
    "release",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.QUEUED),
        "attempts": Column("attempts", -1),
        "not_before": Param("not_before"),
        **_UNCLAIMED,
        "updated_at": _NOW,
    },
)
# Not a change of status: where this attempt hands the row over, written
# before SMTP's final dot while the row is still the attempt's.
NOTE_SERVER = Transition(
    "note server",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.PROCESSING),
        "server_host": Param("host"),
        "server_address": Param("address"),
    },
)

# The sweeper's and the operators' (outbox.operations: many rows, an Attempt
# row each). A row becoming queued gets ``updated_at`` from the clock: the
# sweeper's incremental mirror check compares it with the database's
# (outbox/sweeper/mirror.py), whoever's host wrote it.

_BACK_TO_QUEUED = {"status": Const(Status.QUEUED), **_UNCLAIMED, "updated_at": CLOCK}

REQUEUE = Transition(
    "requeue",
    source=(Status.ABANDONED, Status.FAILED, Status.CANCELLED),
    sets={
        **_BACK_TO_QUEUED,
        "not_before": NotBefore(),
        "attempts": Const(0),
        "sent_at": Const(None),
    },
    logged_as=Outcome.REQUEUED,
)
REQUEUE_NOW = Transition(
    "requeue now",
    source=REQUEUE.source,
    sets={**_BACK_TO_QUEUED, "not_before": _NOW, "attempts": Const(0), "sent_at": Const(None)},
    logged_as=Outcome.REQUEUED,
)
REQUEUE_DEAD = Transition(
    "requeue dead",  # its worker died mid-send, the policy is "requeue"
    source=(Status.PROCESSING,),
    sets={**_BACK_TO_QUEUED, "not_before": _NOW},
    logged_as=Outcome.REQUEUED,
)
REQUEUE_NOT_SENT = Transition(
    "requeue not sent",  # a reconciler found it never left
    source=(Status.ABANDONED,),
    sets={**_BACK_TO_QUEUED, "not_before": _NOW},
    logged_as=Outcome.REQUEUED,
)
ABANDON = Transition(
    "abandon",  # its worker died mid-send, the policy is "review"
    source=(Status.PROCESSING,),
    sets={"status": Const(Status.ABANDONED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.ABANDONED,
)
FAIL_DEAD = Transition(
    "fail dead",  # its worker died mid-send on its last attempt
    source=(Status.PROCESSING,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.FAILED,
)
MARK_SENT = Transition(
    "mark sent",  # the attempt log keeps why it was abandoned
    source=(Status.ABANDONED,),
    sets={
        "status": Const(Status.SENT),
        "sent_at": _NOW,
        "last_error": Const(""),
        "updated_at": _NOW,
    },
    logged_as=Outcome.MARKED_SENT,
)
MARK_FAILED = Transition(
    "mark failed",
    source=(Status.ABANDONED,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.MARKED_FAILED,
)
CANCEL = Transition(
    "cancel",
    source=(Status.QUEUED, Status.ABANDONED),
    sets={"status": Const(Status.CANCELLED), "updated_at": _NOW},
    logged_as=Outcome.CANCELLED,
)
EXPIRE = Transition(
    "expire",  # queued past its expires_at (the sweeper; the claim does the same for itself)
    source=(Status.QUEUED,),
    sets={"status": Const(Status.CANCELLED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.CANCELLED,
)

ALL = (
    CLAIM, SENT, FAILED, IN_DOUBT, DROPPED, RETRY, RELEASE, NOTE_SERVER,
    REQUEUE, REQUEUE_NOW, REQUEUE_DEAD, REQUEUE_NOT_SENT, ABANDON, FAIL_DEAD,
    MARK_SENT, MARK_FAILED, CANCEL, EXPIRE,
)  # fmt: skip
