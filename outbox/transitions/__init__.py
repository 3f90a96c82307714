"""Every change of a delivery's status, written once: where it starts, what guards it, what it sets.

Each :class:`Transition` in :mod:`~outbox.transitions.table` is one conditional UPDATE of
``outbox_delivery``: the statuses the row must be in (``source``), what else must hold (``guard``:
the claim token of the attempt, or that the row is due, or that its email's content
is still there; or, instead of one row, its message's other rows), and the columns it
writes (``sets``). Nothing else in the package writes a status. Two renderings
are derived from the same entry:

- :meth:`Transition.sql`: the statement's text for one database, which the
  worker runs for its claim, its success and a message's companions, also
  inside its PL/pgSQL functions (all four written in :mod:`outbox.transitions.hotpath`);
- :meth:`Transition.values` and :meth:`Transition.match`: the same write as a
  Django ``QuerySet.update()``, which the worker's other outcomes and every
  operator or sweeper change run (:mod:`outbox.operations`). Every transition
  renders both ways, so none can be used on a path it cannot run on.

What a database does differently is written in :mod:`outbox.transitions.render` only: whose clock
(``_Clock``: whether a row is due or expired, and the time written where the
table says "the clock", is the database server's ``now()`` on PostgreSQL and
the ``now`` the caller passes on SQLite, which has no server clock: Redis
time, or an operator's host time), and how the later of two times is spelt
(``NotBefore``).

A count of the rows changed is the answer of every transition: 0 means the row
was not in a source status (settled by someone else, a stale id, a late
worker), and the caller acts on that, never on a status it read before.

What runs, as SQL: ``sql/postgresql.sql`` and ``sql/sqlite.sql`` hold every
statement above for each database, PostgreSQL's function DDL included, each
under a comment naming its transition; ``python -m outbox.transitions --write``
writes them and ``tests/transitions/test_sql.py`` fails while they differ from
what the table renders. Design note: they are written out and checked rather
than only printed on demand, so that a change to the table or the renderer
shows in review as a diff of the SQL it changes, next to the Python that
changed it, and a reader can open the SQL without running anything.

Importing this package loads no model until a name is used, so that
``python -m outbox.transitions`` can set Django up first.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .render import (
        CLOCK,
        COMPANIONS,
        CONTENT,
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

_RENDER = {
    "CLOCK", "COMPANIONS", "CONTENT", "DUE", "TOKEN", "UNEXPIRED", "Column", "Const", "IfExpired",
    "NotBefore", "Param", "Placeholder", "Transition", "named",
}  # fmt: skip

__all__ = [
    "ABANDON",
    "ALL",
    "CANCEL",
    "CLOCK",
    "COMPANIONS",
    "CONTENT",
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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = import_module(".render" if name in _RENDER else ".table", __name__)
    return getattr(home, name)
