"""Checks that ask the database: run by ``migrate``, ``check --database`` and the worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register
from django.db import DatabaseError, connections

from ..conf import outbox_settings
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
