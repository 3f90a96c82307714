"""What every part of the benchmark shares: the message, the sizes, a result row.

Also ``run_timed`` (start management commands at once and time them to their
exit, the same way for all three systems) and ``prepared`` (psycopg's prepared
statements on this process's connection).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "tests" / "benchmark"
RESULTS = BENCH / "results"
SETTINGS = "tests.benchmark.settings"
SUBJECT = "Your order has shipped"
BODY = "Hello,\n\nyour order #12345 is on its way.\n\n-- \nThe shop\n" * 3
SENDER = "shop@example.com"
DRAIN_TIMEOUT = 900


# Django turns psycopg's prepared statements off by default (for transaction-
# pooling PgBouncer); OPTIONS["prepare_threshold"] turns them on. It changes
# nothing for post_office and django-mailer, whose queries go through Django's
# client-side-binding cursors, which psycopg never prepares.
PREPARED = "prepared statements"
PREPARED_ENV = {"BENCH_PREPARE_THRESHOLD": "5"}


def prepared(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run fn with prepared statements allowed on this process's connection."""

    def call() -> Any:
        from django.db import connection

        connection.ensure_connection()
        connection.connection.prepare_threshold = 5
        return fn()

    return call


def rcpt(i: int) -> str:
    return f"customer{i}@example.com"


@dataclass
class Sizes:
    # The brief's sizes, except one-recipient calls (2,000) and the SMTP drain
    # (1,000: django-mailer sends one at a time, 20 ms each), to keep the full
    # run near 10 minutes on 2 cores.
    enqueue_bulk: int = 10_000
    enqueue_single: int = 2_000
    drain_noop: int = 5_000
    drain_smtp: int = 1_000
    smtp_delay: float = 0.02
    counts: int = 1_000
    scale_history: tuple[int, int] = (10_000, 1_000_000)
    scale_drain: int = 5_000
    scale_concurrency: int = 16
    dashboard_rows: int = 1_000_000
    # The operator's pages at two history sizes (admin_scale.py).
    admin_scale_history: tuple[int, int] = (10_000, 5_000_000)
    # Personalised template emails through enqueue_many (the bulk part):
    # the target is stated for 10,000, so --quick keeps that size.
    bulk_templates: int = 10_000
    # One worker's RSS over many distinct emails (memory.py), when named (--only memory).
    memory_emails: int = 200_000


QUICK = Sizes(
    enqueue_bulk=2_000,
    enqueue_single=300,
    drain_noop=1_000,
    drain_smtp=200,
    counts=300,
    scale_history=(10_000, 100_000),
    scale_drain=500,
    dashboard_rows=200_000,
    admin_scale_history=(10_000, 200_000),
    memory_emails=2_000,
)


@dataclass
class Row:
    section: str  # enqueue-bulk, enqueue-single, deliver-noop, deliver-smtp, scale
    db: str
    system: str  # outbox, post_office, mailer
    config: str
    n: int
    times: list[float] = field(default_factory=list)
    note: str = ""
    ours: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def rate(self) -> float:
        return self.n / self.median if self.times else float("nan")


def run_timed(argvs: list[list[str]], env: dict[str, str]) -> tuple[float, str]:
    """Start every command at once, wait for all; wall time and any error text."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for argv in argvs
    ]
    errors = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=DRAIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            errors.append("timeout")
        if proc.returncode != 0:
            errors.append(f"exit {proc.returncode}: {out[-500:]}")
    return time.perf_counter() - start, "; ".join(errors)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
