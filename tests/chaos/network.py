"""The chaos run's network: fault proxies between some workers and their servers.

``NetworkMixin`` is the part of ``Child`` that owns two ``tests.proxy.FaultProxy``
instances, one in front of redis-server and one in front of PostgreSQL, in
this process, and starts ``Config.proxied_workers`` of the workers through
them (``Proc.proxied``; a replacement of a proxied worker is proxied too).
The other workers, the sweeper and the harness reach the servers directly: a
subset, so that the proxies' cost (one Python thread forwarding every byte)
stays small, and so that the sweeper acting on a worker that no fault reached
is still a violation.

redis-py retries a command that failed on a broken connection (three times,
by default, since redis-py 6); the proxied workers alternate between that
default and no retries at all (``OUTBOX_CHAOS_REDIS_RETRY=0``, see
tests/chaos/settings.py), so that a lost reply reaches the worker's own
replay of the claim (its nonce) as well as redis-py's.

Every network fault is recorded as a ``NetFault`` with its wall-clock window:
analysis.py explains a sweeper action on a proxied worker by a fault whose
window it follows closely enough (``explains``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

# How long after a network fault the sweeper may still act because of it: the
# worker's heartbeat is HEARTBEAT_TIMEOUT old, then the sweeper's next loop (1 s).
AFTERMATH_TIMEOUTS = 2
AFTERMATH_SECONDS = 5.0


@dataclass
class NetFault:
    kind: str  # "lost claim reply", "redis outage", ...
    target: str  # "redis" or "postgres"
    start: float  # wall clock (time.time()), as the Attempt rows' Redis time
    end: float
    detail: str = ""


class NetworkMixin:
    """The part of ``Child`` that owns the fault proxies (see child.py for the attributes)."""

    proxies: dict[str, Any]
    net_faults: list[NetFault]

    def start_proxies(self) -> None:
        from tests.proxy import FaultProxy

        if not self.config.proxied_workers:
            return
        self.proxies["redis"] = FaultProxy(self.redis_server.port).start()
        if self.config.db == "postgres":
            port = int(os.environ.get("OUTBOX_TEST_PG_PORT", "5432"))
            host = os.environ.get("OUTBOX_TEST_PG_HOST", "127.0.0.1")
            self.proxies["postgres"] = FaultProxy(port, host=host).start()
        ports = ", ".join(f"{k} {p.port}" for k, p in self.proxies.items())
        self.say(f"fault proxies on 127.0.0.1: {ports}")

    def close_proxies(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        self.proxies.clear()

    def proxied_env(self) -> dict[str, str]:
        """What a proxied worker's environment says differently: the proxies' ports."""
        env = {"OUTBOX_TEST_REDIS_URL": f"redis://127.0.0.1:{self.proxies['redis'].port}/0"}
        if "postgres" in self.proxies:
            env["OUTBOX_TEST_PG_HOST"] = "127.0.0.1"
            env["OUTBOX_TEST_PG_PORT"] = str(self.proxies["postgres"].port)
        # Alternate: redis-py's default retries, or none (the worker's own replay).
        self.counts["proxied workers started"] += 1
        env["OUTBOX_CHAOS_REDIS_RETRY"] = "0" if self.counts["proxied workers started"] % 2 else "1"
        return env

    def proxy_counters(self) -> dict[str, int]:
        out = {}
        for name, proxy in self.proxies.items():
            out[f"{name} proxy: connections"] = proxy.accepted
            out[f"{name} proxy: refused"] = proxy.refused
            out[f"{name} proxy: MB forwarded"] = round((proxy.up_bytes + proxy.down_bytes) / 1e6)
        return out

    def wait_proxied_up(self) -> None:
        """Wait until every running proxied worker has started (so it holds connections)."""
        from tests.chaos.processes import incarnations

        def up() -> bool:
            procs = [p for p in self.live_workers() if p.proxied]
            return bool(procs) and all(incarnations(p.log) for p in procs)

        self.wait_for(up, 60, "the proxied workers to start")

    def net_fault(self, kind: str, target: str, start: float, detail: str = "") -> NetFault:
        fault = NetFault(kind, target, start, time.time(), detail)
        self.net_faults.append(fault)
        self.counts[kind] += 1
        return fault


def explains(child: Any, worker_id: str, when: float) -> NetFault | None:
    """The network fault that may have made the sweeper act on ``worker_id`` at ``when``.

    Only a proxied worker's incarnation can be reached by one; the act must fall
    in the fault's window or its aftermath (the heartbeat timeout, twice, and
    the sweeper's loop).
    """
    from tests.chaos.processes import incarnations

    names = {n for proc in child.procs if proc.proxied for n in incarnations(proc.log)}
    if worker_id not in names:
        return None
    slack = AFTERMATH_TIMEOUTS * child.config.heartbeat_timeout + AFTERMATH_SECONDS
    for fault in child.net_faults:
        if fault.start - 0.5 <= when <= fault.end + slack:
            return fault
    return None
