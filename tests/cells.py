"""Which cells of tests/run.sh run the slowest modules.

Every cell runs the whole suite except these: each spends tens of seconds on
worker, proxy, Postfix or browser processes or on Hypothesis examples, and
gains little from running in all five cells. Most run in one of the four cells
of Django 5.2 and 6.1, the one where what they test varies (PostgreSQL for
column lengths, Django's newest version for its message build); a few run in
two, where both databases or both Django versions matter (crash points, refused
writes, clocks, the ESP path, Django's own mail tests). They are spread so that
the cells, run two at a time, end together and the test command stays under
20 minutes. The 6.0:sqlite cell (Python 3.13) runs only the tests
not marked ``slow`` (tests/run.sh passes ``-m "not slow"``). Outside
tests/run.sh (no cell named), or with ``OUTBOX_TEST_ALL_CELLS=1``, they always
run. A module is kept to its cells by its own ``pytestmark`` (e.g.
tests/faults/test_pgbouncer.py), which keys on the cell and not on the module's
path: it keeps its cells wherever it moves in the tree.
"""

from __future__ import annotations

import os

import pytest


def only_in_cells(*cells: str, why: str) -> pytest.MarkDecorator:
    """Skip a module outside ``cells`` ("5.2:postgres", ...), saying ``why``."""
    name = os.environ.get("OUTBOX_TEST_PG_NAME")  # outbox_<django>_<db>, set per cell
    names = {f"outbox_{cell.replace('.', '').replace(':', '_')}" for cell in cells}
    run = name is None or name in names or os.environ.get("OUTBOX_TEST_ALL_CELLS") == "1"
    return pytest.mark.skipif(not run, reason=f"runs in the {' and '.join(cells)} cells: {why}")


# The two pairs most modules use: each Django version and each database once,
# or both databases under one Django version (for what only the server side changes).
EACH_DJANGO_AND_DATABASE = ("5.2:postgres", "6.1:sqlite")
BOTH_DATABASES = ("5.2:postgres", "5.2:sqlite")


def slow_processes(cells: tuple[str, ...], *, why: str) -> list[pytest.MarkDecorator]:
    """The marks of a module of real processes: committed rows, ``slow``, and its cells."""
    return [
        pytest.mark.django_db(transaction=True),
        pytest.mark.slow,
        only_in_cells(*cells, why=why),
    ]
