"""``manage.py outbox_functions``: the hot paths' PostgreSQL functions (check outbox.E022)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from ...models import outbox_alias
from ...statements.functions import create_functions, function_states


class Command(BaseCommand):
    help = (
        "List the PostgreSQL functions the outbox's migrations create, and whether the "
        "database has them. With --create, create the missing ones: for a database "
        "migrated while OUTBOX['POSTGRESQL_FUNCTIONS'] was False, before setting it True."
    )
    # Run on a database that check outbox.E022 finds wanting: it is the fix.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--create", action="store_true", help="Create the functions the database lacks."
        )
        parser.add_argument(
            "--database",
            default=None,
            help="The database alias (default: the outbox's, as the routers give it).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or outbox_alias()
        if alias not in connections:
            raise CommandError(f"No database {alias!r} in DATABASES.")
        connection = connections[alias]
        if connection.vendor != "postgresql":
            raise CommandError(
                f"Database {alias!r} is {connection.vendor}: "
                "the functions exist on PostgreSQL only."
            )
        try:
            states = function_states(connection)
            missing = [name for name, state in states.items() if state == "missing"]
            if options["create"] and missing:
                create_functions(connection, missing)
        except DatabaseError as exc:
            raise CommandError(f"Database {alias!r}: {exc}") from exc
        shown = {
            "present": "present",
            "missing": "created" if options["create"] else "missing",
            "unmigrated": "not migrated yet (migrate creates it)",
        }
        for name, state in states.items():
            self.stdout.write(f"{name}: {shown[state]}")
        if missing and not options["create"]:
            self.stdout.write("Run with --create to create the missing functions.")
