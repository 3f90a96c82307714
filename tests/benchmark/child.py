"""The benchmark's measurements on one database, in a child process (Django set up in-process).

The parent (run.py) runs ``--child`` once per database. Each measurement starts
from empty tables (TRUNCATE, or DELETE on SQLite) and an empty Redis database;
the reported time is the median of --repeat runs, and each repetition starts
with the next system (see ``rotated``). The parts: enqueue, delivery
with the no-op backend and over SMTP, per-email counts and a profile of our
worker (instruments.py), the scale check (scale.py) and the dashboard at a
million rows (dashboard.py), CPU per email and latency (efficiency.py), and, only when
named, the operator's pages at 5,000,000 rows (admin_scale.py) and the latency part
side by side with Celery and Django Tasks (side_by_side.py), PostgreSQL only.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from tests.benchmark.admin_scale import AdminScaleMixin
from tests.benchmark.bulk import BulkMixin
from tests.benchmark.common import (
    BENCH,
    PREPARED,
    ROOT,
    SETTINGS,
    Row,
    Sizes,
    free_port,
    prepared,
    rcpt,
    run_timed,
)
from tests.benchmark.dashboard import DashboardMixin
from tests.benchmark.efficiency import EfficiencyMixin
from tests.benchmark.instruments import Instruments, profile_table
from tests.benchmark.memory import MemoryMixin
from tests.benchmark.scale import ScaleMixin
from tests.benchmark.sending import SendingMixin
from tests.benchmark.side_by_side import DEFAULT_SYSTEMS, SideBySideMixin
from tests.benchmark.systems import SYSTEMS

T = TypeVar("T")


def child_main(args: argparse.Namespace) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["BENCH_DB"] = args.db
    os.environ["BENCH_EMAIL"] = "noop"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    sizes: Sizes = Sizes(**json.loads(args.sizes))
    sizes.scale_history = tuple(sizes.scale_history)  # type: ignore[assignment]
    sizes.admin_scale_history = tuple(sizes.admin_scale_history)  # type: ignore[assignment]
    child = Child(args.db, sizes, args.repeat, set(args.only.split(",")) if args.only else None)
    child.latency_seconds = args.latency_seconds
    child.latency_systems = args.latency_systems.split(",")
    child.timeline = args.timeline
    child.run()
    Path(args.out).write_text(json.dumps(child.result(), indent=1))


class Child(
    ScaleMixin,
    DashboardMixin,
    AdminScaleMixin,
    BulkMixin,
    SendingMixin,
    EfficiencyMixin,
    SideBySideMixin,
    MemoryMixin,
):
    def __init__(self, db: str, sizes: Sizes, repeat: int, only: set[str] | None) -> None:
        from django.db import connection

        self.db = db
        self.sizes = sizes
        self.repeat = repeat
        self.only = only
        self.rows: list[Row] = []
        self.extra: dict[str, Any] = {}
        self.vendor = connection.vendor
        self.latency_seconds = 60.0
        self.latency_systems = list(DEFAULT_SYSTEMS)
        self.timeline = True
        import redis

        self.redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])

    def want(self, part: str) -> bool:
        return self.only is None or part in self.only

    def log(self, msg: str) -> None:
        print(f"[{self.db}] {msg}", file=sys.stderr, flush=True)

    def result(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "extra": self.extra}

    def run(self) -> None:
        self.extra["db_version"] = self.db_version()
        if self.want("enqueue"):
            self.bench_enqueue()
        if self.want("noop"):
            self.bench_delivery("deliver-noop", "noop", self.sizes.drain_noop)
        if self.want("smtp"):
            self.bench_delivery("deliver-smtp", "smtp", self.sizes.drain_smtp)
        if self.want("counts"):
            self.bench_counts()
        if self.want("profile"):
            self.bench_profile()
        if self.want("scale") and self.vendor == "postgresql":
            self.bench_scale()
        if self.want("dashboard") and self.vendor == "postgresql":
            self.bench_dashboard()
        # Only when named (--only admin-scale): filling 5,000,000 rows takes minutes.
        if self.only and "admin-scale" in self.only and self.vendor == "postgresql":
            self.bench_admin_scale()
        if self.want("bulk") and self.vendor == "postgresql":
            self.bench_bulk()
        if self.want("sending") and self.vendor == "postgresql":
            self.bench_sending()
        if self.want("efficiency") and self.vendor == "postgresql":
            self.bench_efficiency()
        # Only when named (--only latency): the side-by-side at 100/s (side_by_side.py),
        # then ours alone with the 20 ms server.
        if self.only and "latency" in self.only and self.vendor == "postgresql":
            self.bench_side_by_side()
            self.bench_latency()
        # Only when named (--only memory): 200,000 emails per Django version.
        if self.only and "memory" in self.only:
            self.bench_memory()

    # -- helpers ------------------------------------------------------------

    def db_version(self) -> str:
        from django.db import connection

        with connection.cursor() as cur:
            if self.vendor == "postgresql":
                cur.execute("SHOW server_version")
                version = "PostgreSQL " + cur.fetchone()[0]
                cur.execute("SHOW fsync")
                fsync = cur.fetchone()[0]
                cur.execute("SHOW synchronous_commit")
                sync = cur.fetchone()[0]
                return f"{version} (fsync={fsync}, synchronous_commit={sync})"
            cur.execute("select sqlite_version()")
            version = "SQLite " + cur.fetchone()[0]
            cur.execute("PRAGMA journal_mode")
            return f"{version} (journal_mode={cur.fetchone()[0]}, synchronous=FULL)"

    def reset(self) -> None:
        """Empty every table of the three apps, and Redis."""
        from django.db import connection

        tables = [
            t
            for t in connection.introspection.table_names()
            if t.startswith(("outbox_", "post_office_", "mailer_"))
        ]
        with connection.cursor() as cur:
            if self.vendor == "postgresql":
                cur.execute("TRUNCATE " + ", ".join(tables) + " RESTART IDENTITY CASCADE")
            else:
                with connection.constraint_checks_disabled():
                    for t in tables:
                        cur.execute(f"DELETE FROM {t}")
                    cur.execute("DELETE FROM sqlite_sequence")
        connection.close()
        self.redis.flushdb()

    def timed(self, fn: Callable[[], Any]) -> float:
        from django.db import connection

        connection.ensure_connection()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    # -- seeding (untimed) ------------------------------------------------------

    def seed(self, system: str, n: int, offset: int = 0) -> None:
        """n queued one-recipient emails, written the way each system writes them."""
        SYSTEMS[system].seed([rcpt(offset + i) for i in range(n)])

    def delivered(self, system: str) -> int:
        return int(SYSTEMS[system].delivered())

    # -- 1. enqueue ---------------------------------------------------------------

    def bench_enqueue(self) -> None:
        # Import cost outside the timing.
        import mailer  # noqa: F401
        import post_office.mail  # noqa: F401
        from django.core.mail import EmailMessage  # noqa: F401

        import outbox  # noqa: F401

        n = self.sizes.enqueue_bulk
        recipients = [rcpt(i) for i in range(n)]
        rows, calls = self.enqueue_rows("enqueue-bulk", n, lambda s: s.BULK.format(n=n))
        for system in SYSTEMS.values():
            calls.append(lambda system=system: system.enqueue_bulk(recipients))
        self.measure_enqueue(rows, calls)

        n = self.sizes.enqueue_single
        recipients = [rcpt(i) for i in range(n)]
        rows, calls = self.enqueue_rows("enqueue-single", n, lambda s: s.SINGLE)
        for system in SYSTEMS.values():
            calls.append(lambda system=system: system.enqueue_each(recipients))
        self.measure_enqueue(rows, calls)

    def enqueue_rows(
        self, section: str, n: int, label: Callable[[Any], str]
    ) -> tuple[list[Row], list[Callable[[], Any]]]:
        """One row per system, plus ours with prepared statements on PostgreSQL.

        Returns the rows and an empty list for their calls, in the same order; the
        prepared row's call is added by ``measure_enqueue``.
        """
        rows = [
            self.add(Row(section, self.db, name, label(system), n, ours=name == "outbox"))
            for name, system in SYSTEMS.items()
        ]
        if self.vendor == "postgresql":
            ours = label(SYSTEMS["outbox"])
            rows.append(
                self.add(Row(section, self.db, "outbox", f"{ours}, {PREPARED}", n, ours=True))
            )
        return rows, []

    def measure_enqueue(self, rows: list[Row], calls: list[Callable[[], Any]]) -> None:
        if len(rows) > len(calls):
            calls.append(prepared(calls[0]))
        pairs = list(zip(rows, calls, strict=True))
        for rep in range(self.repeat):
            for row, call in rotated(pairs, rep):
                self.reset()
                row.times.append(self.timed(call))
                self.check_queued(row)
                self.log(f"{row.section} {row.system}: {row.times[-1]:.3f}s")

    def check_queued(self, row: Row) -> None:
        system = SYSTEMS[row.system]
        got = system.queued()
        if row.system == "outbox":
            in_redis = system.in_redis(self.redis)
            if in_redis != row.n:
                row.note = f"Redis holds {in_redis} of {row.n} ids"
        if got != row.n:
            row.note = f"queued {got} of {row.n}!"

    # -- 2./3. delivery -------------------------------------------------------------

    def env(self, email: str, smtp_port: int | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE=SETTINGS,
            BENCH_DB=self.db,
            BENCH_EMAIL=email,
            PYTHONPATH=str(ROOT),
        )
        if smtp_port:
            env["BENCH_SMTP_PORT"] = str(smtp_port)
        return env

    def commands(self) -> list[tuple[str, str, list[list[str]], dict[str, str]]]:
        return [
            (name, config, argvs, extra)
            for name, system in SYSTEMS.items()
            for config, argvs, extra in system.delivery_commands(self.sizes, self.vendor)
        ]

    def bench_delivery(self, section: str, email: str, n: int) -> None:
        sink = None
        port = None
        if email == "smtp":
            port = free_port()
            sink = subprocess.Popen(
                [
                    sys.executable,
                    str(BENCH / "smtp_sink.py"),
                    str(port),
                    str(self.sizes.smtp_delay),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert sink.stdout is not None
            sink.stdout.readline()  # "listening on ..."
        try:
            env = self.env(email, port)
            rows = []
            for system, config, argvs, extra in self.commands():
                row = self.add(Row(section, self.db, system, config, n, ours=system == "outbox"))
                rows.append((row, argvs, {**env, **extra}))
            for rep in range(self.repeat):
                for row, argvs, row_env in rotated(rows, rep):
                    self.reset()
                    self.seed(row.system, n)
                    from django.db import connection

                    connection.close()
                    elapsed, err = run_timed(argvs, row_env)
                    done = self.delivered(row.system)
                    if err or done != n:
                        row.note = f"delivered {done} of {n}; {err}".strip("; ")
                    row.times.append(elapsed)
                    self.log(f"{section} {row.system} {row.config}: {elapsed:.2f}s ({done}/{n})")
        finally:
            if sink is not None:
                sink.send_signal(signal.SIGTERM)
                sink.wait(timeout=10)

    # -- 4. per-email counts of our worker ----------------------------------------

    def bench_counts(self) -> None:
        from outbox.worker import Worker

        n = self.sizes.counts
        self.reset()
        self.seed("outbox", n)
        counter = Instruments(self.vendor)
        with counter.active():
            start = time.perf_counter()
            Worker(burst=True, concurrency=1).run(install_signal_handlers=False)
            wall = time.perf_counter() - start
        done = self.delivered("outbox")
        self.extra["counts"] = counter.summary(done, wall)
        self.log(f"counts: {json.dumps(self.extra['counts'])}")

    def bench_profile(self) -> None:
        from outbox.mail.targets import get_delivery_connection
        from outbox.worker import Worker

        n = self.sizes.counts
        self.reset()
        self.seed("outbox", n)
        worker = Worker(burst=True, concurrency=1)
        worker._register(worker.worker_id)
        backend = get_delivery_connection()
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        run_sender_loop(worker, backend)
        profile.disable()
        wall = time.perf_counter() - start
        worker._deregister()
        done = self.delivered("outbox")
        self.extra["profile"] = {
            "n": done,
            "wall": wall,
            "tottime": profile_table(profile, "tottime", 18),
            "cumulative": profile_table(
                profile, "cumulative", 30, only=("outbox", "django", "redis", "psycopg")
            ),
        }


def rotated(items: list[T], rep: int) -> list[T]:
    """The systems' order in repetition ``rep``: each repetition starts one further on.

    Running first after the reset costs a little (about 1-2% measured for
    both ours and post_office's enqueue: a fresh connection, cold caches); in
    a fixed order one system would pay it every time.
    """
    k = rep % len(items)
    return items[k:] + items[:k]


def run_sender_loop(worker: Any, backend: Any) -> None:
    """One sender thread's loop, in this thread (for the profile).

    ``outbox.worker`` is a package of rooms now (``SenderLoop`` in loop.py); the
    single-module worker had it as ``Worker._sender_loop``.
    """
    if hasattr(worker, "_sender_loop"):
        worker._sender_loop(backend)
        return
    from outbox.worker.loop import SenderLoop

    SenderLoop(worker, 0, backend).run()
