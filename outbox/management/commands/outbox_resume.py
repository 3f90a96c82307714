"""``manage.py outbox_resume``: undo outbox_pause (see outbox.queue.control).

Exit status: 0 when done, 1 for a malformed domain, 75 when Redis is unreachable.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from ...queue import control
from ...queue.client import redis_address

# As outbox_worker and outbox_sweep: EX_TEMPFAIL of sysexits.h, "try again later".
EXIT_UNAVAILABLE = 75


class Command(BaseCommand):
    help = (
        "Resume sending after outbox_pause: workers claim again within BLOCK_TIMEOUT. "
        "Without --domain this lifts the global pause (domain pauses stay), clears the "
        "'lost' mark outbox_status shows after Redis lost the switches, and forgets the "
        "pauses of mailers whose ESP refused their credential (rows already held for one "
        "wait for its planned end)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--domain",
            metavar="DOMAIN",
            help="Resume only mail to this recipient domain; its held rows go out within "
            "PAUSED_DOMAIN_RECHECK seconds.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        domain = options["domain"]
        try:
            state = control.resume(domain)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except RedisError as exc:
            raise CommandError(
                f"Redis ({redis_address()}) is unreachable, nothing was resumed: "
                f"{type(exc).__name__}: {exc}",
                returncode=EXIT_UNAVAILABLE,
            ) from exc
        if domain:
            self.stdout.write(f"Resumed mail to {domain.strip().lower()}.")
        elif state.paused_domains:
            still = ", ".join(sorted(state.paused_domains))
            self.stdout.write(f"Resumed sending; still paused: {still}.")
        else:
            self.stdout.write("Resumed sending.")
