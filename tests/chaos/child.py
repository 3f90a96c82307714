"""One policy's chaos run, in its own process: set up, play the schedule, drain, check.

``Child`` holds the run's state (the plan, the processes, what was enqueued and
rolled back, the events and counts). Its parts live in their own modules:
servers.py (redis-server, SMTP, database), processes.py (workers, sweeper),
plan.py (enqueueing), faults/ (one module per fault) and analysis.py (the rules
every row is checked against). run.py starts this in a fresh process per policy.
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos.analysis import analyze
from tests.chaos.config import LIVE, Config, HarnessError
from tests.chaos.faults import FAULTS
from tests.chaos.network import NetFault, NetworkMixin
from tests.chaos.plan import EnqueueMixin, Txn, make_plan, split_reserve
from tests.chaos.processes import Proc, ProcessesMixin
from tests.chaos.servers import ServersMixin
from tests.chaos.smtp import ChaosSMTPHandler


class Child(ServersMixin, ProcessesMixin, EnqueueMixin, NetworkMixin):
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
        self.reserve: deque[list[Txn]] = deque()
        self.permanent: set[str] = set()
        self.committed: dict[str, str] = {}  # Message-ID -> recipient
        self.rolled_back: dict[str, str] = {}
        self.events: list[str] = []
        self.counts: Counter[str] = Counter()
        self.disturbed: dict[int, str] = {}  # pid -> how (kill, stop, window)
        self.window_rows: list[int] = []
        self.refused_rows: list[tuple[int, int, Path, int]] = []  # row, pid, log, offset
        self.restart_rows: list[tuple[int, str]] = []  # row, the killed incarnation
        self.skewed: list[Proc] = []
        self.smtp_fault_rows: list[tuple[str, int]] = []  # "stall"/"cut", row
        self.proxies: dict[str, Any] = {}  # "redis"/"postgres" -> FaultProxy (network.py)
        self.net_faults: list[NetFault] = []
        self.lock_rows: list[tuple[int, int]] = []  # row, pid of the worker stopped on it
        self.long_send_rows: list[tuple[int, int, int]] = []  # row, pid, exit status
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

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        config = self.config
        if config.db != "postgres" and config.db_refusals:
            self.say("SQLite: no 'refuse mark sent' step (it needs pg_terminate_backend)")
            config.db_refusals = 0
        if config.db != "postgres":
            self.say("SQLite: no lost step reply, PostgreSQL outage or row lock")
            config.lost_steps = config.pg_outages = config.lock_stops = 0
        if not config.proxied_workers:
            self.say("no proxied workers: no lost replies and no outages")
            config.lost_claims = config.lost_steps = config.lost_pushes = 0
            config.redis_outages = config.pg_outages = 0
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        plan, self.permanent = make_plan(config, self.rng)
        self.batch_size = max(1, config.deliveries // len(plan))
        plan, reserve = split_reserve(plan, config)
        self.plan, self.reserve = deque(plan), deque(reserve)
        self.start_servers()
        self.create_database()
        self.setup_django()

        started = time.monotonic()
        self.start_processes(len(plan))
        self.play_schedule()
        while self.enqueue_next(use_reserve=True):
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
        result = analyze(self)
        self.timings["total"] = time.monotonic() - self.t0
        result["timings"] = self.timings
        return result

    def start_processes(self, batches: int) -> None:
        """Enqueue 30% of the plan, then start the sweeper and the workers."""
        config = self.config
        for _ in range(max(1, round(batches * 0.3))):
            self.enqueue_next()
        self.say(f"enqueued {len(self.committed)} (rolled back {len(self.rolled_back)}) so far")
        self.start_sweeper()
        mix = config.concurrency or [1]
        proxied = min(config.proxied_workers, config.workers) if self.proxies else 0
        for index in range(config.workers):
            self.start_worker(mix[index % len(mix)], proxied=index >= config.workers - proxied)
        self.say(
            f"{config.workers} workers (concurrency {[p.concurrency for p in self.procs]}, "
            f"{proxied} through the fault proxies), sweeper --loop 1"
        )

    def play_schedule(self) -> None:
        """The seeded schedule of faults, each after a short pause, with work kept queued."""
        config = self.config
        schedule = [name for name, n in config.schedule_counts().items() for _ in range(n)]
        self.rng.shuffle(schedule)
        self.say("schedule: " + ", ".join(schedule))
        for name in schedule:
            self.pause(self.rng.uniform(0.2, 1.0))
            self.ensure_work(self.batch_size)
            try:
                FAULTS[name](self)
            except HarnessError as exc:
                self.violations.append(f"chaos step {name!r} could not be carried out: {exc}")
                self.event(f"{name}: FAILED: {exc}")

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
