"""``manage.py outbox_worker``: deliver outbox mail (see outbox.worker).

Parses and checks the command line, sets up logging and runs one
:class:`~outbox.worker.Worker` until it stops; with ``--processes N`` (N > 1),
a :class:`~outbox.worker.supervisor.Supervisor` that runs N such commands as
child processes instead.

Exit status: 0 when stopped (SIGTERM, SIGINT, ``--burst`` done,
``--max-messages`` reached; an ESP's refused credential only pauses its
mailer); 1 when a system check fails (not migrated: outbox.E025; an ESP
backend missing a setting: outbox.E027) or a sender thread crashed; 2 for a wrong command line;
75 (:data:`~outbox.worker.outage.EXIT_UNAVAILABLE`) when it gave up on an
unreachable Redis or database (``--give-up-after``); 130 after a second SIGINT.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from functools import partial
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...models import Delivery, outbox_alias
from ...worker import Worker
from ...worker.supervisor import Supervisor, child_command

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

# A --worker-id names the worker in Redis keys, on rows and in the attempt log.
# The columns hold 255 characters: 200 for the id, the rest for the
# incarnation suffix ("#" and 12 hex digits) the worker may append, which is
# why "#" is reserved.
MAX_WORKER_ID_LENGTH = 200

# A --burst run from cron or CI must end: it gives up on an outage of Redis or
# the database after this many seconds unless --give-up-after says otherwise.
BURST_GIVE_UP_AFTER = 30.0


class Command(BaseCommand):
    help = (
        "Deliver queued outbox email: claim ids from Redis, mark each row processing, "
        "send it, then mark it sent, requeued or failed. Stops cleanly on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--burst",
            action="store_true",
            help=(
                "Deliver everything that is due, then exit 0 (later scheduled mail does not "
                "wait); exit 75 if Redis or the database stays away for --give-up-after."
            ),
        )
        parser.add_argument(
            "--give-up-after",
            type=float,
            metavar="SECONDS",
            help=(
                "Exit with status 75 once Redis or the database has been unreachable "
                f"this long (default: {BURST_GIVE_UP_AFTER:.0f} with --burst; without "
                "--burst the worker waits for them however long it takes)."
            ),
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            metavar="N",
            help="Sending threads in this process, each with its own connection (default 1).",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            metavar="N",
            help=(
                "Run N worker processes (each with --concurrency threads) under one "
                "supervisor that restarts a child that dies and passes SIGTERM/SIGINT "
                "on to all of them (default 1: this process is the worker)."
            ),
        )
        parser.add_argument(
            "--max-messages",
            type=int,
            metavar="N",
            help="Exit after handling N messages (not with --processes above 1).",
        )
        # Set by the supervisor for its children: no --burst progress line on a
        # terminal they share.
        parser.add_argument("--no-progress", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument(
            "--worker-id",
            help=(
                "Name in heartbeats and on rows (default: host, pid and a random suffix): "
                f"up to {MAX_WORKER_ID_LENGTH} characters, no whitespace and no '#'."
            ),
        )
        parser.add_argument(
            "--summary-interval",
            type=float,
            default=60.0,
            metavar="SECONDS",
            help="Seconds between summary log lines (default 60).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["max_messages"] is not None and options["max_messages"] < 1:
            raise CommandError("--max-messages must be at least 1")
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1")
        if options["give_up_after"] is not None and not options["give_up_after"] > 0:
            raise CommandError("--give-up-after needs a positive number of seconds")
        if options["give_up_after"] is None and options["burst"]:
            options["give_up_after"] = BURST_GIVE_UP_AFTER
        if options["processes"] > 1 and options["max_messages"] is not None:
            # A restarted child would count from zero again, so the total could
            # not be kept: refused rather than split.
            raise CommandError("--max-messages cannot be combined with --processes above 1")
        if options["worker_id"] is not None:
            check_worker_id(options["worker_id"])
            if options["processes"] > 1:
                check_worker_id(child_worker_id(options["worker_id"], options["processes"] - 1))
        if not options["skip_checks"]:
            # The checks that ask the database too (outbox.E025, a deployment
            # check so that it does not stop `migrate`): a worker whose every
            # step would fail refuses to start instead.
            self.check(
                tags=[Tags.database],
                databases=[outbox_alias()],
                include_deployment_checks=True,
            )
            connections.close_all()  # no connection may cross the supervisor's fork
        self._configure_logging(options["verbosity"])
        # What exists now (Django, the apps, their modules) lives as long as the process:
        # frozen out of the collector's reach (with --processes, before the children are
        # forked from it), so that a full collection while sending scans only what sending
        # made. Over everything, one took 60-100 ms with every sender thread stopped: the
        # hand-over's latency tail (issue 44).
        gc.collect()
        gc.freeze()
        if options["processes"] > 1:
            self._supervise(options)
            return
        progress = None
        if options["burst"] and not options["no_progress"] and self.stdout.isatty():
            progress = _Progress(self.stdout)
        worker = Worker(
            worker_id=options["worker_id"],
            concurrency=options["concurrency"],
            burst=options["burst"],
            max_messages=options["max_messages"],
            summary_interval=options["summary_interval"],
            progress=progress,
            give_up_after=options["give_up_after"],
        )
        code = worker.run()
        if progress is not None:
            progress.finish(worker.delivered_total)
        if code:
            sys.exit(code)

    def _supervise(self, options: dict[str, Any]) -> None:
        """Run ``--processes`` children under a supervisor (no database, no Redis here)."""
        argvs = [
            child_command(child_arguments(options, index)) for index in range(options["processes"])
        ]
        targets = [partial(_child_worker, options, index) for index in range(options["processes"])]
        code = Supervisor(argvs, burst=options["burst"], targets=targets).run()
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("outbox")
        logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)


def _child_worker(options: dict[str, Any], index: int) -> int:
    """What a forked child of the supervisor runs: the worker its arguments describe."""
    worker_id = options["worker_id"]
    return Worker(
        worker_id=child_worker_id(worker_id, index) if worker_id is not None else None,
        concurrency=options["concurrency"],
        burst=options["burst"],
        summary_interval=options["summary_interval"],
        give_up_after=options["give_up_after"],
    ).run()


def child_worker_id(worker_id: str, index: int) -> str:
    """The ``--worker-id`` of the supervisor's child ``index``: ``<worker-id>-<index>``."""
    return f"{worker_id}-{index}"


def child_arguments(options: dict[str, Any], index: int) -> list[str]:
    """This command's arguments for the supervisor's child ``index``: one worker process."""
    args = [
        "outbox_worker",
        "--concurrency",
        str(options["concurrency"]),
        "--summary-interval",
        repr(options["summary_interval"]),
        "--verbosity",
        str(options["verbosity"]),
        "--no-progress",
    ]
    if options["burst"]:
        args.append("--burst")
    if options.get("give_up_after") is not None:
        args += ["--give-up-after", repr(options["give_up_after"])]
    if options["worker_id"] is not None:
        args += ["--worker-id", child_worker_id(options["worker_id"], index)]
    # --settings is already in the environment the child inherits.
    if options.get("pythonpath"):
        args += ["--pythonpath", options["pythonpath"]]
    for flag in ("traceback", "no_color", "force_color", "skip_checks"):
        if options.get(flag):
            args.append("--" + flag.replace("_", "-"))
    return args


def check_worker_id(worker_id: str) -> None:
    """Refuse a ``--worker-id`` that would not fit, or that could be misread."""
    if not worker_id:
        raise CommandError("--worker-id must not be empty")
    if len(worker_id) > MAX_WORKER_ID_LENGTH:
        raise CommandError(
            f"--worker-id is {len(worker_id)} characters long; the limit is {MAX_WORKER_ID_LENGTH}"
        )
    if any(c.isspace() or not c.isprintable() for c in worker_id):
        raise CommandError(f"--worker-id {worker_id!r} contains whitespace or a control character")
    if "#" in worker_id:
        raise CommandError(
            f"--worker-id {worker_id!r} contains '#', which is reserved for the "
            "worker's incarnation suffix"
        )


class _Progress:
    """One rewritten terminal line: delivered, remaining, rate (--burst on a tty)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.start = time.monotonic()
        self.last = 0.0

    def __call__(self, delivered: int, now: float) -> None:
        if now - self.last < 0.5:
            return
        self.last = now
        remaining = Delivery.objects.due().count()
        rate = delivered / max(now - self.start, 1e-9)
        self.out.write(
            f"\rdelivered {delivered}, remaining {remaining}, {rate:.0f}/s   ", ending=""
        )
        self.out.flush()

    def finish(self, delivered: int) -> None:
        elapsed = time.monotonic() - self.start
        self.out.write(f"\rdelivered {delivered} in {elapsed:.1f}s" + " " * 20)
