"""The benchmark's SQL-paths part (PostgreSQL, issue 34): PL/pgSQL functions against plain statements.

``--only paths``, PostgreSQL only, not part of the full run. The worker's step
and the one-recipient enqueue can run as calls of the PL/pgSQL functions the
migrations create or as plain statements (``OUTBOX["POSTGRESQL_FUNCTIONS"]``).
Both are measured in one run, alternated, ``--repeat`` times each, the median
reported:

- **the worker's steps** with no worker running (``floor.steps_floor``: the
  success of one email and the claim of the next, per step), one step per
  commit and 9 per commit: PostgreSQL's CPU per email, and the statements this
  process sent per email (counted by an ``execute_wrapper``, BEGIN and COMMIT
  included: each is a round trip);
- **the one-recipient enqueue** (``enqueue_email``): this process's CPU and
  PostgreSQL's per call, and the statements per call;
- **a no-op drain** by the README's worker (``--processes 2 --concurrency 16
  --burst``), whole: tier CPU per email (workers + PostgreSQL + redis-server),
  run minus empty run, as in the efficiency part.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.benchmark import floor
from tests.benchmark.common import BODY, SENDER, SUBJECT, rcpt
from tests.benchmark.efficiency import Meter, pid_cpu, tier, tree_cpu

MODES = ("functions", "plain")


@contextmanager
def _mode(mode: str) -> Iterator[None]:
    from django.conf import settings

    old = settings.OUTBOX
    settings.OUTBOX = {**old, "POSTGRESQL_FUNCTIONS": mode == "functions"}
    try:
        yield
    finally:
        settings.OUTBOX = old


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Statements this process sends on the default connection while inside."""
    from django.db import connection

    count = [0]

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        count[0] += 1
        return execute(sql, params, many, ctx)

    connection.ensure_connection()
    with connection.execute_wrapper(wrapper):
        yield count


class PathsMixin:
    """The SQL-paths part of the benchmark's ``Child`` (see child.py)."""

    db: str
    extra: dict[str, Any]
    repeat: int
    sizes: Any
    redis: Any

    def bench_paths(self) -> None:
        self._meter_base = self._server_pids()  # type: ignore[attr-defined]
        pg_pid, redis_pid = self._meter_base
        n = self.sizes.drain_noop
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for rep in range(self.repeat):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for mode in order:
                with _mode(mode):
                    one: dict[str, float] = {}
                    for batch in (1, 9):
                        one.update(self._paths_steps(n, batch, pg_pid))
                    one.update(self._paths_enqueue(self.sizes.enqueue_single, pg_pid, redis_pid))
                one.update(self._paths_drain(mode, n))
                runs[mode].append(one)
                self.log(f"paths {mode}: {one}")  # type: ignore[attr-defined]
        out: dict[str, Any] = {"n": n, "repeat": self.repeat, "load": os.getloadavg()[0]}
        for mode, per in runs.items():
            out[mode] = {k: statistics.median(r[k] for r in per) for k in per[0]}
        self.extra["paths"] = out

    def _paths_steps(self, n: int, batch: int, pg_pid: int) -> dict[str, float]:
        got = floor.steps_floor(
            n,
            batch,
            lambda: tree_cpu(pg_pid),
            self.reset,  # type: ignore[attr-defined]
            lambda k: self.seed("outbox", k),  # type: ignore[attr-defined]
        )
        return {
            f"steps{batch}_pg": got["postgres"],
            f"steps{batch}_rate": got["rate"],
            f"steps{batch}_statements": self._paths_statements(batch),
        }

    def _paths_statements(self, batch: int) -> float:
        """Statements sent per email by ``run_steps``, on ``batch`` fresh rows (not timed)."""
        import uuid

        from django.db import connection
        from django.utils import timezone

        from outbox.worker import sql

        self.reset()  # type: ignore[attr-defined]
        self.seed("outbox", 2 * batch)  # type: ignore[attr-defined]
        with connection.cursor() as cur:
            cur.execute("SELECT id FROM outbox_delivery ORDER BY id")
            ids = [row[0] for row in cur.fetchall()]
        tokens = {pk: uuid.uuid4() for pk in ids}
        first, second = ids[:batch], ids[batch:]
        now = timezone.now()
        sql.run_steps([sql.Step(None, pk, "paths", tokens[pk], now, 0) for pk in first])
        with _counting() as count:
            # The steady state: each step settles one row and claims the next.
            sql.run_steps(
                [
                    sql.Step((a, tokens[a]), b, "paths", tokens[b], now, 0)
                    for a, b in zip(first, second, strict=True)
                ]
            )
        return count[0] / batch

    def _paths_enqueue(self, n: int, pg_pid: int, redis_pid: int) -> dict[str, float]:
        from django.db import connection

        from outbox import enqueue_email

        self.reset()  # type: ignore[attr-defined]
        connection.ensure_connection()
        enqueue_email(SUBJECT, BODY, SENDER, [rcpt(n + 1)])  # warm: imports, the script
        before = (time.process_time(), tree_cpu(pg_pid), pid_cpu(redis_pid))
        with _counting() as count:
            for i in range(n):
                enqueue_email(SUBJECT, BODY, SENDER, [rcpt(i)])
        caller = time.process_time() - before[0]
        pg = tree_cpu(pg_pid) - before[1]
        redis = pid_cpu(redis_pid) - before[2]
        return {
            "enqueue_caller": caller / n,
            "enqueue_pg": pg / n,
            "enqueue_redis": redis / n,
            "enqueue_statements": count[0] / n,
        }

    def _paths_drain(self, mode: str, n: int) -> dict[str, float]:
        env = self.env("noop", None)  # type: ignore[attr-defined]
        if mode == "plain":
            env = {**env, "BENCH_OUTBOX_PLAIN_SQL": "1"}
        else:
            env.pop("BENCH_OUTBOX_PLAIN_SQL", None)
        meter: Meter = self._meter({})  # type: ignore[attr-defined]
        _system, argv = self._commands()["outbox"]  # type: ignore[attr-defined]
        full = self._one_run("outbox", argv, n, env, meter)  # type: ignore[attr-defined]
        empty = self._one_run("outbox", argv, 0, env, meter)  # type: ignore[attr-defined]
        per = {k: (full[k] - empty[k]) / n for k in full}
        return {
            "drain_tier": tier(per),
            "drain_workers": per["workers"],
            "drain_pg": per["postgres"],
            "drain_rate": n / full["wall"],
        }


# -- the report ------------------------------------------------------------------------------


def _us(x: float) -> str:
    return f"{1e6 * x:,.0f}"


def paths_section(db: str, data: Any) -> list[str]:
    """The report's table: each measurement with the functions and with plain statements."""
    if not data:
        return []
    f, p = data["functions"], data["plain"]
    rows = [
        ("step, 1 per commit: PostgreSQL µs per email", "steps1_pg", _us),
        ("step, 1 per commit: steps/s (this process driving)", "steps1_rate", "{:,.0f}".format),
        ("step, 1 per commit: statements sent per email", "steps1_statements", "{:.2f}".format),
        ("step, 9 per commit: PostgreSQL µs per email", "steps9_pg", _us),
        ("step, 9 per commit: steps/s (this process driving)", "steps9_rate", "{:,.0f}".format),
        ("step, 9 per commit: statements sent per email", "steps9_statements", "{:.2f}".format),
        ("enqueue_email, one recipient: caller µs per call", "enqueue_caller", _us),
        ("enqueue_email, one recipient: PostgreSQL µs per call", "enqueue_pg", _us),
        (
            "enqueue_email, one recipient: statements per call",
            "enqueue_statements",
            "{:.2f}".format,
        ),
        ("no-op drain, README's worker: tier µs per email", "drain_tier", _us),
        ("no-op drain: workers µs per email", "drain_workers", _us),
        ("no-op drain: PostgreSQL µs per email", "drain_pg", _us),
        ("no-op drain: emails/s", "drain_rate", "{:,.0f}".format),
    ]
    md = [
        f"## PL/pgSQL functions against plain statements ({db}; {data['n']:,} emails, "
        f"median of {data['repeat']}, alternated; load average {data['load']:.1f} at the end)",
        "",
        "| measurement | functions | plain statements | plain / functions |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt in rows:
        ratio = p[key] / f[key] if f[key] else float("nan")
        md.append(f"| {label} | {fmt(f[key])} | {fmt(p[key])} | {ratio:.2f}x |")
    md.append("")
    return md
