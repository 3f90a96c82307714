"""Benchmark: django-email-outbox vs django-post-office vs django-mailer (issue 6).

Run through bench/run.sh, which starts redis-server and a durable PostgreSQL and
sets the BENCH_* environment. The parent process prepares each database, runs a
child process per database (Django settings are per process), collects their
JSON results, prints one table and writes bench/results/latest.md.

Every measurement starts from empty tables (TRUNCATE, or DELETE on SQLite) and
an empty Redis database; the reported time is the median of --repeat runs.
Delivery runs are timed from spawning the management command to its exit, the
same way for all three systems (so each includes one Python/Django start-up).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
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


_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


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
    two_proc_concurrency: int = 8


QUICK = Sizes(
    enqueue_bulk=2_000,
    enqueue_single=300,
    drain_noop=1_000,
    drain_smtp=200,
    counts=300,
    scale_history=(10_000, 100_000),
    scale_drain=500,
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


# =============================================================================
# child: one database, Django configured in-process
# =============================================================================


def child_main(args: argparse.Namespace) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_DB"] = args.db
    os.environ["BENCH_EMAIL"] = "noop"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    sizes: Sizes = Sizes(**json.loads(args.sizes))
    sizes.scale_history = tuple(sizes.scale_history)  # type: ignore[assignment]
    child = Child(args.db, sizes, args.repeat, set(args.only.split(",")) if args.only else None)
    child.run()
    Path(args.out).write_text(json.dumps(child.result(), indent=1))


class Child:
    def __init__(self, db: str, sizes: Sizes, repeat: int, only: set[str] | None) -> None:
        from django.db import connection

        self.db = db
        self.sizes = sizes
        self.repeat = repeat
        self.only = only
        self.rows: list[Row] = []
        self.extra: dict[str, Any] = {}
        self.vendor = connection.vendor
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
        from django.db import transaction

        recipients = [rcpt(offset + i) for i in range(n)]
        if system == "outbox":
            from outbox import enqueue_email

            # Real enqueue calls (one Email per call), one commit: the on-commit
            # hooks push every id to Redis.
            with transaction.atomic():
                for r in recipients:
                    enqueue_email(SUBJECT, BODY, SENDER, [r])
        elif system == "post_office":
            from post_office import mail

            for start in range(0, n, 1000):
                mail.send_many(
                    [
                        {"sender": SENDER, "recipients": [r], "subject": SUBJECT, "message": BODY}
                        for r in recipients[start : start + 1000]
                    ]
                )
        elif system == "mailer":
            from mailer import get_priority
            from mailer.models import Message, make_message

            priority = get_priority(None)
            for start in range(0, n, 1000):
                Message.objects.bulk_create(
                    [
                        make_message(
                            subject=SUBJECT, body=BODY, from_email=SENDER, to=[r], priority=priority
                        )
                        for r in recipients[start : start + 1000]
                    ]
                )

    def delivered(self, system: str) -> int:
        if system == "outbox":
            from outbox.models import Delivery

            return Delivery.objects.filter(status="sent").count()
        if system == "post_office":
            from post_office.models import STATUS, Email

            return Email.objects.filter(status=STATUS.sent).count()
        from mailer.models import RESULT_SUCCESS, Message, MessageLog

        left = Message.objects.count()
        return MessageLog.objects.filter(result=RESULT_SUCCESS).count() - left

    # -- 1. enqueue ---------------------------------------------------------------

    def bench_enqueue(self) -> None:
        from django.core.mail import EmailMessage  # noqa: F401  (import cost outside timing)
        from mailer import send_mail as mailer_send_mail
        from mailer import send_mass_mail as mailer_send_mass_mail
        from post_office import mail

        from outbox import enqueue_email

        n = self.sizes.enqueue_bulk
        recipients = [rcpt(i) for i in range(n)]
        bulk = [
            self.add(
                Row(
                    "enqueue-bulk", self.db, "outbox", "enqueue_email(10k recipients)", n, ours=True
                )
            ),
            self.add(Row("enqueue-bulk", self.db, "post_office", "mail.send_many(n x 1)", n)),
            self.add(Row("enqueue-bulk", self.db, "mailer", "mailer.send_mass_mail(n x 1)", n)),
        ]
        bulk[0].config = f"enqueue_email({n} recipients)"
        calls: list[Callable[[], Any]] = [
            lambda: enqueue_email(SUBJECT, BODY, SENDER, recipients),
            lambda: mail.send_many(
                [
                    {"sender": SENDER, "recipients": [r], "subject": SUBJECT, "message": BODY}
                    for r in recipients
                ]
            ),
            lambda: mailer_send_mass_mail([(SUBJECT, BODY, SENDER, [r]) for r in recipients]),
        ]
        if self.vendor == "postgresql":
            bulk.append(
                self.add(
                    Row(
                        "enqueue-bulk",
                        self.db,
                        "outbox",
                        f"enqueue_email({n} recipients), {PREPARED}",
                        n,
                        ours=True,
                    )
                )
            )
            calls.append(prepared(calls[0]))
        for _ in range(self.repeat):
            for row, call in zip(bulk, calls, strict=True):
                self.reset()
                row.times.append(self.timed(call))
                self.check_queued(row)
                self.log(f"{row.section} {row.system}: {row.times[-1]:.3f}s")

        n = self.sizes.enqueue_single
        recipients = [rcpt(i) for i in range(n)]
        single = [
            self.add(Row("enqueue-single", self.db, "outbox", "enqueue_email", n, ours=True)),
            self.add(Row("enqueue-single", self.db, "post_office", "mail.send", n)),
            self.add(Row("enqueue-single", self.db, "mailer", "mailer.send_mail", n)),
        ]

        def ours() -> None:
            for r in recipients:
                enqueue_email(SUBJECT, BODY, SENDER, [r])

        def po() -> None:
            for r in recipients:
                mail.send(recipients=[r], sender=SENDER, subject=SUBJECT, message=BODY)

        def ml() -> None:
            for r in recipients:
                mailer_send_mail(SUBJECT, BODY, SENDER, [r])

        single_calls = [ours, po, ml]
        if self.vendor == "postgresql":
            single.append(
                self.add(
                    Row(
                        "enqueue-single",
                        self.db,
                        "outbox",
                        f"enqueue_email, {PREPARED}",
                        n,
                        ours=True,
                    )
                )
            )
            single_calls.append(prepared(ours))
        for _ in range(self.repeat):
            for row, call in zip(single, single_calls, strict=True):
                self.reset()
                row.times.append(self.timed(call))
                self.check_queued(row)
                self.log(f"{row.section} {row.system}: {row.times[-1]:.3f}s")

    def check_queued(self, row: Row) -> None:
        if row.system == "outbox":
            from outbox.models import Delivery

            got = Delivery.objects.filter(status="queued").count()
            in_redis = self.redis.llen("{outbox}:ready:normal")
            if in_redis != row.n:
                row.note = f"Redis holds {in_redis} of {row.n} ids"
        elif row.system == "post_office":
            from post_office.models import Email

            got = Email.objects.count()
        else:
            from mailer.models import Message

            got = Message.objects.count()
        if got != row.n:
            row.note = f"queued {got} of {row.n}!"

    # -- 2./3. delivery -------------------------------------------------------------

    def env(self, email: str, smtp_port: int | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="bench.settings",
            BENCH_DB=self.db,
            BENCH_EMAIL=email,
            PYTHONPATH=str(ROOT),
        )
        if smtp_port:
            env["BENCH_SMTP_PORT"] = str(smtp_port)
        return env

    def commands(self) -> list[tuple[str, str, list[list[str]], dict[str, str]]]:
        py = [sys.executable, "-m", "django"]
        lock = os.path.join(os.environ.get("BENCH_TMP", "/tmp"), "post_office")
        c2 = self.sizes.two_proc_concurrency
        out = []
        for c in (1, 4, 16):
            argv = [*py, "outbox_worker", "--burst", "--concurrency", str(c)]
            out.append(("outbox", f"outbox_worker --concurrency {c}", [argv], {}))
        argv2 = [*py, "outbox_worker", "--burst", "--concurrency", str(c2)]
        if self.vendor == "postgresql":
            argv = [*py, "outbox_worker", "--burst", "--concurrency", "16"]
            out.append(
                ("outbox", f"outbox_worker --concurrency 16, {PREPARED}", [argv], PREPARED_ENV)
            )
            out.append(
                (
                    "outbox",
                    f"2 x outbox_worker --concurrency {c2}, {PREPARED}",
                    [argv2, argv2],
                    PREPARED_ENV,
                )
            )
        else:
            out.append(("outbox", f"2 x outbox_worker --concurrency {c2}", [argv2, argv2], {}))
        out.append(
            (
                "post_office",
                "send_queued_mail (defaults)",
                [[*py, "send_queued_mail", "-L", lock]],
                {},
            )
        )
        out.append(("mailer", "send_mail", [[*py, "send_mail"]], {}))
        return out

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
            for _ in range(self.repeat):
                for row, argvs, row_env in rows:
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
        from outbox.backends import get_delivery_connection
        from outbox.worker import Worker

        n = self.sizes.counts
        self.reset()
        self.seed("outbox", n)
        worker = Worker(burst=True, concurrency=1)
        worker._register()
        backend = get_delivery_connection()
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        worker._sender_loop(backend)
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

    # -- 5. scale --------------------------------------------------------------------

    def bench_scale(self) -> None:
        from outbox.sweeper import Sweeper

        n = self.sizes.scale_drain
        c = self.sizes.scale_concurrency
        py = [sys.executable, "-m", "django", "outbox_worker", "--burst", "--concurrency", str(c)]
        env = {**self.env("noop"), **PREPARED_ENV}
        self.extra["scale"] = {}
        for history in self.sizes.scale_history:
            self.reset()
            t0 = time.perf_counter()
            self.insert_history(history)
            self.log(f"scale: {history} history rows in {time.perf_counter() - t0:.1f}s")
            row = self.add(
                Row(
                    "scale",
                    self.db,
                    "outbox",
                    f"{history:,} rows in table, c{c}, {PREPARED}",
                    n,
                    ours=True,
                )
            )
            for i in range(self.repeat):
                self.seed("outbox", n, offset=(i + 1) * 10_000_000)
                from django.db import connection

                connection.close()
                elapsed, err = run_timed([py], env)
                row.times.append(elapsed)
                if err:
                    row.note = err
                self.log(f"scale {history}: {elapsed:.2f}s")
            full = Sweeper().run_pass(full_mirror_check=True)
            incremental = Sweeper().run_pass()
            self.extra["scale"][str(history)] = {
                "rows": self.count_rows(),
                "sweep_full_s": full.seconds,
                "sweep_incremental_s": incremental.seconds,
                "sweep_errors": full.errors + incremental.errors,
            }
            self.log(f"scale {history}: sweeper {full.seconds:.3f}s / {incremental.seconds:.3f}s")

    def count_rows(self) -> int:
        from outbox.models import Delivery

        return Delivery.objects.count()

    def insert_history(self, count: int) -> None:
        """count old deliveries (99% sent, 1% failed) and one attempt each, in SQL."""
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO outbox_email (subject, body, html_message, from_email, reply_to,"
                " headers, created_at) VALUES ('old newsletter', %s, '', %s, '[]', '{}',"
                " now() - interval '30 days') RETURNING id",
                [BODY, SENDER],
            )
            email_id = cur.fetchone()[0]
            cur.execute(
                """
                INSERT INTO outbox_delivery (email_id, recipient, status, priority, attempts,
                    max_attempts, not_before, worker_id, claim_token, processing_started_at,
                    sent_at, message_id, last_error, idempotency_key, created_at, updated_at)
                SELECT %s, 'old' || g || '@example.com',
                    CASE WHEN g %% 100 = 0 THEN 'failed' ELSE 'sent' END, 'normal', 1, 5,
                    t, 'old-worker', gen_random_uuid(), t,
                    CASE WHEN g %% 100 = 0 THEN NULL ELSE t END,
                    '<old' || g || '@example.com>', '', NULL, t, t
                FROM generate_series(1, %s) AS g,
                    LATERAL (SELECT now() - interval '30 days' + g * interval '1 second' AS t) AS x
                """,
                [email_id, count],
            )
            cur.execute(
                """
                INSERT INTO outbox_attempt (delivery_id, number, worker_id, claim_token,
                    started_at, finished_at, outcome, error, actor)
                SELECT id, 1, worker_id, claim_token, processing_started_at,
                    processing_started_at, CASE WHEN status = 'sent' THEN 'sent' ELSE 'failed' END,
                    '', worker_id
                FROM outbox_delivery
                """
            )
            cur.execute("VACUUM ANALYZE outbox_delivery")
            cur.execute("VACUUM ANALYZE outbox_attempt")
            cur.execute("VACUUM ANALYZE outbox_email")


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


def profile_table(
    profile: cProfile.Profile, key: str, limit: int, only: tuple[str, ...] = ()
) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    stats.sort_stats(key)
    if only:
        stats.print_stats("|".join(only), limit)
    else:
        stats.print_stats(limit)
    text = stream.getvalue()
    # Keep the table only, with paths shortened to package-relative names.
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    out = []
    for line in lines[start:]:
        line = re.sub(r"\S*/site-packages/", "", line)
        line = line.replace(str(ROOT) + "/", "")
        line = re.sub(r"\S*/lib/python3\.\d+/", "", line)
        if line.strip():
            out.append(line.rstrip())
    return "\n".join(out)


class Instruments:
    """Counts SQL statements, commits and Redis round trips of this process."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.lock = threading.Lock()
        self.on = False
        self.statements: Counter[str] = Counter()
        self.autocommit: Counter[str] = Counter()
        self.commits = 0
        self.connects = 0
        self.sql_time = 0.0
        self.redis_calls: Counter[str] = Counter()
        self.redis_time = 0.0
        self.pg_before: tuple[int, int] | None = None
        self.redis_server_before = 0

    def sql_wrapper(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not self.on:
            return execute(sql, params, many, context)
        kind = sql.lstrip().split(None, 1)[0].upper()
        if kind == "WITH":
            # A CTE statement writes if any of its parts does (the worker's step).
            kind = "WITH (write)" if _WRITES.search(sql) else "WITH (read)"
        in_tx = context["connection"].in_atomic_block
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - start
            with self.lock:
                self.sql_time += took
                self.statements[kind] += 1
                if not in_tx and kind not in ("BEGIN", "SAVEPOINT", "RELEASE", "ROLLBACK"):
                    self.autocommit[kind] += 1

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        import redis
        from django.db import connection
        from django.db.backends.base.base import BaseDatabaseWrapper
        from django.db.backends.signals import connection_created

        def created(sender: Any, connection: Any, **kwargs: Any) -> None:
            # A connection object that reconnects fires this again: add once.
            if self.sql_wrapper not in connection.execute_wrappers:
                connection.execute_wrappers.append(self.sql_wrapper)
            with self.lock:
                self.connects += 1

        orig_commit = BaseDatabaseWrapper._commit
        orig_exec = redis.Redis.execute_command
        orig_pipe = redis.client.Pipeline.execute
        me = self

        def counted_commit(conn: Any) -> Any:
            if me.on:
                with me.lock:
                    me.commits += 1
            return orig_commit(conn)

        def counted_exec(client: Any, *args: Any, **options: Any) -> Any:
            if not me.on:
                return orig_exec(client, *args, **options)
            start = time.perf_counter()
            try:
                return orig_exec(client, *args, **options)
            finally:
                with me.lock:
                    me.redis_time += time.perf_counter() - start
                    me.redis_calls[str(args[0]).upper()] += 1

        def counted_pipe(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            if not me.on:
                return orig_pipe(pipe, *args, **kwargs)
            start = time.perf_counter()
            try:
                return orig_pipe(pipe, *args, **kwargs)
            finally:
                with me.lock:
                    me.redis_time += time.perf_counter() - start
                    me.redis_calls["PIPELINE"] += 1

        connection.close()
        self.pg_before = self.pg_stats()
        self.redis_server_before = self.redis_server_commands()
        connection.close()
        connection_created.connect(created)
        BaseDatabaseWrapper._commit = counted_commit  # type: ignore[method-assign]
        redis.Redis.execute_command = counted_exec  # type: ignore[method-assign]
        redis.client.Pipeline.execute = counted_pipe  # type: ignore[method-assign]
        self.on = True
        try:
            yield
        finally:
            self.on = False
            BaseDatabaseWrapper._commit = orig_commit  # type: ignore[method-assign]
            redis.Redis.execute_command = orig_exec  # type: ignore[method-assign]
            redis.client.Pipeline.execute = orig_pipe  # type: ignore[method-assign]
            connection_created.disconnect(created)
            connection.close()
            time.sleep(1.2)  # let the server flush its statistics
            self.pg_after = self.pg_stats()
            self.redis_server_after = self.redis_server_commands()

    def pg_stats(self) -> tuple[int, int] | None:
        if self.vendor != "postgresql":
            return None
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            xact = int(cur.fetchone()[0])
            cur.execute("SELECT wal_sync FROM pg_stat_wal")
            sync = int(cur.fetchone()[0])
        connection.close()
        return xact, sync

    def redis_server_commands(self) -> int:
        import redis

        client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        value = int(client.info("stats")["total_commands_processed"])
        client.close()
        return value

    def summary(self, delivered: int, wall: float) -> dict[str, Any]:
        d = max(delivered, 1)
        auto_writes = sum(
            v
            for k, v in self.autocommit.items()
            if k in ("INSERT", "UPDATE", "DELETE", "WITH (write)")
        )
        auto_reads = sum(self.autocommit.values()) - auto_writes
        out: dict[str, Any] = {
            "delivered": delivered,
            "wall_s": wall,
            "sql_statements": sum(self.statements.values()) / d,
            "sql_by_kind": {k: round(v / d, 3) for k, v in sorted(self.statements.items())},
            "explicit_commits": self.commits / d,
            "autocommit_writes": auto_writes / d,
            "autocommit_reads": auto_reads / d,
            "write_commits": (self.commits + auto_writes) / d,
            "transactions": (self.commits + sum(self.autocommit.values())) / d,
            "db_connects": self.connects / d,
            "sql_time_ms": 1000 * self.sql_time / d,
            "redis_round_trips": sum(self.redis_calls.values()) / d,
            "redis_by_command": {k: round(v / d, 4) for k, v in sorted(self.redis_calls.items())},
            "redis_time_ms": 1000 * self.redis_time / d,
            "redis_server_commands": (self.redis_server_after - self.redis_server_before - 1) / d,
            "wall_ms": 1000 * wall / d,
        }
        if self.pg_before and self.pg_after:
            # Minus the statistics queries' own transactions (about 2 per read).
            out["pg_xact_commit"] = (self.pg_after[0] - self.pg_before[0] - 2) / d
            out["pg_wal_sync"] = (self.pg_after[1] - self.pg_before[1]) / d
        return out


# =============================================================================
# parent: prepare databases, run the children, report
# =============================================================================


def prepare_db(db: str, env: dict[str, str]) -> None:
    if db == "postgres":
        import psycopg

        with psycopg.connect(
            host=os.environ["BENCH_PG_HOST"],
            port=os.environ["BENCH_PG_PORT"],
            user=os.environ["BENCH_PG_USER"],
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute("DROP DATABASE IF EXISTS bench")
            conn.execute("CREATE DATABASE bench")
    else:
        path = Path(env["BENCH_SQLITE_PATH"])
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True
    )


def machine_info(children: dict[str, dict[str, Any]]) -> dict[str, str]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis_version = ""
    with contextlib.suppress(Exception):
        redis_version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2]
    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "Django": metadata.version("Django"),
        "django-email-outbox": metadata.version("django-email-outbox"),
        "django-post-office": metadata.version("django-post_office"),
        "django-mailer": metadata.version("django-mailer"),
        "redis-server": redis_version.removeprefix("v="),
    }
    for db, data in children.items():
        info[db] = data["extra"].get("db_version", "")
    return info


def fmt_rate(x: float) -> str:
    return "-" if x != x else f"{x:,.0f}"


def build_report(
    rows: list[Row],
    children: dict[str, dict[str, Any]],
    info: dict[str, str],
    params: dict[str, Any],
) -> tuple[str, list[tuple[str, str, str]]]:
    titles = {
        "enqueue-bulk": "Enqueue: one call, many recipients",
        "enqueue-single": "Enqueue: one-recipient calls",
        "deliver-noop": "Delivery, no-op backend (dummy EmailBackend)",
        "deliver-smtp": f"Delivery to loopback SMTP, {params['smtp_delay'] * 1000:.0f} ms per message",
        "scale": "Scale: our delivery rate vs rows already in the Delivery table (PostgreSQL)",
    }
    out: list[str] = []
    out.append("| scenario | db | system | configuration | emails | median s | emails/s | x ours |")
    out.append("|---|---|---|---|---:|---:|---:|---:|")
    for section in titles:
        for db in ("postgres", "sqlite"):
            group = [r for r in rows if r.section == section and r.db == db]
            if not group:
                continue
            ours = [r for r in group if r.ours]
            if section == "scale":
                ref = ours[0].rate if ours else float("nan")
            else:
                ref = max((r.rate for r in ours), default=float("nan"))
            for r in group:
                ratio = r.rate / ref if ref == ref and ref else float("nan")
                note = f" ({r.note})" if r.note else ""
                out.append(
                    f"| {section} | {db} | {r.system} | {r.config}{note} | {r.n:,} | {r.median:.3f} "
                    f"| {fmt_rate(r.rate)} | {'-' if ratio != ratio else f'{ratio:.2f}'} |"
                )
    table = "\n".join(out)

    targets = evaluate_targets(rows, children)
    md: list[str] = ["# Email outbox benchmark", ""]
    md.append(
        "Produced by `bench/run.sh` (bench/bench.py). Rates are emails per second, median of "
        f"{params['repeat']} run(s); `x ours` is each row's rate divided by our best configuration "
        "in the same scenario and database (for enqueue: by `enqueue_email`; for scale: by the "
        "first history size). Delivery times are wall-clock from spawning the management command "
        "to its exit, identical for all three systems, so each includes one Python + Django "
        "start-up. Each measurement starts from empty tables and an empty Redis."
    )
    md.append("")
    md.append("## Machine and parameters")
    md.append("")
    for k, v in info.items():
        md.append(f"- {k}: {v}")
    for k, v in params.items():
        md.append(f"- {k}: {v}")
    md.append("")
    md.append("## Results")
    md.append("")
    md.append(table)
    md.append("")
    md.append("## Targets")
    md.append("")
    md.append("| target | measured | verdict |")
    md.append("|---|---|---|")
    for name, measured, verdict in targets:
        md.append(f"| {name} | {measured} | {verdict} |")
    md.append("")
    for db, data in children.items():
        counts = data["extra"].get("counts")
        if counts:
            md.append(f"## Our worker, per delivered email ({db}, in-process, concurrency 1)")
            md.append("")
            md.append(
                "SQL statements: counted by an execute_wrapper installed on every connection "
                "(connection_created). Commits: explicit COMMITs (transaction.atomic) counted by "
                "wrapping the backend's `_commit`, plus statements run in autocommit mode (each is "
                "its own transaction); `write commits` are the ones that carry writes (WAL flush). "
                "`pg_xact_commit` is the server's pg_stat_database delta (every transaction, "
                "read-only ones included); `pg_wal_sync` the pg_stat_wal fsync delta (cluster). "
                "Redis round trips: client-side, by wrapping redis-py's `Redis.execute_command` "
                "and `Pipeline.execute` (EVALSHA of the claim script = 1); server commands: INFO "
                "stats total_commands_processed delta. Heartbeat/register traffic is included."
            )
            md.append("")
            md.append("| measure | per email |")
            md.append("|---|---:|")
            for k, v in counts.items():
                if isinstance(v, float):
                    v = f"{v:.3f}"
                md.append(f"| {k} | {v} |")
            md.append("")
        scale = data["extra"].get("scale")
        if scale:
            md.append(f"## Sweeper pass time vs table size ({db})")
            md.append("")
            md.append("| rows in Delivery | full pass s | incremental pass s |")
            md.append("|---:|---:|---:|")
            for _size, s in scale.items():
                md.append(
                    f"| {s['rows']:,} | {s['sweep_full_s']:.3f} | {s['sweep_incremental_s']:.3f} |"
                )
            md.append("")
        prof = data["extra"].get("profile")
        if prof:
            md.append(
                f"## cProfile of one drain ({db}, {prof['n']} emails, {prof['wall']:.2f}s with "
                "the profiler on, sender loop in the main thread)"
            )
            md.append("")
            md.append("Top functions by own time:")
            md.append("")
            md.append("```")
            md.append(prof["tottime"])
            md.append("```")
            md.append("")
            md.append("Top by cumulative time (outbox, django, redis, psycopg):")
            md.append("")
            md.append("```")
            md.append(prof["cumulative"])
            md.append("```")
            md.append("")
    return "\n".join(md) + "\n", targets


def evaluate_targets(
    rows: list[Row], children: dict[str, dict[str, Any]]
) -> list[tuple[str, str, str]]:
    def get(
        section: str, system: str, db: str = "postgres", config: str | None = None
    ) -> list[Row]:
        return [
            r
            for r in rows
            if r.section == section
            and r.system == system
            and r.db == db
            and (config is None or config in r.config)
        ]

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "NOT MET")

    out: list[tuple[str, str, str]] = []
    ours = get("deliver-noop", "outbox")
    po = get("deliver-noop", "post_office")
    ml = get("deliver-noop", "mailer")
    if ours and po and ml:
        best = max(ours, key=lambda r: r.rate)
        r_po, r_ml = best.rate / po[0].rate, best.rate / ml[0].rate
        out.append(
            (
                "no-op delivery (PG): best ours >= 1.0x post_office",
                f"{best.config}: {best.rate:,.0f}/s vs {po[0].rate:,.0f}/s = {r_po:.2f}x",
                verdict(r_po >= 1.0),
            )
        )
        out.append(
            (
                "no-op delivery (PG): best ours >= 3x django-mailer",
                f"{best.rate:,.0f}/s vs {ml[0].rate:,.0f}/s = {r_ml:.2f}x",
                verdict(r_ml >= 3.0),
            )
        )
    ours16 = get("deliver-smtp", "outbox", config="--concurrency 16")
    ours16 = [r for r in ours16 if not r.config.startswith("2 x")]
    po = get("deliver-smtp", "post_office")
    if ours16 and po:
        best = max(ours16, key=lambda r: r.rate)
        r = best.rate / po[0].rate
        out.append(
            (
                "20 ms SMTP (PG): ours c16 >= 3x post_office",
                f"{best.config}: {best.rate:,.0f}/s vs {po[0].rate:,.0f}/s = {r:.2f}x",
                verdict(r >= 3.0),
            )
        )
    ours = sorted(get("enqueue-bulk", "outbox"), key=lambda r: r.median)
    po = get("enqueue-bulk", "post_office")
    if ours:
        fast = ours[0].median < 0.5 and ours[0].n >= 10_000
        out.append(
            (
                "enqueue 10,000 recipients (PG) < 0.5 s",
                f"{ours[0].config}: {ours[0].n:,} in {ours[0].median:.3f}s",
                verdict(fast if ours[0].n >= 10_000 else None),
            )
        )
    if ours and po:
        r = ours[0].rate / po[0].rate
        out.append(
            (
                "enqueue bulk (PG) >= 2x post_office send_many",
                f"{ours[0].rate:,.0f}/s vs {po[0].rate:,.0f}/s = {r:.2f}x",
                verdict(r >= 2.0),
            )
        )
    ours = sorted(get("enqueue-single", "outbox"), key=lambda r: -r.rate)
    po = get("enqueue-single", "post_office")
    if ours and po:
        r = ours[0].rate / po[0].rate
        out.append(
            (
                "one-recipient calls (PG) >= post_office mail.send",
                f"{ours[0].config}: {ours[0].rate:,.0f}/s vs {po[0].rate:,.0f}/s = {r:.2f}x",
                verdict(r >= 1.0),
            )
        )
    counts = children.get("postgres", {}).get("extra", {}).get("counts")
    if counts:
        out.append(
            (
                "<= 2 commits per delivered email (PG)",
                f"{counts['write_commits']:.2f} write commits; {counts['transactions']:.2f} "
                f"transactions incl. read-only; pg xact_commit {counts.get('pg_xact_commit', 0):.2f}",
                verdict(counts["write_commits"] <= 2.0 + 1e-9)
                + (
                    " (writes); NOT MET counting read-only transactions"
                    if counts["transactions"] > 2.0 + 1e-9
                    else ""
                ),
            )
        )
        out.append(
            (
                "<= 1 Redis round trip per delivered email",
                f"{counts['redis_round_trips']:.3f} (client-side)",
                verdict(counts["redis_round_trips"] <= 1.0),
            )
        )
    scale = get("scale", "outbox")
    if len(scale) == 2:
        small, big = scale
        r = big.rate / small.rate
        sizes = children["postgres"]["extra"]["scale"]
        sweeps = ", ".join(f"{int(k):,}: {v['sweep_full_s']:.3f}s" for k, v in sizes.items())
        out.append(
            (
                f"rate at {big.config.split(' rows')[0]} rows within 10% of {small.config.split(' rows')[0]}",
                f"{big.rate:,.0f}/s vs {small.rate:,.0f}/s = {r:.2f}x; sweeper full pass {sweeps}",
                verdict(r >= 0.9),
            )
        )
    return out


def parent_main(args: argparse.Namespace) -> None:
    sizes = QUICK if args.quick else Sizes()
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if args.sqlite_repeat is None and not args.quick and args.repeat is None:
        args.sqlite_repeat = 1  # time budget: SQLite is secondary
    dbs = ["postgres", "sqlite"] if args.db == "both" else [args.db]
    tmp = os.environ.get("BENCH_TMP") or "/tmp"
    children: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for db in dbs:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="bench.settings",
            BENCH_DB=db,
            BENCH_SQLITE_PATH=os.path.join(tmp, "bench.sqlite3"),
            PYTHONPATH=str(ROOT),
        )
        prepare_db(db, env)
        db_sizes = sizes
        if db == "sqlite" and not args.quick:
            # Time budget: SQLite is secondary here; smaller runs.
            db_sizes = replace(
                sizes, enqueue_single=1_000, drain_noop=1_500, drain_smtp=300, counts=500
            )
        db_repeat = repeat
        if db == "sqlite" and args.sqlite_repeat is not None:
            db_repeat = args.sqlite_repeat
        out = os.path.join(tmp, f"child-{db}.json")
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--db",
            db,
            "--repeat",
            str(db_repeat),
            "--sizes",
            json.dumps(asdict(db_sizes)),
            "--out",
            out,
        ]
        only = args.only
        if db == "sqlite" and not only:
            only = "enqueue,noop,smtp,counts"
        if only:
            cmd += ["--only", only]
        print(f"==> {db}: {' '.join(cmd[3:8])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, env=env, cwd=ROOT, check=True)
        children[db] = json.loads(Path(out).read_text())
        children[db]["repeat"] = db_repeat

    rows = [Row(**r) for db in children for r in children[db]["rows"]]
    info = machine_info(children)
    params = {
        "mode": "quick (smoke sizes)" if args.quick else "full",
        "repeat": ", ".join(f"{db}: {children[db]['repeat']}" for db in children),
        "enqueue bulk recipients": sizes.enqueue_bulk,
        "enqueue one-recipient calls": sizes.enqueue_single,
        "no-op drain emails": sizes.drain_noop,
        "SMTP drain emails": sizes.drain_smtp,
        "smtp_delay": sizes.smtp_delay,
        "per-email count drain": sizes.counts,
        "scale history rows": " vs ".join(f"{s:,}" for s in sizes.scale_history),
        "scale drain": f"{sizes.scale_drain} emails, outbox_worker --concurrency {sizes.scale_concurrency}",
        "OUTBOX settings": "defaults (CLAIM_BATCH 10) + EMAIL_BACKEND",
        "Django DATABASES": "defaults (CONN_MAX_AGE 0, prepare_threshold None); rows marked "
        f"'{PREPARED}' set OPTIONS prepare_threshold=5 (PostgreSQL)",
        "post_office settings": "defaults (BATCH_SIZE 100, THREADS_PER_PROCESS 5, LOG_LEVEL 2)",
        "SQLite": (
            "scale check and profile on PostgreSQL only"
            + (
                ""
                if args.quick
                else "; SQLite sizes: 1,000 calls, 1,500 no-op, 300 SMTP, 500 counted"
            )
        ),
        "runtime": f"{time.monotonic() - started:.0f}s",
    }
    params["repeat"] = params["repeat"]
    report, targets = build_report(rows, children, info, params)
    RESULTS.mkdir(parents=True, exist_ok=True)
    target_file = Path(args.output)
    target_file.write_text(report)
    # Console: the table and the targets.
    start = report.index("## Results")
    end = report.index("## Our worker") if "## Our worker" in report else len(report)
    print()
    print(report[start:end])
    for db, data in children.items():
        counts = data["extra"].get("counts")
        if counts:
            print(
                f"per delivered email ({db}): "
                + json.dumps(
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in counts.items()}
                )
            )
    print(
        f"\nwritten to {target_file.relative_to(ROOT) if target_file.is_relative_to(ROOT) else target_file}"
    )
    del targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke test)")
    parser.add_argument("--db", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per measurement (default 3; quick 1)"
    )
    parser.add_argument(
        "--sqlite-repeat", type=int, default=None, help="runs per measurement on SQLite"
    )
    parser.add_argument(
        "--only", default="", help="comma list of parts: enqueue,noop,smtp,counts,profile,scale"
    )
    parser.add_argument("--output", default=str(RESULTS / "latest.md"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
