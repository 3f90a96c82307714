"""Every statement the table renders for one database, as one SQL text: ``sql/<database>.sql``.

``python -m outbox.transitions postgresql`` prints it; ``--write`` writes both
files, which ``tests/transitions/test_sql.py`` compares with what the table
renders now (the package docstring says why they are checked in).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import hotpath, table
from .render import Transition

DATABASES = ("postgresql", "sqlite")
FOLDER = Path(__file__).resolve().parent / "sql"
COMMAND = "python -m outbox.transitions --write"

# The worker's, run as raw statements: the transition, the function that writes
# its statement, and what it is for.
_WORKER: tuple[tuple[Transition, Callable[[str], str], str], ...] = (
    (table.MARK, hotpath.mark, "the mark of one row (step 2)"),
    (table.SENT, hotpath.sent, "the success of one row (step 4)"),
    (table.MARK_COMPANIONS, hotpath.companions, "a drop-in message's other rows, to an ESP"),
    (table.RELEASE_COMPANIONS, hotpath.release_companions, "those rows back, unsent"),
)


def path(vendor: str) -> Path:
    """The checked-in file of ``vendor``'s statements."""
    return FOLDER / f"{vendor}.sql"


def dump(vendor: str) -> str:
    """Every statement of ``vendor`` that writes a delivery's status, each under a comment
    naming the transition (:mod:`outbox.transitions.table`) and the function that renders it."""
    if vendor not in DATABASES:
        raise ValueError(f"{vendor!r}: one of {', '.join(DATABASES)}")
    symbol = {
        id(value): name for name, value in vars(table).items() if isinstance(value, Transition)
    }
    parts = [_HEADER.format(database=_TITLE[vendor], command=COMMAND).strip()]
    parts.append(_section("The worker's, run as these statements (outbox.transitions.hotpath)"))
    for change, render, what in _WORKER:
        title = f'{symbol[id(change)]} ("{change.name}"), hotpath.{render.__name__}: {what}'
        parts.append(_statement(title, render(vendor)))
    if vendor == "postgresql":
        parts.append(_section("PostgreSQL: SENT then MARK in one call (statements.postgresql)"))
        for function in (hotpath.step_function, hotpath.steps_function):
            summary = (function.__doc__ or "").splitlines()[0].replace("``", "")
            title = f"hotpath.{function.__name__}: {summary}"
            parts.append(_statement(title, function()))
    parts.append(_section("Through the ORM's QuerySet.update()", _ORM))
    worker = {id(change) for change, _, _ in _WORKER}
    for change in table.ALL:
        if id(change) not in worker:
            title = f'{symbol[id(change)]} ("{change.name}")'
            parts.append(_statement(title, change.sql(vendor)))
    return "\n\n".join(parts) + "\n"


def write() -> list[Path]:
    """Write every database's file; the paths written."""
    for vendor in DATABASES:
        path(vendor).write_text(dump(vendor))
    return [path(vendor) for vendor in DATABASES]


def _section(title: str, note: str = "") -> str:
    return f"-- == {title} ==" + "".join(f"\n-- {line}" for line in note.strip().splitlines())


def _statement(title: str, text: str) -> str:
    return f"-- {title}\n{text.strip()};"


_TITLE = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}
_HEADER = """
-- Every statement that writes a delivery's status on {database}, as rendered from
-- outbox/transitions/table.py. Generated: do not edit. After a change to the table,
-- run `{command}` (tests/transitions/test_sql.py fails until then).
-- %(name)s is a parameter the caller passes by name.
"""
_ORM = """
Transition.apply on one row, outbox.operations.transition on many (with the caller's own
conditions): the same SET and WHERE as the statement shown, which tests/transitions/test_table.py
runs beside the ORM's update to compare the rows they write.
"""
