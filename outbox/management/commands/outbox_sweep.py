"""``manage.py outbox_sweep``: repair what dead workers and lost Redis data left behind.

Exit status of one pass: 0 when it was done (another sweeper holding the lock
counts: that one does it); 75 when Redis or the database did not answer (try
again later); 1 when the database is not migrated. With ``--loop`` a failed
pass is printed and the next one tried; the loop exits 0 on SIGTERM/SIGINT.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...sweeper.sweep import Sweeper

# The exit status of a pass that could not be done, by SweepReport.failure:
# 75 is EX_TEMPFAIL of sysexits.h ("try again later"), as outbox_worker's.
FAILURE_EXIT = {"redis": 75, "database": 75, "not migrated": 1}


class Command(BaseCommand):
    help = (
        "One repair pass (or --loop): reap dead workers, settle rows stuck in processing "
        "by ABANDONED_POLICY, settle abandoned rows that OUTBOX['RECONCILERS'] can vouch for, "
        "re-mirror queued rows Redis lost, promote due scheduled ids, clear the content of "
        "settled mail after OUTBOX['CONTENT_RETENTION'] (sensitive mail at once). "
        "Safe to run on every host at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            type=float,
            metavar="SECONDS",
            help="Repeat every SECONDS until SIGTERM/SIGINT.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print each pass as one JSON object per line."
        )
        parser.add_argument(
            "--full-mirror-check",
            action="store_true",
            help="Check every queued row against Redis, not only recent ones.",
        )
        parser.add_argument(
            "--purge-sent-older-than",
            type=float,
            metavar="DAYS",
            help="Also delete sent deliveries (and their attempts) older than DAYS.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["loop"] is not None and options["loop"] <= 0:
            raise CommandError("--loop needs a positive number of seconds")
        if options["purge_sent_older_than"] is not None and options["purge_sent_older_than"] < 0:
            raise CommandError("--purge-sent-older-than needs a non-negative number of days")
        stop = threading.Event()
        if options["loop"] is not None:

            def on_signal(signum: int, frame: FrameType | None) -> None:
                stop.set()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)

        sweeper = Sweeper()
        first = True
        while True:
            report = sweeper.run_pass(
                full_mirror_check=options["full_mirror_check"] and first,
                purge_sent_older_than=options["purge_sent_older_than"],
            )
            first = False
            if options["json"]:
                self.stdout.write(json.dumps(report.as_dict(), sort_keys=True))
            else:
                self.stdout.write(report.line())
            self.stdout.flush()
            if options["loop"] is None:
                if report.failure:
                    # The reason is in the line above (and in the sweeper's log).
                    sys.exit(FAILURE_EXIT[report.failure])
                break
            if stop.wait(options["loop"]):
                break
