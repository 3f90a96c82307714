"""Benchmark: django-email-outbox vs django-post-office vs django-mailer.

Run through tests/benchmark/run.sh, which starts redis-server and a durable
PostgreSQL and sets the BENCH_* environment. This module is the runner: the
command line, and the parent process, which prepares each database, runs a
child process per database (Django settings are per process; child.py),
collects their JSON results, prints one table and writes results/latest.md
(report.py). Each system's side lives in system_outbox.py, system_post_office.py
and system_mailer.py; the counters and profiler in instruments.py; the scale
check in scale.py. The latency part compares us with Celery and Django Tasks
instead (side_by_side.py, peer_celery.py, peer_tasks.py; the timeline: probe.py,
timeline.py).

Every measurement starts from empty tables (TRUNCATE, or DELETE on SQLite) and
an empty Redis database; the reported time is the median of --repeat runs.
Delivery runs are timed from spawning the management command to its exit, the
same way for all three systems (so each includes one Python/Django start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tests.benchmark.common import PREPARED, QUICK, RESULTS, ROOT, SETTINGS, Row, Sizes
from tests.benchmark.report import build_report, machine_info
from tests.benchmark.side_by_side import DEFAULT_SYSTEMS
from tests.benchmark.side_by_side import SYSTEMS as LATENCY_SYSTEMS


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


def parent_main(args: argparse.Namespace) -> None:
    sizes = QUICK if args.quick else Sizes()
    if args.memory_emails:
        sizes = replace(sizes, memory_emails=args.memory_emails)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    # SQLite's runs are short (1,500 emails, half of it start-up), so a single
    # run is mostly noise: it is judged on the median of as many runs as PostgreSQL.
    dbs = ["postgres", "sqlite"] if args.db == "both" else [args.db]
    children: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for db in dbs:
        children[db] = run_child(args, db, sizes, repeat)

    rows = [Row(**r) for db in children for r in children[db]["rows"]]
    info = machine_info(children)
    params = parameters(args, sizes, children, started)
    report, _targets = build_report(rows, children, info, params, Path(args.previous))
    RESULTS.mkdir(parents=True, exist_ok=True)
    target_file = Path(args.output)
    target_file.write_text(report)
    print_console(report, children, target_file)


def run_child(args: argparse.Namespace, db: str, sizes: Sizes, repeat: int) -> dict[str, Any]:
    """Prepare the database, run the child process on it, return its results."""
    tmp = os.environ.get("BENCH_TMP") or "/tmp"
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
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
        "-m",
        "tests.benchmark.run",
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
    cmd += ["--latency-seconds", str(args.latency_seconds)]
    cmd += ["--latency-systems", args.latency_systems]
    if not args.timeline:
        cmd += ["--no-timeline"]
    only = args.only
    if db == "sqlite" and not only:
        only = "enqueue,noop,smtp,counts"
    if only:
        cmd += ["--only", only]
    print(f"==> {db}: {' '.join(cmd[4:9])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    child: dict[str, Any] = json.loads(Path(out).read_text())
    child["repeat"] = db_repeat
    return child


def parameters(
    args: argparse.Namespace, sizes: Sizes, children: dict[str, dict[str, Any]], started: float
) -> dict[str, Any]:
    """The "Machine and parameters" list of the report."""
    out: dict[str, Any] = {"note": args.note} if args.note else {}
    return out | {
        "mode": "quick (smoke sizes)" if args.quick else "full",
        "repeat": ", ".join(f"{db}: {children[db]['repeat']}" for db in children),
        "enqueue bulk recipients": sizes.enqueue_bulk,
        "enqueue one-recipient calls": sizes.enqueue_single,
        "no-op drain emails": sizes.drain_noop,
        "SMTP drain emails": sizes.drain_smtp,
        "smtp_delay": sizes.smtp_delay,
        "per-email count drain": sizes.counts,
        "bulk template emails (enqueue_many)": sizes.bulk_templates,
        "scale history rows": " vs ".join(f"{s:,}" for s in sizes.scale_history),
        "scale drain": f"{sizes.scale_drain} emails, outbox_worker --concurrency {sizes.scale_concurrency}",
        "dashboard rows": f"{sizes.dashboard_rows:,}",
        "admin scale history rows": " vs ".join(f"{s:,}" for s in sizes.admin_scale_history),
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
        "latency part": f"side by side ({args.latency_systems}), {args.latency_seconds:g} s "
        f"per system per run, timeline {'on' if args.timeline else 'off'}; then ours alone "
        "with the 20 ms server, 10 s",
        "runtime": f"{time.monotonic() - started:.0f}s",
    }


def print_console(report: str, children: dict[str, dict[str, Any]], target_file: Path) -> None:
    """Console: the table and the targets, the per-email counts, where the report went."""
    start = report.index("## Results")
    end = report.index("## Our worker") if "## Our worker" in report else len(report)
    print()
    print(report[start:end])
    if "## The dashboard at" in report:
        dash = report[report.index("## The dashboard at") :]
        print(dash[: dash.index("### Plans")])
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
        "--only",
        default="",
        help="comma list of parts: enqueue,noop,smtp,counts,profile,scale,dashboard,bulk,sending,"
        "efficiency; only when named: admin-scale (5,000,000 rows, about 20 minutes), latency "
        "(100/s side by side with Celery and Django Tasks, then ours with a 20 ms server) and memory (one worker's RSS over --memory-emails "
        "emails; BENCH_WORKER_PYTHONS names the Pythons, e.g. Django 5.2's and 6.1's)",
    )
    parser.add_argument(
        "--memory-emails", type=int, default=None, help="emails of the memory part (200,000)"
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=60.0,
        help="the latency part's side by side: seconds of 100/s per system per run (60)",
    )
    parser.add_argument(
        "--latency-systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"the latency part's systems, in order (default {','.join(DEFAULT_SYSTEMS)}; "
        f"also: {', '.join(k for k in LATENCY_SYSTEMS if k not in DEFAULT_SYSTEMS)})",
    )
    parser.add_argument(
        "--timeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the latency part's per-email timeline (tests/benchmark/probe.py in the workers)",
    )
    parser.add_argument("--note", default="", help="a line at the top of the report")
    parser.add_argument("--output", default=str(RESULTS / "latest.md"))
    parser.add_argument(
        "--previous",
        default=str(RESULTS / "latest.md"),
        help="the earlier report whose figures are shown next to this run's",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.latency_systems.split(",")) - set(LATENCY_SYSTEMS)
    if unknown:
        parser.error(f"--latency-systems: no system {', '.join(sorted(unknown))}")
    if args.child:
        from tests.benchmark.child import child_main

        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
