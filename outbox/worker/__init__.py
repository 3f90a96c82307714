"""The worker: take ids from Redis, mark each row processing, send, then settle it.

For each message, in this order:

1. claim ids from Redis into this incarnation's processing list (one script
   round trip, which also acknowledges the ids finished since the last claim);
2. mark the row ``processing`` with one conditional ``UPDATE ... RETURNING``
   (``status='queued'`` and due by the database's clock), which records the
   incarnation, a fresh claim token and the start time on the row itself. If
   no row changed, the id was stale or a duplicate: it is dropped, nothing is
   sent;
3. hand the message to the delivery backend, within ``SEND_TIMEOUT``;
4. mark the row ``sent`` with an UPDATE that matches this attempt's claim
   token, or requeue it with backoff, or mark it ``failed``, or, when the
   outcome is in doubt, ``abandoned`` (see ``outcomes.py``).

Step 4 of one message and step 2 of the next are written in one transaction
(on PostgreSQL, one statement), and the steps of the threads that reach them
at the same moment share that transaction (``group_commit.py``): at most one
commit per email. The outcome of a message is still durable before the next
one is handed to the backend, so only the message in hand is ever in doubt;
when no next id is ready, the outcome is written on its own before the thread
waits.

Why this order is safe: the database row, not Redis, decides who may send. A
crash before step 2 leaves a queued row (the sweeper pushes it back); a crash
between 2 and 4 leaves a ``processing`` row, the only state in doubt, for the
sweeper to flag; an id that Redis holds twice can pass step 2 only once. Step 4
matches the claim token, so a late worker can never overwrite another attempt.

The rooms: ``process.py`` (incarnation, threads, signals, heartbeat),
``supervisor.py`` (``--processes``: N forked workers), ``loop.py`` (one
thread's loop), ``sql.py`` (runs the statements of ``outbox/statements/``,
one module per database), ``claimed.py`` (what a claim UPDATE gave a thread), ``gate.py`` (rate limits
and pauses, between claim and send), ``outcomes.py`` (what an outcome is and
how it is written), ``report.py`` (counters, log lines, signals),
``backoff.py`` (waiting out Redis or the database), ``cache.py`` (email
contents, bounded in bytes), ``connections.py`` (the delivery connections:
the default one, and one per mailer an email named) and ``faults.py`` (the
one test hook). The
protocol table is in ``outbox/PROTOCOL.md``.
"""

from ..failures import is_permanent
from .outcomes import Settlement, Started, backoff_delay
from .process import Worker, default_worker_id, new_incarnation, run_worker

__all__ = [
    "Settlement",
    "Started",
    "Worker",
    "backoff_delay",
    "default_worker_id",
    "is_permanent",
    "new_incarnation",
    "run_worker",
]
