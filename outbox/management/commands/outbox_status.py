"""``manage.py outbox_status``: the outbox at a glance (see outbox.status)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...status import collect, render, watch_loop

CLEAR_SCREEN = "\033[H\033[2J"


class Command(BaseCommand):
    help = (
        "Show the outbox: deliveries by status and priority, what is due and how long it "
        "has waited, recent sends, the Redis queue and whether it agrees with the database, "
        "the workers with the ids they hold, and each mailer's failure alarm (first, while on). "
        "Redis being down is reported, not an error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print JSON for monitoring (keys documented in outbox.status); exit status 0.",
        )
        parser.add_argument(
            "--watch",
            type=float,
            metavar="SECONDS",
            help="Refresh every SECONDS until Ctrl-C (with --json: one JSON document per line).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["watch"]
        as_json = options["json"]
        if interval is None:
            report = collect()
            self.stdout.write(
                json.dumps(report, indent=2) if as_json else render(report), ending=""
            )
            if as_json:
                self.stdout.write("")
            return
        if interval <= 0:
            raise CommandError("--watch needs a positive number of seconds")

        def show() -> None:
            report = collect()
            if as_json:
                self.stdout.write(json.dumps(report))
            else:
                self.stdout.write(CLEAR_SCREEN + render(report), ending="")
            self.stdout.flush()

        watch_loop(interval, show)
