"""Every change of a delivery's status, written once: where it starts, what guards it, what it sets.

Each :class:`Transition` in ``table.py`` is one conditional UPDATE of ``outbox_delivery``:
the statuses the row must be in (``source``), what else must hold (``guard``:
the claim token of the attempt, or that the row is due; or, instead of one row,
its message's other rows), and the columns it
writes (``sets``). Nothing else in the package writes a status. Two renderings
are derived from the same entry:

- :meth:`Transition.sql`: the statement's text for one database, which the
  worker's step runs (``MARK`` and ``SENT``: see ``outbox/worker/sql.py``), also
  inside its PL/pgSQL functions (``outbox/worker/functions.py``);
- :meth:`Transition.values` and :meth:`Transition.match`: the same write as a
  Django ``QuerySet.update()``, which the worker's other outcomes and every
  operator or sweeper change run (:mod:`outbox.operations`).

What a database does differently is written in ``render.py`` only: whose clock
(``_Clock``: whether a row is due or expired, and the time written where the
table says "the clock", is the database server's ``now()`` on PostgreSQL and
the ``now`` the caller passes on SQLite, which has no server clock: Redis
time, or an operator's host time), and how the later of two times is spelt
(``NotBefore``).

A count of the rows changed is the answer of every transition: 0 means the row
was not in a source status (settled by someone else, a stale id, a late
worker), and the caller acts on that, never on a status it read before.
"""

from .render import (
    CLOCK,
    COMPANIONS,
    DUE,
    TOKEN,
    UNEXPIRED,
    Column,
    Const,
    IfExpired,
    NotBefore,
    Param,
    Placeholder,
    Transition,
    named,
)
from .table import (
    ABANDON,
    ALL,
    CANCEL,
    DROPPED,
    EXPIRE,
    FAIL_DEAD,
    FAILED,
    IN_DOUBT,
    MARK,
    MARK_COMPANIONS,
    MARK_FAILED,
    MARK_SENT,
    NOTE_SERVER,
    RELEASE,
    RELEASE_COMPANIONS,
    REQUEUE,
    REQUEUE_DEAD,
    REQUEUE_NOT_SENT,
    REQUEUE_NOW,
    RETRY,
    SENT,
)

__all__ = [
    "ABANDON",
    "ALL",
    "CANCEL",
    "CLOCK",
    "COMPANIONS",
    "DROPPED",
    "DUE",
    "EXPIRE",
    "FAILED",
    "FAIL_DEAD",
    "IN_DOUBT",
    "MARK",
    "MARK_COMPANIONS",
    "MARK_FAILED",
    "MARK_SENT",
    "NOTE_SERVER",
    "RELEASE",
    "RELEASE_COMPANIONS",
    "REQUEUE",
    "REQUEUE_DEAD",
    "REQUEUE_NOT_SENT",
    "REQUEUE_NOW",
    "RETRY",
    "SENT",
    "TOKEN",
    "UNEXPIRED",
    "Column",
    "Const",
    "IfExpired",
    "NotBefore",
    "Param",
    "Placeholder",
    "Transition",
    "named",
]
