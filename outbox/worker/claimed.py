"""Step 2's answer: what a thread's claim UPDATE gave it, as the message to send.

The claim UPDATE (one conditional statement, see ``sql.py``) either returned
the row, now ``processing`` under the thread's claim token, or nothing. This
turns that answer into a :class:`~outbox.worker.outcomes.Started`, or into
None for an id the thread must drop. It runs on the thread's own database
connection (the step itself may have run on the worker's step connection):
a :class:`~django.db.DatabaseError` here is the caller's to retry with the
same token (``SenderLoop._mark``).
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction

from ..models import Delivery, outbox_alias
from ..queue.entries import Claimed
from . import rows, sql
from .host import WorkerHost
from .outcomes import Started

logger = logging.getLogger("outbox.worker")

Status = Delivery.Status


def started_from(
    worker: WorkerHost,
    item: Claimed,
    token: uuid.UUID,
    claimed: rows.ClaimedRow | None,
    begun: float,
    worker_id: str,
) -> Started | None:
    """What step 2's conditional UPDATE gave us; None means a stale id: drop it.

    ``begun`` (time.monotonic()) and ``worker_id``, the incarnation the step
    marked the row under, were read before the step was issued: the send is
    fenced by that incarnation's lease, not by when the reply came.

    The UPDATE left the row naming this incarnation, the claim token and
    the start time: all the evidence the sweeper needs if we die before
    step 4.
    """
    # No close_old_connections() here: with CONN_MAX_AGE=0 it would open a
    # new connection for every email. The connection lives as long as the
    # thread and is dropped only after a DatabaseError.
    if claimed is None:
        owned = Delivery.objects.filter(
            pk=item.id, status=Status.PROCESSING, claim_token=token
        ).first()
        if owned is None:
            # A queued row not due yet was pushed early: put it in `scheduled`.
            entry = sql.early_entry(item.id, worker.clock.now())
            if entry is not None:
                transaction.on_commit(lambda: worker.push_quietly([entry]), using=outbox_alias())
            worker.stats.add("skipped")
            return None
        # Our earlier UPDATE committed; its reply was lost.
        claimed = rows.ClaimedRow(owned, None, False)
    if claimed.expired:
        # The claim UPDATE found it past its expires_at and cancelled it.
        logger.info("delivery %s expired before it was sent; cancelled", item.id)
        worker.stats.add("skipped")
        return None
    delivery = claimed.delivery
    if claimed.email is not None:
        email, attachments = worker.emails.remember(claimed.email, claimed.has_attachments)
    else:
        email, attachments = worker.emails.content(delivery.email_id)
    return Started(delivery, email, attachments, token, begun, worker_id)
