"""Checks that ask the database: run by ``check --database`` and the worker.

E022 runs in ``migrate`` too. E025 (not migrated) is a deployment check, so
that ``migrate``, which runs the database checks before it migrates, is not
stopped by it: it runs with ``check --deploy --database ALIAS`` and when
``outbox_worker`` starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register
from django.db import DatabaseError, connections

from ..conf import outbox_settings
from ..db import database_problem
from ..models import outbox_alias
from ..statements.functions import missing_functions
from .settings import outbox_dict


@register(Tags.database)
def check_postgresql_functions(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """E022: ``POSTGRESQL_FUNCTIONS`` is on, but the migrations ran while it was off."""
    if outbox_dict() is None or not outbox_settings.POSTGRESQL_FUNCTIONS:
        return []
    errors: list[CheckMessage] = []
    for alias in databases or ():
        if alias != outbox_alias():
            continue  # the outbox's tables are not there: routers send them elsewhere
        try:
            missing = missing_functions(connections[alias])
        except DatabaseError:
            continue  # cannot ask: the connection's own errors say why elsewhere
        if missing:
            errors.append(
                Error(
                    f"OUTBOX['POSTGRESQL_FUNCTIONS'] is True, but database {alias!r} has no "
                    f"{', '.join(missing)}: it was migrated while the setting was False. "
                    "Enqueueing and delivering would fail.",
                    hint=(
                        "Create them: manage.py outbox_functions --create "
                        f"--database {alias} (or set POSTGRESQL_FUNCTIONS back to False)."
                    ),
                    id="outbox.E022",
                )
            )
    return errors


@register(Tags.database, deploy=True)
def check_migrated(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """E025: the database answers, but the outbox's migrations are not all applied.

    Says nothing when the database does not answer: a worker that starts
    anyway waits for it (or, with ``--give-up-after``, gives up and says so).
    """
    errors: list[CheckMessage] = []
    for alias in databases or ():
        if alias != outbox_alias():
            continue  # the outbox's tables are not there: routers send them elsewhere
        problem = database_problem(alias)
        if problem is not None and problem.kind == "not migrated":
            errors.append(
                Error(
                    f"The outbox cannot work: {problem}.",
                    hint=f"Run manage.py migrate --database {alias} before the workers start.",
                    id="outbox.E025",
                )
            )
    return errors
