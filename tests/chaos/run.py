"""The chaos run: real workers, real servers, real kills; then count every email.

    tests/chaos/run.sh --deliveries 5000 --policy both         # starts a throwaway PostgreSQL
    python -m tests.chaos.run --db sqlite --deliveries 500     # SQLite: no "refuse mark sent" step

This module is the runner (the command line, and one child process per policy);
the parts are named for what they do: config.py, smtp.py, plan.py, servers.py,
processes.py, faults/ (one module per fault), child.py (one policy's run),
analysis.py (the rules) and report.py (the table).

Each policy runs in a fresh child process (``python -m tests.chaos.run --child``) with
its own database (``chaos_<policy>_<random>`` on the PostgreSQL server named by
OUTBOX_TEST_PG_HOST/PORT/USER, or a SQLite file), its own redis-server and its
own SMTP server, all on 127.0.0.1 and free ports, everything started stopped by
pid. The child:

1. starts an aiosmtpd server that appends ``<Message-ID> <envelope recipient>``
   to a file for every message it accepts; a seeded set of recipients is always
   refused with 550, a seeded fraction of "flaky" recipients is answered 451 on
   their first one or two tries (at RCPT or at DATA); armed by the faults
   ``stall`` and ``cut``, it leaves a message's final dot unanswered past the
   workers' SEND_TIMEOUT, or records it and cuts the connection;
2. creates the database (``migrate``) and enqueues N deliveries with
   ``outbox.enqueue_email`` (every ``--hostile-every``-th recipient a long IDN
   domain, mixed case or a display name) in many transactions, some of them rolled back on
   purpose (whole transactions and savepoints): those must never arrive;
3. runs K ``outbox_worker`` processes (``--concurrency`` values mixed) and
   ``outbox_sweep --loop 1`` (restarted whenever it dies);
4. plays a seeded schedule of events: SIGKILL a worker at a random moment and
   start a new one; SIGSTOP a worker until the sweeper has declared it dead,
   then SIGCONT it; stop redis-server, enqueue while it is down, start it empty;
   start a worker that stops itself right after the SMTP server accepted a
   message (OUTBOX_FAULT_POINT=after_send) and SIGKILL it there ("kills in the
   window"); the same, but terminate every backend of the database
   (pg_terminate_backend) so that its "mark sent" write is refused, then
   SIGCONT it; SIGKILL a worker mid-send and restart it at once under the
   same ``--worker-id``; start a worker whose clock is 90 s behind
   (faketime); enqueue from a web host whose clock is 120 s behind and whose
   Redis is unreachable (faketime; its rows must be tried within seconds);
   stall or cut the SMTP answer to a message's final dot; lose
   the reply to a proxied worker's claim, step or push and cut that
   connection, refuse its connections to Redis or PostgreSQL for a few
   seconds (network.py: some workers reach their servers through fault
   proxies); SIGSTOP a worker whose step waits on a row lock the harness
   holds; SIGTERM a worker while the SMTP server holds its reply past the
   heartbeat timeout (see faults/, expectations.py and expectations_net.py
   for what each must lead to);
5. drains: waits (``--time-limit``) until every row is terminal, stops the
   workers and the sweeper with SIGTERM, and checks every row's receipts
   against its status and its Attempt log.

The rules (any violation makes the exit status 1): nothing lost (no row left
queued/processing, no row "sent" without a receipt, no receipt for an unknown
Message-ID), no rolled-back email arrives, no receipt for the wrong recipient;
under "review" no email arrives twice; under "requeue" the extra copies are no
more than the rows that a killed or stopped worker had in its send window, and
each duplicated row has a sweeper "requeued"/"abandoned" Attempt per extra copy.
Under both: no abandoned row is sent after it became abandoned, and every
abandoned row is truly in doubt (its worker was killed, stopped or cut off
by a network fault, or the SMTP server made its answer doubtful on purpose).
A worker that exits on its own counts as a violation too.

The table goes to stdout and to ``tests/chaos/results/latest-<policy>.txt``; worker,
sweeper and SMTP logs stay in ``tests/chaos/results/logs-<policy>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.chaos.child import Child
from tests.chaos.config import POLICIES, RESULTS_DIR, ROOT, Config
from tests.chaos.report import format_table

__all__ = ["Config", "main", "run_chaos"]


def run_chaos(config: Config) -> dict[str, Any]:
    """Run one policy in a fresh child process; return its result (with ``table``).

    Also writes the table to ``<results_dir>/latest-<policy>.txt``. Raises
    RuntimeError if the child produced no result at all.
    """
    results = Path(config.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="outbox-chaos-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        out_path = Path(tmp) / "result.json"
        cfg_path.write_text(json.dumps(asdict(config)))
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.run", "--child", str(cfg_path), str(out_path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        # A safety net only: every step of the child has its own deadline.
        limit = config.time_limit + 600 + 60 * config.events() + config.deliveries / 10
        try:
            code = proc.wait(timeout=limit)
        except BaseException:
            proc.send_signal(signal.SIGTERM)  # the child stops what it started
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        if not out_path.exists():
            raise RuntimeError(f"the chaos run ({config.policy}) exited {code} without a result")
        result: dict[str, Any] = json.loads(out_path.read_text())
    result["table"] = format_table(result)
    (results / f"latest-{config.policy}.txt").write_text(result["table"] + "\n")
    return result


def child_main(cfg_path: str, out_path: str) -> int:
    config = Config(**json.loads(Path(cfg_path).read_text()))

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    child = Child(config)
    result: dict[str, Any] | None = None
    try:
        result = child.run()
        Path(out_path).write_text(json.dumps(result))
    finally:
        keep = config.keep_db or result is None or not result["ok"]
        child.cleanup(keep_db=keep)
        if keep and child.db_name:
            child.say(f"kept the database {child.db_name} for inspection")
    return 0 if result and result["ok"] else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = Config()
    p = argparse.ArgumentParser(
        prog="tests/chaos/run.sh",
        description="Chaos run of the outbox against real servers on loopback (see the docstring).",
    )
    p.add_argument("--policy", choices=[*POLICIES, "both"], default="both")
    p.add_argument("--deliveries", type=int, default=defaults.deliveries, metavar="N")
    p.add_argument("--workers", type=int, default=defaults.workers, metavar="K")
    p.add_argument(
        "--concurrency",
        default=",".join(map(str, defaults.concurrency)),
        help="--concurrency of the workers, cycled (default 1,2,4)",
    )
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument(
        "--time-limit",
        type=float,
        default=defaults.time_limit,
        metavar="SECONDS",
        help="how long the drain may take before the remaining rows count as lost",
    )
    p.add_argument(
        "--db", choices=["postgres", "sqlite"], default=os.environ.get("OUTBOX_TEST_DB", "postgres")
    )
    p.add_argument("--kills", type=int, default=defaults.random_kills, help="random SIGKILLs")
    p.add_argument("--stops", type=int, default=defaults.stops, help="SIGSTOP/SIGCONT events")
    p.add_argument("--window-kills", type=int, default=defaults.window_kills)
    p.add_argument("--db-refusals", type=int, default=defaults.db_refusals)
    p.add_argument("--redis-wipes", type=int, default=defaults.redis_wipes)
    p.add_argument(
        "--restarts", type=int, default=defaults.restarts, help="restarts under a reused id"
    )
    p.add_argument("--skews", type=int, default=defaults.skews, help="workers 90 s behind")
    p.add_argument(
        "--slow-web-hosts",
        type=int,
        default=defaults.slow_web_hosts,
        help="enqueues 120 s behind whose pushes fail",
    )
    p.add_argument("--stalls", type=int, default=defaults.stalls, help="SMTP stalls after DATA")
    p.add_argument("--cuts", type=int, default=defaults.cuts, help="SMTP cuts after DATA")
    add_network_args(p, defaults)
    p.add_argument("--send-timeout", type=float, default=defaults.send_timeout, metavar="SECONDS")
    p.add_argument("--rollback-fraction", type=float, default=defaults.rollback_fraction)
    p.add_argument("--transient-fraction", type=float, default=defaults.transient_fraction)
    p.add_argument("--permanent-fraction", type=float, default=defaults.permanent_fraction)
    p.add_argument(
        "--hostile-every",
        type=int,
        default=defaults.hostile_every,
        metavar="N",
        help="every N-th recipient is an IDN, mixed-case or display-name address (0: none)",
    )
    p.add_argument("--smtp-delay", type=float, default=defaults.smtp_delay, metavar="SECONDS")
    p.add_argument("--results-dir", default=str(RESULTS_DIR))
    p.add_argument("--keep-db", action="store_true", help="keep the databases after a pass too")
    return p.parse_args(argv)


def add_network_args(p: argparse.ArgumentParser, defaults: Config) -> None:
    """The counts of the network and signal faults (faults/lost_reply.py, outage.py, ...)."""
    p.add_argument("--lost-claims", type=int, default=defaults.lost_claims)
    p.add_argument("--lost-steps", type=int, default=defaults.lost_steps)
    p.add_argument("--lost-pushes", type=int, default=defaults.lost_pushes)
    p.add_argument("--redis-outages", type=int, default=defaults.redis_outages)
    p.add_argument("--pg-outages", type=int, default=defaults.pg_outages)
    p.add_argument(
        "--lock-stops", type=int, default=defaults.lock_stops, help="SIGSTOP on a row lock"
    )
    p.add_argument(
        "--long-sends", type=int, default=defaults.long_sends, help="SIGTERM in a long send"
    )
    p.add_argument(
        "--proxied-workers",
        type=int,
        default=defaults.proxied_workers,
        help="workers behind the fault proxies",
    )


def config_from_args(args: argparse.Namespace, policy: str) -> Config:
    return Config(
        policy=policy,
        deliveries=args.deliveries,
        workers=args.workers,
        concurrency=[int(x) for x in args.concurrency.split(",") if x.strip()],
        seed=args.seed,
        db=args.db,
        time_limit=args.time_limit,
        random_kills=args.kills,
        stops=args.stops,
        window_kills=args.window_kills,
        db_refusals=args.db_refusals,
        redis_wipes=args.redis_wipes,
        restarts=args.restarts,
        skews=args.skews,
        slow_web_hosts=args.slow_web_hosts,
        stalls=args.stalls,
        cuts=args.cuts,
        lost_claims=args.lost_claims,
        lost_steps=args.lost_steps,
        lost_pushes=args.lost_pushes,
        redis_outages=args.redis_outages,
        pg_outages=args.pg_outages,
        lock_stops=args.lock_stops,
        long_sends=args.long_sends,
        proxied_workers=args.proxied_workers,
        send_timeout=args.send_timeout,
        rollback_fraction=args.rollback_fraction,
        transient_fraction=args.transient_fraction,
        permanent_fraction=args.permanent_fraction,
        hostile_every=args.hostile_every,
        smtp_delay=args.smtp_delay,
        results_dir=args.results_dir,
        keep_db=args.keep_db,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[2])
    args = parse_args(argv)
    policies = POLICIES if args.policy == "both" else (args.policy,)
    ok = True
    for policy in policies:
        result = run_chaos(config_from_args(args, policy))
        print("\n" + result["table"] + "\n", flush=True)
        ok = ok and result["ok"]
    print(f"chaos run: {'PASS' if ok else 'FAIL'} ({', '.join(policies)})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
