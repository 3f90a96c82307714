"""Which cells of tests/run.sh run the slowest real-process modules.

Every cell runs the whole suite except these: each spends a minute or more on
worker, proxy or Postfix processes, and gains little from running under both
Django versions on both databases. Outside tests/run.sh (no cell named), or
with ``OUTBOX_TEST_ALL_CELLS=1``, they always run.
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
