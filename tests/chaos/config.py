"""The chaos run's configuration, constants and the counts every result carries.

``Config`` is what the command line (``run.py``) builds and the child process
(``child.py``) receives as JSON; ``COUNT_KEYS`` are the counts ``analysis.py``
always reports; ``HarnessError`` is a chaos step that could not be carried out;
``SMALL`` is the size of the test suite's run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

RESULTS_DIR = ROOT / "tests" / "chaos" / "results"
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
    "restart rows",
    "restart rows not settled by the sweeper",
    "skew delivered",
    "skew problems",
    "hostile recipients",
    "stalls played",
    "cuts played",
    "ambiguous rows",
    "stall/cut rows not as documented",
    "in-doubt retries",
    "sweeper acts explained by network faults",
    "abandoned not in doubt",
    "receipt after abandonment",
    "lock rows",
    "lock rows not as documented",
    "long-send rows",
    "long-send rows not as documented",
)

# The counts of the network and signal faults (faults/lost_reply.py, outage.py,
# row_lock.py, long_send.py), as the child counts them while it plays them.
NET_COUNT_KEYS = (
    "lost claim reply",
    "lost step reply",
    "lost push reply",
    "redis outage",
    "postgres outage",
    "connections cut",
    "SIGSTOP blocked on a row lock",
    "SIGTERM during a long send",
    "proxied workers started",
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
    restarts: int = 2  # SIGKILL mid-send, restart at once under the same --worker-id
    skews: int = 1  # a worker whose clock is 90 s behind (faketime)
    slow_web_hosts: int = 1  # an enqueue 120 s behind, its pushes failing (faketime)
    stalls: int = 2  # the SMTP server never answers DATA's final dot
    cuts: int = 2  # the SMTP server records the message, then cuts the connection
    lost_claims: int = 2  # the reply to a proxied worker's claim script is lost
    lost_steps: int = 2  # ... to its step statement (PostgreSQL)
    lost_pushes: int = 2  # ... to its push script (a retry after a 451)
    redis_outages: int = 2  # the Redis proxy refuses connections a few seconds, cuts the rest
    pg_outages: int = 2  # the same, PostgreSQL's proxy
    lock_stops: int = 2  # SIGSTOP a worker whose step waits on a row lock the harness holds
    long_sends: int = 2  # SIGTERM a worker while the SMTP server holds its reply > heartbeat
    proxied_workers: int = 2  # workers behind the fault proxies (network.py)
    rollback_fraction: float = 0.1
    transient_fraction: float = 0.05  # flaky recipients: 451 on their first 1-2 tries
    permanent_fraction: float = 0.01  # recipients refused with 550
    hostile_every: int = 50  # every n-th recipient: IDN, mixed case or a display name (plan.py)
    smtp_delay: float = 0.01  # mean seconds before the server answers DATA
    batches: int = 0  # enqueue transactions groups; 0: automatic
    heartbeat_timeout: float = 3.0
    heartbeat_interval: float = 0.5
    send_timeout: float = 6.0  # OUTBOX["SEND_TIMEOUT"] of the workers (> heartbeat_timeout)
    skew_seconds: float = -90.0  # the skewed worker's clock offset
    results_dir: str = str(RESULTS_DIR)
    keep_db: bool = False

    def events(self) -> int:
        return sum(self.schedule_counts().values())

    def schedule_counts(self) -> dict[str, int]:
        """How many times each fault of the schedule is played (by its name in faults/)."""
        return {
            "kill": self.random_kills,
            "stop": self.stops,
            "window": self.window_kills,
            "refuse": self.db_refusals,
            "redis": self.redis_wipes,
            "restart": self.restarts,
            "skew": self.skews,
            "slow-web-host": self.slow_web_hosts,
            "stall": self.stalls,
            "cut": self.cuts,
            "lost-claim": self.lost_claims,
            "lost-step": self.lost_steps,
            "lost-push": self.lost_pushes,
            "redis-outage": self.redis_outages,
            "pg-outage": self.pg_outages,
            "lock-stop": self.lock_stops,
            "long-send": self.long_sends,
        }


# The test suite's small run (tests/faults/test_chaos.py): a few hundred deliveries, one or
# two faults of each kind. tests/faults/test_pgbouncer.py starts from it with every fault at 0.
SMALL = {
    "deliveries": 300,
    "workers": 3,
    "concurrency": [1, 2, 4],
    "random_kills": 1,
    "stops": 1,
    "window_kills": 2,
    "db_refusals": 1,
    "redis_wipes": 1,
    "restarts": 1,
    "skews": 1,
    "slow_web_hosts": 1,
    "hostile_every": 20,
    "stalls": 1,
    "cuts": 1,
    "lost_claims": 1,
    "lost_steps": 1,
    "lost_pushes": 1,
    "redis_outages": 1,
    "pg_outages": 1,
    "lock_stops": 1,
    "long_sends": 1,
    "proxied_workers": 2,
    "time_limit": 120.0,
    "seed": 5,
}


# -- the parent: one child process per policy --------------------------------------------
