"""Fault: a proxied worker's request reaches its server, the reply is lost, the connection cut.

Three requests, each the next one any proxied worker sends (see network.py):

- ``lost-claim``: the claim script's EVALSHA (its SHA from ``outbox.queue.scripts``).
  The script ran in Redis: ids moved to the worker's processing list. The
  worker (or redis-py, for a proxied worker that keeps its retries) runs the
  claim again with the same nonce, which must hand back the same ids;
- ``lost-step``: the PostgreSQL step (``outbox_step(`` of STEP_CALL and
  ``outbox_steps(`` of STEPS_CALL, the plain STEP's ``WITH settled AS``, or a prepared one's
  parameters). It committed: the
  previous row is ``sent``, the next ``processing`` under the worker's token; the
  worker reconnects and runs it again with the same tokens;
- ``lost-push``: the push script's EVALSHA, as a worker pushes a retry back to
  Redis. The SMTP server answers 451 at RCPT for a few fresh rows' recipients
  (``defer_once``) so that a proxied worker has a retry to push.

``FaultProxy.swallow_reply(pattern, then="cut")`` drops the server's next chunk
on that connection and closes it. The general rules say what must follow:
nothing lost, nothing sent twice under "review", no row abandoned unless in
doubt (a lost reply on its own leaves nothing in doubt: the sweeper must not
act on the worker). Each one is in the timeline (``child.net_faults``).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError
from tests.chaos.faults.stall import pick_fresh_row

if TYPE_CHECKING:
    from tests.chaos.child import Child

# The statement's text goes with its first run on a connection; with psycopg's
# prepared statements (tests/run.sh's 6.1:postgres cell) later runs send only
# their parameters, among them EXPIRED_ERROR (the step's and the claim's own).
STEP = re.compile(rb"outbox_steps?\(|WITH settled AS \(|expired: not sent before its expires_at")


def script_sha(name: str) -> bytes:
    from outbox.queue.scripts import shared_script

    return shared_script(name).sha.encode()


def lost_claim_reply(child: Child) -> None:
    lose_reply(child, "claim", "redis", script_sha("claim"))


def lost_step_reply(child: Child) -> None:
    lose_reply(child, "step", "postgres", STEP)


def lost_push_reply(child: Child) -> None:
    lose_reply(child, "push", "redis", script_sha("push"))


def lose_reply(child: Child, what: str, target: str, pattern: bytes | re.Pattern[bytes]) -> None:
    proxy = child.proxies.get(target)
    if proxy is None:
        raise HarnessError(f"no {target} proxy: no proxied workers")
    child.wait_proxied_up()
    start = time.time()
    fault = proxy.swallow_reply(pattern, then="cut", reset=child.rng.random() < 0.5)
    deferred: list[int] = []
    next_arm = 0.0

    def fired() -> bool:
        nonlocal next_arm
        # Work for every worker, the proxied ones included, even once the plan is used up.
        child.ensure_work(2 * child.batch_size, for_fault=True)
        if what == "push" and time.monotonic() >= next_arm:
            # A 451 for a fresh row: whichever worker claims it pushes a retry.
            row, recipient = pick_fresh_row(child)
            child.smtp.defer_once.add(recipient)
            deferred.append(row)
            next_arm = time.monotonic() + 1.0
        return fault.fired > 0

    try:
        child.wait_for(fired, 90, f"a proxied worker's {what} request to lose its reply")
    finally:
        fault.remove()
    child.net_fault(f"lost {what} reply", target, start, f"rows given a 451: {deferred}")
    child.event(
        f"lost the reply to a proxied worker's {what} ({target}), cut that connection"
        + (f"; 451 armed for rows {deferred}" if deferred else "")
    )
