"""``manage.py outbox_resume``: undo outbox_pause (see outbox.queue.control).

Exit status: 0 when done, 1 for a malformed domain or a mailer not configured, 75 when
Redis is unreachable.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from ...mail import mailers
from ...queue import control
from ...queue.client import redis_address

# As outbox_worker and outbox_sweep: EX_TEMPFAIL of sysexits.h, "try again later".
EXIT_UNAVAILABLE = 75


class Command(BaseCommand):
    help = (
        "Resume sending after outbox_pause: workers claim again within BLOCK_TIMEOUT. "
        "Without --domain or --mailer this lifts the global pause (domain pauses stay), "
        "clears the 'lost' mark outbox_status shows after Redis lost the switches, and "
        "forgets the pauses of mailers whose ESP refused their credential (rows already "
        "held for one wait for its planned end)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--domain",
            metavar="DOMAIN",
            help="Resume only mail to this recipient domain; its held rows go out within "
            "PAUSED_DOMAIN_RECHECK seconds.",
        )
        which.add_argument(
            "--mailer",
            metavar="NAME",
            help="Forget only this mailer's pause after its ESP refused the credential "
            '("" for the default mailer; rows already held wait for the planned end); the '
            "global switch, the domains and the other mailers stay as they are.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        domain, mailer = options["domain"], options["mailer"]
        try:
            said = self._resume_mailer(mailer) if mailer is not None else self._resume(domain)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except RedisError as exc:
            raise CommandError(
                f"Redis ({redis_address()}) is unreachable, nothing was resumed: "
                f"{type(exc).__name__}: {exc}",
                returncode=EXIT_UNAVAILABLE,
            ) from exc
        self.stdout.write(said)

    @staticmethod
    def _resume(domain: str | None) -> str:
        state = control.resume(domain)
        if domain:
            return f"Resumed mail to {domain.strip().lower()}."
        if state.paused_domains:
            return f"Resumed sending; still paused: {', '.join(sorted(state.paused_domains))}."
        return "Resumed sending."

    @staticmethod
    def _resume_mailer(mailer: str) -> str:
        if mailer and mailer not in mailers.names():
            known = ", ".join(repr(m) for m in ["", *mailers.delivery_mailers()])
            raise CommandError(
                f'no mailer {mailer!r} is configured (known: {known}; "" is the default mailer)'
            )
        name = f"mailer {mailer!r}" if mailer else "the default mailer"
        _state, forgot = control.resume_mailer(mailer)
        return f"Resumed {name}." if forgot else f"{name[0].upper()}{name[1:]} was not paused."
