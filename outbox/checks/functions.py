"""W016: PL/pgSQL functions of an earlier release are still in the database.

On PostgreSQL the migrations create the hot path's four functions
(:mod:`outbox.statements.postgresql`). A migration that changes a function's
arguments creates the new signature beside the old one, and keeps the old:
the previous release's web processes call it until they restart, during a
rolling upgrade (the README's "Upgrading"). It is dropped one release later.
0017 kept the 15-argument enqueue functions of the version before 0.1.0 that
way; the squashed migration, which a new database gets, never creates them,
and no migration of this release drops them.

This check names every function of those four names that neither this
release calls (:data:`CURRENT`) nor keeps for the previous release's
processes (:data:`KEPT`), and says when it is safe to drop: no process of
this release or of :data:`PREVIOUS` calls one, so only a process older than
that could. A release that changes a function's arguments moves the old
signature from ``CURRENT`` to ``KEPT``; the next one drops it by a migration
and empties ``KEPT``. Like E025, it runs with
``check --deploy --database ALIAS`` and as the worker starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Tags, Warning, register
from django.db import DatabaseError, connections

from ..models import outbox_alias

# The functions this release calls, as 0017 and the squashed migration create them.
CURRENT = (
    "outbox_step(bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text)",
    "outbox_steps(bigint[], uuid[], bigint[], varchar[], uuid[], timestamptz[], bigint[], text)",
    "outbox_enqueue(text, text, text, varchar, jsonb, jsonb, timestamptz, varchar, integer,"
    " timestamptz, timestamptz, text[], text[], text[], varchar, jsonb)",
    "outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, timestamptz, varchar, integer,"
    " timestamptz, timestamptz, text, text, text, varchar, jsonb)",
)

# The previous release, whose processes may still run during an upgrade.
PREVIOUS = "0.1.0"

# The previous release's functions this release keeps for those processes, though it
# calls others: none, 0.1.0's four are this release's.
KEPT: tuple[str, ...] = ()

# Every function of the outbox's names in the migrated schema but those called or kept,
# in PostgreSQL's own spelling of a signature (what DROP FUNCTION takes).
_EARLIER = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace
  AND p.proname IN ('outbox_step', 'outbox_steps', 'outbox_enqueue', 'outbox_enqueue_one')
  AND p.oid NOT IN (
      SELECT to_regprocedure(s)::oid FROM unnest(%s::text[]) AS s
      WHERE to_regprocedure(s) IS NOT NULL)
ORDER BY 1
"""


def earlier_functions(alias: str) -> list[str]:
    """The signatures of the outbox's functions on ``alias`` neither called nor kept."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_EARLIER, [[*CURRENT, *KEPT]])
        return [row[0] for row in cursor.fetchall()]


@register(Tags.database, deploy=True)
def check_earlier_functions(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """W016: functions of an earlier release are left in the database (module docstring)."""
    warnings: list[CheckMessage] = []
    for alias in databases or ():
        if alias != outbox_alias():
            continue  # the outbox's functions are not there
        try:
            found = earlier_functions(alias)
        except DatabaseError:
            continue  # no answer: E025 and the worker say so
        if found:
            warnings.append(
                Warning(
                    f"The database holds functions of an outbox release before {PREVIOUS}, which "
                    f"no process of this release or of {PREVIOUS} calls: {', '.join(found)}.",
                    hint=f"Safe to drop once every process runs {PREVIOUS} or later: "
                    + " ".join(f"DROP FUNCTION {signature};" for signature in found),
                    id="outbox.W016",
                )
            )
    return warnings
