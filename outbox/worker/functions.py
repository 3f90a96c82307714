"""The worker's PL/pgSQL functions, rendered from the transitions table.

``outbox_step`` (one thread's step) and ``outbox_steps`` (the group commit's
batch of steps) run the transitions :data:`~outbox.transitions.SENT` and
:data:`~outbox.transitions.MARK` inside PostgreSQL: measured, a call costs
PostgreSQL well under half the CPU of the same statements sent as plain text,
which it would parse and plan anew each time
(``tests/benchmark/results/paths-postgres.md``).

Their DDL is written in :mod:`outbox.transitions.hotpath`, beside the worker's
other statements, so that ``python -m outbox.transitions postgresql`` shows it
with every statement the table renders; the newest migration that creates a
function must carry what :func:`step_function` and :func:`steps_function`
render now (``tests/transitions/test_table.py`` checks it).
"""

from __future__ import annotations

from ..transitions.hotpath import step_function, steps_function

__all__ = ["print_ddl", "step_function", "steps_function"]


def print_ddl() -> None:
    """Print both functions' DDL, for a new migration."""
    print(step_function())
    print(steps_function())
