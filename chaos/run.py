"""The chaos run (issue 5): real workers, real servers, real kills; then count every email.

    scripts/chaos.sh --deliveries 5000 --policy both     # starts a throwaway PostgreSQL
    python chaos/run.py --db sqlite --deliveries 500     # SQLite: no "refuse mark sent" step

Each policy runs in a fresh child process (``python -m chaos.run --child``) with
its own database (``chaos_<policy>_<random>`` on the PostgreSQL server named by
OUTBOX_TEST_PG_HOST/PORT/USER, or a SQLite file), its own redis-server and its
own SMTP server, all on 127.0.0.1 and free ports, everything started stopped by
pid. The child:

1. starts an aiosmtpd server that appends ``<Message-ID> <envelope recipient>``
   to a file for every message it accepts; a seeded set of recipients is always
   refused with 550, a seeded fraction of "flaky" recipients is answered 451 on
   their first one or two tries (at RCPT or at DATA);
2. creates the database (``migrate``) and enqueues N deliveries with
   ``outbox.enqueue_email`` in many transactions, some of them rolled back on
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
   SIGCONT it;
5. drains: waits (``--time-limit``) until every row is terminal, stops the
   workers and the sweeper with SIGTERM, and checks every row's receipts
   against its status and its Attempt log.

The rules (any violation makes the exit status 1): nothing lost (no row left
queued/processing, no row "sent" without a receipt, no receipt for an unknown
Message-ID), no rolled-back email arrives, no receipt for the wrong recipient;
under "review" no email arrives twice; under "requeue" the extra copies are no
more than the rows that a killed or stopped worker had in its send window, and
each duplicated row has a sweeper "requeued"/"abandoned" Attempt per extra copy.
A worker that exits on its own counts as a violation too.

The table goes to stdout and to ``chaos/results/latest-<policy>.txt``; worker,
sweeper and SMTP logs stay in ``chaos/results/logs-<policy>/``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS_DIR = ROOT / "chaos" / "results"
POLICIES = ("review", "requeue")
LIVE = ("queued", "processing")
TERMINAL = ("sent", "failed", "abandoned", "cancelled")


# Every count of the result (present, 0 when nothing happened).
COUNT_KEYS = (
    "enqueued",
    "rolled back",
    "rows",
    "delivered once",
    "delivered twice or more",
    "extra copies",
    "unexplained duplicates",
    "lost",
    "not terminal",
    "sent without receipt",
    "unknown receipts",
    "rolled-back arrived",
    "misaddressed",
    "sent",
    "failed",
    "failed permanent",
    "failed but arrived",
    "failed arrived unexplained",
    "abandoned",
    "abandoned arrived",
    "abandoned not arrived",
    "cancelled",
    "queued",
    "processing",
    "permanent recipient arrived",
    "window hits",
    "sweeper acted on undisturbed worker",
    "refusals confirmed",
)


class HarnessError(Exception):
    """A chaos step could not be carried out (not by itself a product bug)."""


# -- configuration -----------------------------------------------------------------


@dataclass
class Config:
    policy: str = "review"
    deliveries: int = 5000
    workers: int = 4
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4])
    seed: int = 1
    db: str = "postgres"
    time_limit: float = 300.0  # seconds the drain may take
    random_kills: int = 4  # SIGKILL at a random moment, replaced
    stops: int = 2  # SIGSTOP past the heartbeat timeout, then SIGCONT
    window_kills: int = 3  # SIGKILL right after the SMTP server accepted
    db_refusals: int = 2  # "mark sent" refused: backends terminated (PostgreSQL)
    redis_wipes: int = 1
    rollback_fraction: float = 0.1
    transient_fraction: float = 0.05  # flaky recipients: 451 on their first 1-2 tries
    permanent_fraction: float = 0.01  # recipients refused with 550
    smtp_delay: float = 0.01  # mean seconds before the server answers DATA
    batches: int = 0  # enqueue transactions groups; 0: automatic
    heartbeat_timeout: float = 3.0
    heartbeat_interval: float = 0.5
    results_dir: str = str(RESULTS_DIR)
    keep_db: bool = False

    def events(self) -> int:
        return (
            self.random_kills + self.stops + self.window_kills + self.db_refusals + self.redis_wipes
        )


# -- the parent: one child process per policy --------------------------------------------


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
            [sys.executable, "-m", "chaos.run", "--child", str(cfg_path), str(out_path)],
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


# -- the SMTP server ----------------------------------------------------------------------


def _fraction(*parts: Any) -> float:
    """A seeded, reproducible number in [0, 1) for the given parts."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


class ChaosSMTPHandler:
    """aiosmtpd handler: record accepted messages, refuse some, defer some."""

    def __init__(
        self,
        path: Path,
        *,
        seed: int,
        permanent: set[str],
        transient_fraction: float,
        delay: float,
    ) -> None:
        self.file = path.open("a", buffering=1, encoding="utf-8")
        self.seed = seed
        self.permanent = permanent
        self.transient_fraction = transient_fraction
        self.delay = delay
        self.tries: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()

    def _deferral(self, address: str, attempt: int) -> str | None:
        """'rcpt' or 'data' when this try of a flaky recipient gets a 451."""
        if _fraction(self.seed, "flaky", address) >= self.transient_fraction:
            return None
        deferred_tries = 1 + int(_fraction(self.seed, "tries", address) * 2)
        if attempt >= deferred_tries:
            return None
        return "rcpt" if _fraction(self.seed, "where", address, attempt) < 0.5 else "data"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address in self.permanent:
            self.answers["550 at RCPT"] += 1
            return f"550 5.1.1 <{address}>: no such user (chaos)"
        attempt = self.tries[address]
        self.tries[address] += 1
        where = self._deferral(address, attempt)
        if where == "rcpt":
            self.answers["451 at RCPT"] += 1
            return "451 4.3.0 try again later (chaos)"
        envelope.rcpt_tos.append(address)
        if where == "data":
            envelope.chaos_defer = True
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        head = re.split(rb"\r?\n\r?\n", raw, maxsplit=1)[0]
        found = MESSAGE_ID.search(head)
        message_id = found.group(1).decode("ascii", "replace") if found else "<none>"
        if self.delay:
            await asyncio.sleep(self.delay * 2 * _fraction(self.seed, "delay", message_id))
        if getattr(envelope, "chaos_defer", False):
            self.answers["451 at DATA"] += 1
            return "451 4.3.0 queue full, try again later (chaos)"
        for rcpt in envelope.rcpt_tos:
            self.file.write(f"{message_id} {rcpt}\n")
        self.answers["250 accepted"] += 1
        return "250 2.0.0 accepted (chaos)"

    def close(self) -> None:
        self.file.close()


# -- the enqueue plan ---------------------------------------------------------------------


@dataclass
class Txn:
    """One transaction of enqueue_email calls (recipients per call)."""

    kind: str  # "commit", "rollback" (the whole transaction) or "savepoint"
    calls: list[list[str]]
    rolled_back_calls: list[list[str]] = field(default_factory=list)  # inside the savepoint


def make_plan(config: Config, rng: random.Random) -> tuple[list[list[Txn]], set[str]]:
    """Batches of transactions holding exactly ``config.deliveries`` committed deliveries."""
    counter = iter(range(1, 10**9))
    permanent: set[str] = set()

    def calls(total: int) -> list[list[str]]:
        out = []
        while total > 0:
            size = min(total, rng.choice((1, 1, 1, 2, 3)))
            recipients = []
            for _ in range(size):
                n = next(counter)
                if rng.random() < config.permanent_fraction:
                    address = f"bounce{n}@example.net"
                    permanent.add(address)
                else:
                    address = f"user{n}@example.com"
                recipients.append(address)
            out.append(recipients)
            total -= size
        return out

    n_batches = config.batches or max(20, 3 * config.events(), config.deliveries // 250)
    n_batches = max(1, min(n_batches, config.deliveries))
    base, extra = divmod(config.deliveries, n_batches)
    plan: list[list[Txn]] = []
    for index in range(n_batches):
        size = base + (1 if index < extra else 0)
        parts = rng.randint(1, 3) if size >= 3 else 1
        cuts = sorted(rng.sample(range(1, size), parts - 1)) if parts > 1 else []
        bounds = [0, *cuts, size]
        batch = []
        for a, b in itertools.pairwise(bounds):
            txn = Txn("commit", calls(b - a))
            if rng.random() < config.rollback_fraction:
                doomed = calls(max(1, b - a))
                if rng.random() < 0.5:
                    batch.append(Txn("rollback", doomed))
                else:
                    txn = Txn("savepoint", txn.calls, doomed)
            batch.append(txn)
        rng.shuffle(batch)
        plan.append(batch)
    # At least one rolled-back transaction and one rolled-back savepoint, whatever the seed.
    kinds = {txn.kind for batch in plan for txn in batch}
    if "rollback" not in kinds:
        plan[0].insert(0, Txn("rollback", calls(3)))
    if "savepoint" not in kinds:
        plan[-1].append(Txn("savepoint", [], calls(2)))
    return plan, permanent


# -- processes ----------------------------------------------------------------------------


def process_state(pid: int) -> str:
    """The kernel's state letter for the process (T = stopped), or 'gone'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "gone"


def pid_of(worker_id: str) -> int | None:
    """Worker ids are ``host:pid:suffix`` (outbox.worker.default_worker_id)."""
    parts = worker_id.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return int(parts[1])
    return None


@dataclass
class Proc:
    name: str
    role: str  # "worker", "window" (killed after_send), "refuse" (DB refuses mark sent), "sweeper"
    proc: subprocess.Popen[bytes]
    log: Path
    concurrency: int = 1
    expected_exit: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid


class Child:
    """Everything one policy's run starts, does and checks (runs in the child process)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rng = random.Random(f"{config.seed}:{config.policy}")
        self.t0 = time.monotonic()
        self.logs = Path(config.results_dir) / f"logs-{config.policy}"
        self.redis_server: Any = None
        self._redis: Any = None
        self.smtp_port = 0
        self.batch_size = 1
        self.controller: Any = None
        self.smtp: ChaosSMTPHandler | None = None
        self.receipts_path = self.logs / "smtp-receipts.txt"
        self.db_name = ""
        self.db_created = False
        self.sqlite_dir: str | None = None
        self.env: dict[str, str] = {}
        self.procs: list[Proc] = []
        self.sweeper: Proc | None = None
        self.sweeper_restarts: list[str] = []
        self.unexpected_exits: list[str] = []
        self.worker_serial = 0
        self.plan: deque[list[Txn]] = deque()
        self.permanent: set[str] = set()
        self.committed: dict[str, str] = {}  # Message-ID -> recipient
        self.rolled_back: dict[str, str] = {}
        self.events: list[str] = []
        self.counts: Counter[str] = Counter()
        self.disturbed: dict[int, str] = {}  # pid -> how (kill, stop, window)
        self.window_rows: list[int] = []
        self.refused_rows: list[tuple[int, int, Path]] = []  # row, worker pid, its log
        self.violations: list[str] = []
        self.details: list[str] = []
        self.timings: dict[str, float] = {}

    # -- small helpers -----------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"[{self.config.policy} {time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def event(self, message: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:6.1f}s {message}")
        self.say(message)

    def wait_for(
        self, condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
    ) -> Any:
        """Poll ``condition`` (keeping the sweeper and workers up) until true or the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}")
            self.tick()
            time.sleep(interval)

    def pause(self, seconds: float) -> None:
        """The schedule's gap between two events (the sweeper and workers kept up)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.tick()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # -- servers -------------------------------------------------------------------

    def start_servers(self) -> None:
        from aiosmtpd.controller import Controller

        from tests.servers import RedisServer, free_port

        self.redis_server = RedisServer().start()
        self.say(f"redis-server on 127.0.0.1:{self.redis_server.port}")
        self.smtp = ChaosSMTPHandler(
            self.receipts_path,
            seed=self.config.seed,
            permanent=self.permanent,
            transient_fraction=self.config.transient_fraction,
            delay=self.config.smtp_delay,
        )
        port = free_port()
        self.controller = Controller(self.smtp, hostname="127.0.0.1", port=port)
        self.controller.start()
        self.smtp_port = port
        self.say(f"SMTP server on 127.0.0.1:{port}, receipts in {self.receipts_path}")

    def redis_client(self) -> Any:
        """The harness's own client of the run's redis-server (it reconnects after a restart)."""
        if self._redis is None:
            import redis

            self._redis = redis.Redis(
                host="127.0.0.1", port=self.redis_server.port, socket_timeout=5
            )
        return self._redis

    def create_database(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        if self.config.db == "postgres":
            import psycopg

            self.db_name = f"chaos_{self.config.policy}_{suffix}"
            with psycopg.connect(**self._pg_params("postgres"), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.db_name}"')
            self.db_created = True
        else:
            self.sqlite_dir = tempfile.mkdtemp(prefix="outbox-chaos-sqlite-")
            self.db_name = os.path.join(self.sqlite_dir, f"chaos_{self.config.policy}.sqlite3")
        self.say(f"database {self.db_name} ({self.config.db})")

    def _pg_params(self, dbname: str) -> dict[str, Any]:
        return {
            "host": os.environ.get("OUTBOX_TEST_PG_HOST", "127.0.0.1"),
            "port": int(os.environ.get("OUTBOX_TEST_PG_PORT", "5432")),
            "user": os.environ.get("OUTBOX_TEST_PG_USER", "postgres"),
            "dbname": dbname,
            "connect_timeout": 10,
        }

    def setup_django(self) -> None:
        self.env = {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "OUTBOX_TEST_DB": self.config.db,
            "OUTBOX_TEST_DB_NAME": self.db_name,
            "OUTBOX_TEST_REDIS_URL": self.redis_server.url,
            "OUTBOX_TEST_SMTP_PORT": str(self.smtp_port),
            "OUTBOX_TEST_ABANDONED_POLICY": self.config.policy,
            "OUTBOX_TEST_HEARTBEAT_TIMEOUT": str(self.config.heartbeat_timeout),
            "OUTBOX_TEST_HEARTBEAT_INTERVAL": str(self.config.heartbeat_interval),
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(self.env)
        for name in ("OUTBOX_FAULT_POINT", "OUTBOX_FAULT_COUNT"):
            os.environ.pop(name, None)
        import logging

        import django
        from django.core.management import call_command

        django.setup()
        # The harness enqueues while Redis is down on purpose: those warnings are expected.
        logging.getLogger("outbox").setLevel(logging.ERROR)
        call_command("migrate", verbosity=0, interactive=False)

    # -- processes -------------------------------------------------------------------

    def _spawn(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> Any:
        env = {**os.environ, **self.env, **(extra_env or {})}
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "django", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def start_worker(self, concurrency: int, role: str = "worker", fault: bool = False) -> Proc:
        self.worker_serial += 1
        name = f"{role}-{self.worker_serial}"
        log = self.logs / f"{name}.log"
        extra = {"OUTBOX_FAULT_POINT": "after_send", "OUTBOX_FAULT_COUNT": "1"} if fault else {}
        popen = self._spawn(
            ["outbox_worker", "--concurrency", str(concurrency), "--summary-interval", "10"],
            log,
            extra,
        )
        proc = Proc(name, role, popen, log, concurrency)
        self.procs.append(proc)
        self.counts["workers started"] += 1
        return proc

    def start_sweeper(self) -> None:
        log = self.logs / "sweeper.log"
        self.sweeper = Proc(
            "sweeper", "sweeper", self._spawn(["outbox_sweep", "--loop", "1"], log), log
        )

    def tick(self) -> None:
        """Restart the sweeper if it died; replace a worker that exited on its own."""
        if self.sweeper is not None and self.sweeper.proc.poll() is not None:
            code = self.sweeper.proc.returncode
            self.sweeper_restarts.append(
                f"exit {code} at {time.monotonic() - self.t0:.1f}s: " + _last_line(self.sweeper.log)
            )
            self.say(f"sweeper exited ({code}); restarting it")
            self.start_sweeper()
        for proc in list(self.procs):
            if proc.expected_exit or proc.proc.poll() is None:
                continue
            proc.expected_exit = True
            text = (
                f"{proc.name} (pid {proc.pid}) exited on its own with status "
                f"{proc.proc.returncode}; log {proc.log}: {_last_line(proc.log)}"
            )
            self.unexpected_exits.append(text)
            self.say("UNEXPECTED: " + text)
            if proc.role == "worker":
                self.start_worker(proc.concurrency)

    def live_workers(self) -> list[Proc]:
        return [
            p
            for p in self.procs
            if p.role == "worker"
            and not p.expected_exit
            and p.proc.poll() is None
            and process_state(p.pid) not in ("T", "gone")
        ]

    def registered(self, pid: int) -> bool:
        """Whether Redis lists a worker id of this pid as live or dead-not-yet-reaped."""
        from redis.exceptions import RedisError

        try:
            client = self.redis_client()
            members = client.zrange("{outbox}:workers", 0, -1) + client.zrange(
                "{outbox}:dead", 0, -1
            )
        except RedisError:
            return True
        return any(pid_of(m.decode()) == pid for m in members)

    def is_live(self, pid: int) -> bool:
        from redis.exceptions import RedisError

        try:
            members = self.redis_client().zrange("{outbox}:workers", 0, -1)
        except RedisError:
            return False
        return any(pid_of(m.decode()) == pid for m in members)

    # -- enqueueing ------------------------------------------------------------------------

    def enqueue_next(self) -> bool:
        """Run the next batch of the plan; False when the plan is used up."""
        if not self.plan:
            return False
        from django.db import transaction

        from outbox import enqueue_email

        class RollBack(Exception):
            pass

        def call(recipients: list[str], into: dict[str, str]) -> None:
            serial = len(self.committed) + len(self.rolled_back) + len(into)
            for delivery in enqueue_email(
                f"chaos {serial}", f"chaos run message {serial}\n", None, recipients
            ):
                into[delivery.message_id] = delivery.recipient

        for txn in self.plan.popleft():
            done: dict[str, str] = {}
            doomed: dict[str, str] = {}
            try:
                with transaction.atomic():
                    for recipients in txn.calls if txn.kind != "rollback" else []:
                        call(recipients, done)
                    if txn.kind == "savepoint":
                        try:
                            with transaction.atomic():
                                for recipients in txn.rolled_back_calls:
                                    call(recipients, doomed)
                                raise RollBack
                        except RollBack:
                            pass
                    if txn.kind == "rollback":
                        for recipients in txn.calls:
                            call(recipients, doomed)
                        raise RollBack
            except RollBack:
                pass
            self.committed.update(done)
            self.rolled_back.update(doomed)
        return True

    def queued_count(self) -> int:
        from outbox.models import Delivery

        return Delivery.objects.filter(status="queued").count()

    def ensure_work(self, minimum: int) -> None:
        if self.queued_count() < minimum:
            self.enqueue_next()

    # -- chaos events -------------------------------------------------------------------------

    def ev_kill(self) -> None:
        self.ensure_work(self.batch_size)
        victims = self.live_workers()
        if not victims:
            raise HarnessError("no running worker to kill")
        victim = self.rng.choice(victims)
        victim.expected_exit = True
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(timeout=30)
        self.disturbed[victim.pid] = "SIGKILL"
        self.counts["random SIGKILL"] += 1
        new = self.start_worker(victim.concurrency)
        self.event(f"SIGKILL {victim.name} (pid {victim.pid}); started {new.name} (pid {new.pid})")

    def ev_stop(self) -> None:
        self.ensure_work(self.batch_size)
        victims = self.live_workers()
        if not victims:
            raise HarnessError("no running worker to stop")
        victim = self.rng.choice(victims)
        stopped_at = time.monotonic()
        os.kill(victim.pid, signal.SIGSTOP)
        self.disturbed[victim.pid] = "SIGSTOP"
        self.counts["SIGSTOP"] += 1
        try:
            self.wait_for(lambda: process_state(victim.pid) == "T", 10, "the SIGSTOP")
            # Past the heartbeat timeout: until the sweeper declared it dead and (on
            # PostgreSQL) reaped it, settling the rows it had in its send window. On
            # SQLite a worker frozen inside a write transaction keeps the database
            # locked, so the reaping can only happen once it runs again.
            timeout = self.config.heartbeat_timeout
            settled = self.registered if self.config.db == "postgres" else self.is_live
            try:
                self.wait_for(
                    lambda: time.monotonic() - stopped_at > timeout and not settled(victim.pid),
                    4 * timeout + 30,
                    f"the sweeper to declare stopped {victim.name} (pid {victim.pid}) dead"
                    + (" and reap it" if self.config.db == "postgres" else ""),
                    interval=0.1,
                )
            except HarnessError:
                self.details.append(
                    f"while {victim.name} (pid {victim.pid}) was stopped, waited in vain for "
                    f"the sweeper; Redis live: {self.is_live(victim.pid)}, "
                    f"registered (live or dead, not reaped): {self.registered(victim.pid)}"
                )
                self.details.extend(self.db_activity())
                raise
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        self.event(
            f"SIGSTOP {victim.name} (pid {victim.pid}) for {time.monotonic() - stopped_at:.1f}s "
            f"(until declared dead{' and reaped' if self.config.db == 'postgres' else ''}), "
            "then SIGCONT"
        )

    def db_activity(self) -> list[str]:
        """What every other backend of the database is doing, and who blocks whom."""
        if self.config.db != "postgres":
            return []
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), "
                "now() - xact_start, left(regexp_replace(query, '\\s+', ' ', 'g'), 300) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() ORDER BY pid"
            )
            rows = cursor.fetchall()
        return [
            f"  pg backend {pid}: {state}, waiting {wtype}/{wevent}, blocked by {blockers}, "
            f"transaction age {age}, query: {query}"
            for pid, state, wtype, wevent, blockers, age, query in rows
        ]

    def ev_redis_wipe(self) -> None:
        self.redis_server.stop()
        self.enqueue_next()  # commits while Redis is down: the sweeper must mirror these
        self.redis_server.start()  # same port, no persistence: every key is gone
        self.counts["redis wipe"] += 1
        self.event("redis-server killed, one batch enqueued while it was down, restarted empty")

    def _stopped_after_send(self, role: str) -> tuple[Proc, int]:
        """Start a one-thread worker that SIGSTOPs itself after its first accepted send."""
        proc = self.start_worker(1, role=role, fault=True)
        self.wait_for(lambda: self.is_live(proc.pid), 60, f"{proc.name} to register")
        deadline = time.monotonic() + 90
        next_check = 0.0
        while process_state(proc.pid) != "T":
            if proc.proc.poll() is not None:
                proc.expected_exit = True
                raise HarnessError(f"{proc.name} exited ({proc.proc.returncode}) before its fault")
            now = time.monotonic()
            if now > deadline:
                raise HarnessError(f"{proc.name} never reached after_send")
            if now >= next_check:  # keep a little work queued for it to claim
                self.ensure_work(5)
                next_check = now + 0.3
            self.tick()
            time.sleep(0.02)
        from outbox.models import Delivery

        rows = [
            pk
            for pk, worker_id in Delivery.objects.filter(status="processing").values_list(
                "pk", "worker_id"
            )
            if pid_of(worker_id) == proc.pid
        ]
        if len(rows) != 1:
            raise HarnessError(f"{proc.name} stopped after_send holding rows {rows}, not one")
        return proc, rows[0]

    def ev_window_kill(self) -> None:
        proc, row = self._stopped_after_send("window")
        proc.expected_exit = True
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=30)
        self.disturbed[proc.pid] = "SIGKILL after_send"
        self.window_rows.append(row)
        self.counts["SIGKILL after_send"] += 1
        self.event(f"SIGKILL {proc.name} (pid {proc.pid}) after_send: row {row} in the window")

    def ev_db_refuse(self) -> None:
        from django.db import connection

        proc, row = self._stopped_after_send("refuse")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            terminated = sum(1 for (ok,) in cursor.fetchall() if ok)
        os.kill(proc.pid, signal.SIGCONT)
        self.counts["db refusals"] += 1
        self.counts["backends terminated"] += terminated
        self.refused_rows.append((row, proc.pid, proc.log))
        from outbox.models import Delivery

        self.wait_for(
            lambda: Delivery.objects.filter(pk=row).exclude(status="processing").exists(),
            30,
            f"row {row} to be settled after the refused write",
        )
        proc.expected_exit = True
        proc.proc.send_signal(signal.SIGTERM)
        try:
            code = proc.proc.wait(timeout=90)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"{proc.name} did not stop on SIGTERM") from exc
        if code != 0:
            self.unexpected_exits.append(f"{proc.name} (pid {proc.pid}) exited {code} on SIGTERM")
        self.event(
            f"{proc.name} (pid {proc.pid}) stopped after_send on row {row}; terminated "
            f"{terminated} backends of the database; SIGCONT; row settled; SIGTERM -> {code}"
        )

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        config = self.config
        if config.db != "postgres" and config.db_refusals:
            self.say("SQLite: no 'refuse mark sent' step (it needs pg_terminate_backend)")
            config.db_refusals = 0
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        plan, self.permanent = make_plan(config, self.rng)
        self.plan = deque(plan)
        self.batch_size = max(1, config.deliveries // len(plan))
        self.start_servers()
        self.create_database()
        self.setup_django()

        started = time.monotonic()
        for _ in range(max(1, round(len(plan) * 0.3))):
            self.enqueue_next()
        self.say(f"enqueued {len(self.committed)} (rolled back {len(self.rolled_back)}) so far")
        self.start_sweeper()
        mix = config.concurrency or [1]
        for index in range(config.workers):
            self.start_worker(mix[index % len(mix)])
        self.say(
            f"{config.workers} workers (concurrency {[p.concurrency for p in self.procs]}), "
            "sweeper --loop 1"
        )

        schedule = (
            ["kill"] * config.random_kills
            + ["stop"] * config.stops
            + ["window"] * config.window_kills
            + ["refuse"] * config.db_refusals
            + ["redis"] * config.redis_wipes
        )
        self.rng.shuffle(schedule)
        self.say("schedule: " + ", ".join(schedule))
        actions = {
            "kill": self.ev_kill,
            "stop": self.ev_stop,
            "window": self.ev_window_kill,
            "refuse": self.ev_db_refuse,
            "redis": self.ev_redis_wipe,
        }
        for name in schedule:
            self.pause(self.rng.uniform(0.2, 1.0))
            self.ensure_work(self.batch_size)
            try:
                actions[name]()
            except HarnessError as exc:
                self.violations.append(f"chaos step {name!r} could not be carried out: {exc}")
                self.event(f"{name}: FAILED: {exc}")
        while self.enqueue_next():
            self.tick()
        self.timings["enqueue and chaos"] = time.monotonic() - started
        self.say(f"schedule done; all {len(self.committed)} deliveries enqueued; draining")

        drained = time.monotonic()
        self.drain()
        self.timings["drain"] = time.monotonic() - drained
        self.stop_processes()
        self.controller.stop()
        self.controller = None
        self.smtp.close()
        result = self.analyze()
        self.timings["total"] = time.monotonic() - self.t0
        result["timings"] = self.timings
        return result

    def drain(self) -> None:
        from outbox.models import Delivery

        deadline = time.monotonic() + self.config.time_limit
        last_report = 0.0
        while True:
            self.tick()
            live = Delivery.objects.filter(status__in=LIVE).count()
            if live == 0:
                self.say("every row is terminal")
                return
            now = time.monotonic()
            if now >= deadline:
                self.say(f"time limit: {live} rows still queued/processing")
                self.counts["drain timed out"] = 1
                return
            if now - last_report >= 5:
                self.say(f"draining: {live} rows queued/processing")
                last_report = now
            time.sleep(0.25)

    def stop_processes(self) -> None:
        """SIGTERM every worker (they finish the message in hand), then the sweeper."""
        running = [p for p in self.procs if p.proc.poll() is None]
        for proc in running:
            os.kill(proc.pid, signal.SIGCONT)
            proc.proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                code = proc.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.proc.kill()
                code = proc.proc.wait()
                self.unexpected_exits.append(f"{proc.name} did not stop within 90s of SIGTERM")
            if code != 0 and not proc.expected_exit:
                self.unexpected_exits.append(
                    f"{proc.name} (pid {proc.pid}) exited {code} on SIGTERM"
                )
            proc.expected_exit = True
        if self.sweeper is not None:
            self.sweeper.proc.send_signal(signal.SIGTERM)
            try:
                self.sweeper.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.sweeper.proc.kill()
                self.sweeper.proc.wait()
            self.sweeper = None

    # -- the checks --------------------------------------------------------------------------

    def analyze(self) -> dict[str, Any]:
        from outbox.models import Attempt, Delivery

        config = self.config
        receipts: list[tuple[str, str]] = []
        for line in self.receipts_path.read_text(encoding="utf-8").splitlines():
            message_id, _, rcpt = line.partition(" ")
            receipts.append((message_id, rcpt))
        copies = Counter(message_id for message_id, _ in receipts)
        rows = {
            message_id: (pk, recipient, status, attempts)
            for pk, message_id, recipient, status, attempts in Delivery.objects.values_list(
                "pk", "message_id", "recipient", "status", "attempts"
            )
        }
        by_pk = {row[0]: (message_id, *row[1:]) for message_id, row in rows.items()}
        sweeper_acts: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for delivery_id, outcome, worker_id in Attempt.objects.filter(actor="sweeper").values_list(
            "delivery_id", "outcome", "worker_id"
        ):
            sweeper_acts[delivery_id].append((outcome, worker_id))

        c: Counter[str] = Counter({key: 0 for key in COUNT_KEYS})
        c["enqueued"] = len(self.committed)
        c["rolled back"] = len(self.rolled_back)
        c["rows"] = len(rows)
        problem_rows: dict[str, list[int]] = defaultdict(list)

        # Every committed delivery is a row, and no rolled-back one is.
        missing = set(self.committed) - set(rows)
        extra = set(rows) - set(self.committed)
        if missing:
            self.violations.append(f"{len(missing)} committed deliveries have no row")
        if extra:
            self.violations.append(f"{len(extra)} rows the harness did not commit (rolled back?)")

        for message_id, rcpt in receipts:
            row = rows.get(message_id)
            if row is None:
                if message_id in self.rolled_back:
                    c["rolled-back arrived"] += 1
                else:
                    c["unknown receipts"] += 1
                    self.details.append(f"receipt for unknown Message-ID {message_id} to {rcpt}")
            elif rcpt != row[1]:
                c["misaddressed"] += 1
                self.details.append(f"row {row[0]}: receipt to {rcpt}, row is for {row[1]}")

        for message_id, (pk, recipient, status, _attempts) in rows.items():
            n = copies.get(message_id, 0)
            c[status] += 1
            if n == 1:
                c["delivered once"] += 1
            elif n >= 2:
                c["delivered twice or more"] += 1
                c["extra copies"] += n - 1
                problem_rows["duplicate"].append(pk)
                explained = [
                    a for a in sweeper_acts.get(pk, []) if a[0] in ("requeued", "abandoned")
                ]
                if len(explained) < n - 1:
                    c["unexplained duplicates"] += 1
                    problem_rows["unexplained duplicate"].append(pk)
            if status in LIVE:
                c["not terminal"] += 1
                problem_rows["not terminal"].append(pk)
            elif status == "sent" and n == 0:
                c["sent without receipt"] += 1
                problem_rows["sent without receipt"].append(pk)
            elif status == "failed":
                if recipient in self.permanent:
                    c["failed permanent"] += 1
                if n:
                    c["failed but arrived"] += 1
                    if not sweeper_acts.get(pk):
                        c["failed arrived unexplained"] += 1
                        problem_rows["failed but arrived, no sweeper action"].append(pk)
            elif status == "abandoned":
                c["abandoned arrived" if n else "abandoned not arrived"] += 1
            if recipient in self.permanent and n:
                c["permanent recipient arrived"] += 1
                problem_rows["refused recipient arrived"].append(pk)

        # Rows a killed or stopped worker had in its send window: the sweeper settled them.
        window_hits = 0
        for pk, acts in sweeper_acts.items():
            for outcome, worker_id in acts:
                if outcome not in ("requeued", "abandoned", "failed"):
                    continue
                pid = pid_of(worker_id)
                if pid in self.disturbed:
                    window_hits += 1
                else:
                    c["sweeper acted on undisturbed worker"] += 1
                    self.details.append(
                        f"row {pk}: sweeper {outcome} it from worker {worker_id!r}, which the "
                        "harness did not kill or stop"
                    )
        c["window hits"] = window_hits

        # The documented outcome of each SIGKILL after_send.
        for pk in self.window_rows:
            message_id, _recipient, status, _a = by_pk[pk]
            n = copies.get(message_id, 0)
            ok = (
                (status == "abandoned" and n == 1)
                if config.policy == "review"
                else (status in ("sent", "failed") and n >= 2)
            )
            if not ok:
                problem_rows["after_send kill not as documented"].append(pk)
        # The refused "mark sent": retried, the row sent once, the refusal in the worker log.
        for pk, _pid, log in self.refused_rows:
            message_id, _recipient, status, _a = by_pk[pk]
            n = copies.get(message_id, 0)
            text = log.read_text(errors="replace")
            if f"database error recording delivery {pk} as sent" in text:
                c["refusals confirmed"] += 1
            else:
                problem_rows["refused write not seen in the worker log"].append(pk)
            if not (status == "sent" and n == 1):
                problem_rows["refused mark sent not recovered"].append(pk)

        lost = c["not terminal"] + c["sent without receipt"] + c["unknown receipts"]
        c["lost"] = lost + c["rolled-back arrived"]
        v = self.violations
        if lost:
            v.append(
                f"{lost} emails lost ({c['not terminal']} not terminal, {c['sent without receipt']} "
                f"sent without receipt, {c['unknown receipts']} receipts for unknown Message-IDs)"
            )
        if c["rolled-back arrived"]:
            v.append(f"{c['rolled-back arrived']} rolled-back emails arrived")
        if c["misaddressed"]:
            v.append(f"{c['misaddressed']} receipts went to the wrong recipient")
        if c["permanent recipient arrived"]:
            v.append(f"{c['permanent recipient arrived']} emails to a 550 recipient arrived")
        if config.policy == "review" and c["delivered twice or more"]:
            v.append(f"review policy: {c['delivered twice or more']} emails arrived twice or more")
        if config.policy == "requeue":
            if c["extra copies"] > window_hits:
                v.append(
                    f"requeue policy: {c['extra copies']} extra copies, more than the "
                    f"{window_hits} rows killed/stopped workers had in their send window"
                )
            if c["unexplained duplicates"]:
                v.append(
                    f"requeue policy: {c['unexplained duplicates']} duplicated rows without a "
                    "sweeper requeued/abandoned Attempt per extra copy"
                )
        if c["failed arrived unexplained"]:
            v.append(f"{c['failed arrived unexplained']} failed rows arrived, no sweeper action")
        if c["sweeper acted on undisturbed worker"]:
            v.append(
                f"the sweeper settled {c['sweeper acted on undisturbed worker']} rows of workers "
                "the harness did not kill or stop"
            )
        for what in (
            "after_send kill not as documented",
            "refused write not seen in the worker log",
            "refused mark sent not recovered",
        ):
            if problem_rows.get(what):
                v.append(f"{what}: rows {problem_rows[what]}")
        if self.unexpected_exits:
            v.append(f"{len(self.unexpected_exits)} worker processes exited on their own")
            self.details.extend(self.unexpected_exits)

        self.details.extend(self.row_details(problem_rows, copies))
        counts = {key: c[key] for key in COUNT_KEYS} | dict(c)
        counts.update(
            {
                "random SIGKILL": self.counts["random SIGKILL"],
                "SIGSTOP": self.counts["SIGSTOP"],
                "SIGKILL after_send": self.counts["SIGKILL after_send"],
                "db refusals": self.counts["db refusals"],
                "backends terminated": self.counts["backends terminated"],
                "redis wipe": self.counts["redis wipe"],
                "workers started": self.counts["workers started"],
                "sweeper restarts": len(self.sweeper_restarts),
                "unexpected exits": len(self.unexpected_exits),
                "drain timed out": self.counts["drain timed out"],
            }
        )
        smtp_answers = dict(self.smtp.answers) if self.smtp else {}
        return {
            "policy": config.policy,
            "config": asdict(config),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "database": self.db_name,
            "counts": counts,
            "smtp": smtp_answers,
            "events": self.events,
            "sweeper_restarts": self.sweeper_restarts,
            "violations": self.violations,
            "details": self.details,
            "logs": str(self.logs),
            "ok": not self.violations,
        }

    def row_details(self, problem_rows: dict[str, list[int]], copies: Counter[str]) -> list[str]:
        """The Attempt log (and for live rows, where Redis holds the id) of problem rows."""
        from outbox.models import Attempt, Delivery

        out = []
        for what, pks in problem_rows.items():
            if what == "duplicate" and self.config.policy == "requeue":
                pks = pks[:5]  # expected under requeue: a few examples are enough
            for pk in pks[:20]:
                row = Delivery.objects.get(pk=pk)
                out.append(
                    f"[{what}] row {pk} {row.recipient} {row.message_id}: status {row.status}, "
                    f"attempts {row.attempts}/{row.max_attempts}, worker {row.worker_id!r}, "
                    f"receipts {copies.get(row.message_id, 0)}, updated {row.updated_at:%H:%M:%S.%f}"
                    + (f", redis: {self.where_in_redis(pk)}" if row.status in LIVE else "")
                )
                for a in Attempt.objects.filter(delivery_id=pk).order_by("id"):
                    out.append(
                        f"    attempt #{a.number} {a.outcome} by {a.actor or '-'} worker "
                        f"{a.worker_id!r} started {a.started_at:%H:%M:%S.%f} "
                        f"{(a.error or '')[:150]}"
                    )
            if len(pks) > 20:
                out.append(f"[{what}] ... and {len(pks) - 20} more rows")
        return out

    def where_in_redis(self, pk: int) -> str:
        from redis.exceptions import RedisError

        try:
            client = self.redis_client()
            found = []
            for key in client.scan_iter(match="{outbox}:*"):
                kind = client.type(key).decode()
                member = str(pk)
                if kind == "list":
                    held = client.lpos(key, member) is not None
                elif kind == "set":
                    held = bool(client.sismember(key, member))
                elif kind == "zset":
                    held = any(
                        m.decode().split(":")[0] == member for m in client.zrange(key, 0, -1)
                    )
                else:
                    held = False
                if held:
                    found.append(key.decode())
            return ", ".join(found) or "nowhere"
        except RedisError as exc:
            return f"unknown ({exc})"

    # -- cleanup ------------------------------------------------------------------------------

    def cleanup(self, keep_db: bool) -> None:
        for proc in [*self.procs, *([self.sweeper] if self.sweeper else [])]:
            if proc.proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.proc.kill()
                except ProcessLookupError:
                    pass
            try:
                proc.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.controller is not None:
            self.controller.stop()
        if self.redis_server is not None:
            self.redis_server.close()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django may never have been set up
            pass
        if self.db_created and not keep_db:
            import psycopg

            with psycopg.connect(**self._pg_params("postgres"), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        if self.sqlite_dir and not keep_db:
            shutil.rmtree(self.sqlite_dir, ignore_errors=True)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return ""
    return lines[-1][:300] if lines else ""


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


# -- the table ------------------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    c = Counter(result["counts"])
    cfg = result["config"]
    smtp = Counter(result.get("smtp", {}))
    t = result.get("timings", {})
    review = cfg["policy"] == "review"
    rows: list[tuple[str, Any]] = [
        ("enqueued (committed deliveries)", c["enqueued"]),
        ("rolled back on purpose (must never arrive)", c["rolled back"]),
        ("delivered once", c["delivered once"]),
        (
            "delivered twice or more",
            f"{c['delivered twice or more']} rows, {c['extra copies']} extra copies"
            + (
                ""
                if review
                else f" (explained by the sweeper: {c['delivered twice or more'] - c['unexplained duplicates']})"
            ),
        ),
        ("lost", c["lost"]),
        ("  still queued/processing at the end", c["not terminal"]),
        ("  sent, but no receipt", c["sent without receipt"]),
        ("  receipt for an unknown Message-ID", c["unknown receipts"]),
        ("  receipt for a rolled-back email", c["rolled-back arrived"]),
        ("sent", c["sent"]),
        (
            "failed",
            f"{c['failed']} ({c['failed permanent']} to 550 recipients, {c['failed but arrived']} arrived)",
        ),
        (
            "abandoned",
            f"{c['abandoned']} ({c['abandoned arrived']} arrived, {c['abandoned not arrived']} did not)",
        ),
        ("cancelled", c["cancelled"]),
        ("kills: SIGKILL at a random moment (replaced)", c["random SIGKILL"]),
        ("kills: SIGSTOP past the heartbeat timeout, SIGCONT", c["SIGSTOP"]),
        ("kills: SIGKILL in the window (after_send)", c["SIGKILL after_send"]),
        ("rows in the send window of a killed/stopped worker", c["window hits"]),
        (
            '"mark sent" refused by the database',
            f"{c['db refusals']} (confirmed in the worker log: {c['refusals confirmed']}; "
            f"backends terminated: {c['backends terminated']})",
        ),
        ("redis-server restarted with its data wiped", c["redis wipe"]),
        ("sweeper restarts (it died)", c["sweeper restarts"]),
        (
            "worker processes started / exited on their own",
            f"{c['workers started']} / {c['unexpected exits']}",
        ),
        (
            "SMTP answers: 250 / 451 RCPT / 451 DATA / 550",
            f"{smtp['250 accepted']} / {smtp['451 at RCPT']} / {smtp['451 at DATA']} / {smtp['550 at RCPT']}",
        ),
        (
            "time: enqueue+chaos / drain / total",
            f"{t.get('enqueue and chaos', 0):.0f}s / {t.get('drain', 0):.0f}s"
            f"{' (TIME LIMIT)' if c['drain timed out'] else ''} / {t.get('total', 0):.0f}s",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    head = (
        f"chaos run {result['date']}  policy={cfg['policy']}  seed={cfg['seed']}  "
        f"deliveries={cfg['deliveries']}  workers={cfg['workers']} "
        f"(concurrency {','.join(map(str, cfg['concurrency']))})  db={cfg['db']}  "
        f"heartbeat={cfg['heartbeat_interval']}s/{cfg['heartbeat_timeout']}s  "
        f"time-limit={cfg['time_limit']:.0f}s"
    )
    lines = [head, "-" * min(len(head), 100)]
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("-" * min(len(head), 100))
    if result["ok"]:
        lines.append("RESULT: PASS")
    else:
        lines.append("RESULT: FAIL")
        lines += [f"  - {v}" for v in result["violations"]]
    if result.get("sweeper_restarts"):
        lines.append("sweeper exits:")
        lines += [f"  {s}" for s in result["sweeper_restarts"]]
    if result.get("details"):
        lines.append("details:")
        lines += [f"  {d}" for d in result["details"][:200]]
    lines.append("events:")
    lines += [f"  {e}" for e in result["events"]]
    lines.append(f"logs: {result['logs']}")
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = Config()
    p = argparse.ArgumentParser(
        prog="chaos/run.py",
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
    p.add_argument("--rollback-fraction", type=float, default=defaults.rollback_fraction)
    p.add_argument("--transient-fraction", type=float, default=defaults.transient_fraction)
    p.add_argument("--permanent-fraction", type=float, default=defaults.permanent_fraction)
    p.add_argument("--smtp-delay", type=float, default=defaults.smtp_delay, metavar="SECONDS")
    p.add_argument("--results-dir", default=str(RESULTS_DIR))
    p.add_argument("--keep-db", action="store_true", help="keep the databases after a pass too")
    return p.parse_args(argv)


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
        rollback_fraction=args.rollback_fraction,
        transient_fraction=args.transient_fraction,
        permanent_fraction=args.permanent_fraction,
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
