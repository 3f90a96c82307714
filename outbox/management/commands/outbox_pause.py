"""``manage.py outbox_pause``: stop sending everywhere, or for one domain (see outbox.queue.control).

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
        "Pause sending: every worker on every host stops claiming mail within about one "
        "second. Messages already being handed to the mail server finish; nothing is lost "
        "and enqueueing goes on (rows wait as queued). With --domain, only mail to that "
        "recipient domain waits. Undo with outbox_resume. The switch lives in Redis; "
        "outbox_status shows it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--domain",
            metavar="DOMAIN",
            help="Pause only mail to this recipient domain (exact match, e.g. gmail.com); "
            "its rows are looked at again every PAUSED_DOMAIN_RECHECK seconds.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        domain = options["domain"]
        try:
            control.pause(domain)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except RedisError as exc:
            raise CommandError(
                f"Redis ({redis_address()}) is unreachable, nothing was paused: "
                f"{type(exc).__name__}: {exc}",
                returncode=EXIT_UNAVAILABLE,
            ) from exc
        if domain:
            self.stdout.write(f"Paused mail to {domain.strip().lower()}.")
        else:
            self.stdout.write("Paused all sending. Run outbox_resume to send again.")
