"""The faults of the chaos run, one module each, by their name in the schedule.

Each fault is a function of the running ``Child``; it raises ``HarnessError``
when it cannot be carried out (which the run reports as a violation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tests.chaos.faults.cut import cut_after_data
from tests.chaos.faults.db_refusal import db_refusal
from tests.chaos.faults.kill import random_kill
from tests.chaos.faults.long_send import sigterm_during_long_send
from tests.chaos.faults.lost_reply import lost_claim_reply, lost_push_reply, lost_step_reply
from tests.chaos.faults.outage import pg_outage, redis_outage
from tests.chaos.faults.redis_wipe import redis_wipe
from tests.chaos.faults.restart import restart_same_id
from tests.chaos.faults.row_lock import stop_on_row_lock
from tests.chaos.faults.send_window import window_kill
from tests.chaos.faults.skew import skewed_worker
from tests.chaos.faults.slow_web_host import slow_web_host
from tests.chaos.faults.stall import stall_after_data
from tests.chaos.faults.stop import stop_past_timeout

if TYPE_CHECKING:
    from tests.chaos.child import Child

# Schedule name -> fault.
FAULTS: dict[str, Callable[[Child], None]] = {
    "kill": random_kill,
    "stop": stop_past_timeout,
    "window": window_kill,
    "refuse": db_refusal,
    "redis": redis_wipe,
    "restart": restart_same_id,
    "skew": skewed_worker,
    "slow-web-host": slow_web_host,
    "stall": stall_after_data,
    "cut": cut_after_data,
    "lost-claim": lost_claim_reply,
    "lost-step": lost_step_reply,
    "lost-push": lost_push_reply,
    "redis-outage": redis_outage,
    "pg-outage": pg_outage,
    "lock-stop": stop_on_row_lock,
    "long-send": sigterm_during_long_send,
}
