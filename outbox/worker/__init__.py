"""The worker: take ids from Redis, mark each row processing, send, then settle it.

Per message: claim ids (one script round trip that also acknowledges the ids
finished since), mark the row ``processing`` with one conditional UPDATE
(which records the incarnation and a fresh claim token), hand it to the
delivery backend within ``SEND_TIMEOUT`` and only under a live heartbeat
lease, then settle it with an UPDATE that matches the claim token. The
settling of one message and the marking of the next share one commit, with
the other threads' (``group_commit``). Why this order is safe, crash by
crash, is tabled in ``outbox/PROTOCOL.md``.

The rooms: ``process`` (incarnation, threads, signals, heartbeat, lease),
``outage`` (when an outage stops the worker), ``supervisor``
(``--processes``), ``loop`` (one thread's loop), ``attempt`` (one delivery's
attempt, from its marked row to the outcome: the fenced hand-over, and the
thread's mail connections), ``incarnation`` (who the process is now, and its
lease), ``host`` (what the rooms need from the process), ``sql`` (the
statements run), ``group_commit`` (the threads' steps in one commit, on the
process's step connection), ``inflight`` (one delivery in flight, from its
claim to its ack), ``gate`` (rate limits and pauses), ``outcomes``
(what an outcome is and how it is written), ``settling`` (an outcome written
alone, or parked), ``report``, ``backoff``, ``alarm`` (the failure alarm's
counts), ``cache`` (email contents), ``connections`` (delivery connections)
and ``faults`` (the one test hook).
"""

from ..mail.failures import is_permanent
from .inflight import InFlight
from .outcomes import Settlement, backoff_delay
from .process import Worker, default_worker_id, new_incarnation, run_worker

__all__ = [
    "InFlight",
    "Settlement",
    "Worker",
    "backoff_delay",
    "default_worker_id",
    "is_permanent",
    "new_incarnation",
    "run_worker",
]
