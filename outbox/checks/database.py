"""Checks that ask the database: run by ``check --database`` and the worker.

E025 (not migrated) is a deployment check, so that ``migrate``, which runs
the database checks before it migrates, is not stopped by it: it runs with
``check --deploy --database ALIAS`` and when ``outbox_worker`` starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register

from ..db import database_problem
from ..models import outbox_alias


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
