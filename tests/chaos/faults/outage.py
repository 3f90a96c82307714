"""Fault: a window of refused connections to Redis (``redis-outage``) or PostgreSQL (``pg-outage``).

The proxy in front of that server (network.py) refuses every new connection
for a seeded 1 to 2 x HEARTBEAT_TIMEOUT seconds (``FaultProxy.refuse``: a RST
at once) and cuts every open one (``cut_all``, with a RST or an EOF, seeded).
Only the proxied workers are cut off; the sweeper and the other workers are
not.

Redis away for longer than the lease: a proxied worker may not start a send,
and past HEARTBEAT_TIMEOUT the sweeper declares it dead and settles the rows
it held ``processing`` (abandoned under "review", requeued under "requeue"):
those rows are in doubt because of this window, which analysis.py accepts as
their explanation (``network.explains``). PostgreSQL away: a worker's writes
fail and are retried with the same tokens once it is back; its heartbeat
goes on, so the sweeper must not act.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError

if TYPE_CHECKING:
    from tests.chaos.child import Child


def redis_outage(child: Child) -> None:
    outage(child, "redis")


def pg_outage(child: Child) -> None:
    outage(child, "postgres")


def outage(child: Child, target: str) -> None:
    proxy = child.proxies.get(target)
    if proxy is None:
        raise HarnessError(f"no {target} proxy: no proxied workers")
    timeout = child.config.heartbeat_timeout
    seconds = round(child.rng.uniform(timeout / 3, 2 * timeout), 1)
    reset = child.rng.random() < 0.5
    child.wait_proxied_up()
    child.ensure_work(child.batch_size)
    start = time.time()
    refused, cut = proxy.refused, proxy.open_connections
    proxy.refuse(seconds)
    proxy.cut_all(reset=reset)
    child.pause(seconds)
    refused = proxy.refused - refused
    child.counts["connections cut"] += cut
    name = "redis outage" if target == "redis" else "postgres outage"
    child.net_fault(name, target, start, f"{seconds}s, {refused} refused, {cut} cut")
    child.event(
        f"{target} proxy refused new connections for {seconds}s ({refused} refused) and "
        f"cut the {cut} open ones ({'RST' if reset else 'EOF'})"
    )
