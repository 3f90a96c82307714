"""Instruments of the benchmark: count what our worker does per delivered email, and profile it.

``Instruments`` counts SQL statements (an execute_wrapper on every connection),
commits (wrapping the backend's ``_commit``, plus autocommit statements), Redis
round trips (wrapping redis-py's ``execute_command`` and ``Pipeline.execute``,
and ``outbox.queue.direct``'s ``evalsha``, which sends without them)
and the servers' own counters (pg_stat_database, pg_stat_wal, INFO stats).
``profile_table`` renders a cProfile run as a short table.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from tests.benchmark.common import ROOT

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
_OUTBOX_FUNCTION = re.compile(r"\boutbox_(steps?|enqueue|enqueue_one)\(")


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


def xact_commit(cursor: Any) -> int:
    """PostgreSQL's count of transactions committed in this database (pg_stat_database)."""
    cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    return int(cursor.fetchone()[0])


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
        elif kind == "SELECT" and _OUTBOX_FUNCTION.search(sql):
            # The PL/pgSQL step and enqueue functions write (outbox/statements/postgresql.py).
            kind = "FUNCTION (write)"
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
        """Count while inside; the counting wrappers are installed and removed here."""
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

        from outbox.queue.direct import DirectConnections

        orig_commit = BaseDatabaseWrapper._commit
        orig_exec = redis.Redis.execute_command
        orig_pipe = redis.client.Pipeline.execute
        orig_direct = DirectConnections.evalsha
        counted_commit, counted_exec, counted_pipe = self.counting(
            orig_commit, orig_exec, orig_pipe
        )

        def counted_direct(direct: Any, *args: Any) -> Any:
            if not self.on:
                return orig_direct(direct, *args)
            start = time.perf_counter()
            try:
                return orig_direct(direct, *args)
            finally:
                with self.lock:
                    self.redis_time += time.perf_counter() - start
                    self.redis_calls["EVALSHA"] += 1

        connection.close()
        self.pg_before = self.pg_stats()
        self.redis_server_before = self.redis_server_commands()
        connection.close()
        connection_created.connect(created)
        BaseDatabaseWrapper._commit = counted_commit  # type: ignore[method-assign]
        redis.Redis.execute_command = counted_exec  # type: ignore[method-assign]
        redis.client.Pipeline.execute = counted_pipe  # type: ignore[method-assign]
        DirectConnections.evalsha = counted_direct  # type: ignore[method-assign]
        self.on = True
        try:
            yield
        finally:
            self.on = False
            BaseDatabaseWrapper._commit = orig_commit  # type: ignore[method-assign]
            redis.Redis.execute_command = orig_exec  # type: ignore[method-assign]
            redis.client.Pipeline.execute = orig_pipe  # type: ignore[method-assign]
            DirectConnections.evalsha = orig_direct  # type: ignore[method-assign]
            connection_created.disconnect(created)
            connection.close()
            time.sleep(1.2)  # let the server flush its statistics
            self.pg_after = self.pg_stats()
            self.redis_server_after = self.redis_server_commands()

    def counting(
        self, orig_commit: Any, orig_exec: Any, orig_pipe: Any
    ) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        """Wrappers of a backend's _commit, Redis.execute_command and Pipeline.execute."""
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

        return counted_commit, counted_exec, counted_pipe

    def pg_stats(self) -> tuple[int, int] | None:
        if self.vendor != "postgresql":
            return None
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            xact = xact_commit(cur)
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
            if k in ("INSERT", "UPDATE", "DELETE", "WITH (write)", "FUNCTION (write)")
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
