"""Who a worker process is now: its incarnation, and the lease it may send under.

Every start, and every lost registration, makes a new incarnation; the lease
is how long it may still start a hand-over (PROTOCOL.md's words).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..conf import outbox_settings

# A send needs a lease: the last heartbeat that found this incarnation alive
# was sent less than this share of HEARTBEAT_TIMEOUT ago. The rest of the
# timeout is the margin between the sweeper's clock and ours.
LEASE_SHARE = 0.8


@dataclass(frozen=True)
class Incarnation:
    """Who the worker process is now and since when its lease runs, read as one.

    The name (``<name>#<hex>``, unique to one incarnation: rows, processing
    lists and heartbeats carry it) and the lease change together, in one
    assignment under the worker's lock, and a sender reads them together
    (``WorkerHost.incarnation``). Read apart, a thread could take the new
    incarnation's fresh lease with the old, dead name, and mark and send a
    row under a name the sweeper is settling.
    """

    worker_id: str
    # time.monotonic() when the last heartbeat (or the registration) that
    # found this incarnation alive was sent: the start of its lease.
    lease_from: float

    def lease_left(self) -> float:
        """Seconds this incarnation may still start a send; not positive: it may not.

        The sweeper declares an incarnation dead when its heartbeat is
        HEARTBEAT_TIMEOUT old by Redis' clock. The lease counts from when the
        last successful heartbeat was *sent*, before Redis stamped it, so it
        ends before the sweeper may act, whatever froze us (SIGSTOP, a Redis
        outage, a stalled step).
        """
        lease = LEASE_SHARE * outbox_settings.HEARTBEAT_TIMEOUT
        return lease - (time.monotonic() - self.lease_from)

    def renewed(self, sent_at: float) -> Incarnation:
        """The same incarnation, its lease renewed by a heartbeat sent at ``sent_at``."""
        return replace(self, lease_from=max(self.lease_from, sent_at))
