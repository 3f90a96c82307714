"""The table: every change of a delivery's status, one entry each (each a ``render.Transition``)."""

from __future__ import annotations

from ..models import Attempt, Delivery
from .render import (
    CLOCK,
    COMPANIONS,
    CONTENT,
    DUE,
    TOKEN,
    UNEXPIRED,
    Column,
    Const,
    IfExpired,
    NotBefore,
    Param,
    Transition,
)

Status = Delivery.Status
Outcome = Attempt.Outcome


_NOW = Param("now")
_ERROR = Param("error")
_UNCLAIMED = {"claim_token": Const(None), "worker_id": Const("")}

# The worker's, one row under the claim token of its attempt.

MARK = Transition(
    "mark",
    source=(Status.QUEUED,),
    guard=(DUE,),
    # A row past its expires_at is marked cancelled instead, without
    # counting an attempt; its status, returned last, tells the worker to drop it.
    sets={
        "status": IfExpired(Const(Status.CANCELLED), Const(Status.PROCESSING)),
        "last_error": IfExpired(Param("expired"), Column("last_error")),
        "worker_id": Param("worker"),
        "claim_token": Param("token"),
        "processing_started_at": _NOW,
        "updated_at": _NOW,
        "attempts": IfExpired(Column("attempts"), Column("attempts", 1)),
    },
    returns=(
        "email_id",
        "recipient",
        "priority",
        "attempts",
        "max_attempts",
        "message_id",
        "status",
    ),
)
# A message from the drop-in backend goes to an ESP in one request (outbox.mail.request):
# the mark's row takes the message's other rows with it, each as the mark would,
# under the same claim token. A row not due, past its expires_at or not queued
# is left to its own claim, and the request goes without it.
MARK_COMPANIONS = Transition(
    "mark companions",
    source=(Status.QUEUED,),
    guard=(COMPANIONS, DUE, UNEXPIRED),
    sets={
        "status": Const(Status.PROCESSING),
        "worker_id": Param("worker"),
        "claim_token": Param("token"),
        "processing_started_at": _NOW,
        "updated_at": _NOW,
        "attempts": Column("attempts", 1),
    },
    returns=("id", "email_id", "recipient", "priority", "attempts", "max_attempts", "message_id"),
)
SENT = Transition(
    "sent",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.SENT),
        "sent_at": _NOW,
        "updated_at": _NOW,
        "last_error": Const(""),
    },
)
FAILED = Transition(
    "failed",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
)
IN_DOUBT = Transition(
    "in doubt",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={"status": Const(Status.ABANDONED), "last_error": _ERROR, "updated_at": _NOW},
)
# Not sent, and never to be (the staging valve refused it, or it expired at
# the send): the attempt does not count.
DROPPED = Transition(
    "dropped",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.CANCELLED),
        "attempts": Column("attempts", -1),
        "last_error": _ERROR,
        "updated_at": _NOW,
    },
)
RETRY = Transition(
    "retry",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.QUEUED),
        "not_before": Param("retry_at"),
        "last_error": _ERROR,
        **_UNCLAIMED,
        "updated_at": _NOW,
    },
)
# Given back unsent (the lease ran out, the process stops): not an attempt.
RELEASE = Transition(
    "release",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.QUEUED),
        "attempts": Column("attempts", -1),
        "not_before": Param("not_before"),
        **_UNCLAIMED,
        "updated_at": _NOW,
    },
)
# The companions back, unsent, when the mark's reply was lost (``RELEASE`` for each).
RELEASE_COMPANIONS = Transition(
    "release companions",
    source=(Status.PROCESSING,),
    guard=(COMPANIONS, TOKEN),
    sets=RELEASE.sets,
)
# Not a change of status: where this attempt hands the row over, written
# before SMTP's final dot while the row is still the attempt's.
NOTE_SERVER = Transition(
    "note server",
    source=(Status.PROCESSING,),
    guard=(TOKEN,),
    sets={
        "status": Const(Status.PROCESSING),
        "server_host": Param("host"),
        "server_address": Param("address"),
    },
)

# The sweeper's and the operators' (outbox.operations: many rows, an Attempt
# row each). A row becoming queued gets ``updated_at`` from the clock: the
# sweeper's incremental mirror check compares it with the database's
# (outbox.sweeper.mirror.Mirror), whoever's host wrote it.

_BACK_TO_QUEUED = {"status": Const(Status.QUEUED), **_UNCLAIMED, "updated_at": CLOCK}

# An operator's requeue needs its email's content: once the sweeper has cleared
# it (outbox.sweeper.retention.clear_content) the row is skipped, reported as "content cleared".
REQUEUE = Transition(
    "requeue",
    source=(Status.ABANDONED, Status.FAILED, Status.CANCELLED),
    guard=(CONTENT,),
    sets={
        **_BACK_TO_QUEUED,
        "not_before": NotBefore(),
        "attempts": Const(0),
        "sent_at": Const(None),
    },
    logged_as=Outcome.REQUEUED,
)
REQUEUE_NOW = Transition(
    "requeue now",
    source=REQUEUE.source,
    guard=REQUEUE.guard,
    sets={**_BACK_TO_QUEUED, "not_before": _NOW, "attempts": Const(0), "sent_at": Const(None)},
    logged_as=Outcome.REQUEUED,
)
REQUEUE_DEAD = Transition(
    "requeue dead",  # its worker died mid-send, the policy is "requeue"
    source=(Status.PROCESSING,),
    sets={**_BACK_TO_QUEUED, "not_before": _NOW},
    logged_as=Outcome.REQUEUED,
)
REQUEUE_NOT_SENT = Transition(
    "requeue not sent",  # a reconciler found it never left
    source=(Status.ABANDONED,),
    sets={**_BACK_TO_QUEUED, "not_before": _NOW},
    logged_as=Outcome.REQUEUED,
)
ABANDON = Transition(
    "abandon",  # its worker died mid-send, the policy is "review"
    source=(Status.PROCESSING,),
    sets={"status": Const(Status.ABANDONED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.ABANDONED,
)
FAIL_DEAD = Transition(
    "fail dead",  # its worker died mid-send on its last attempt
    source=(Status.PROCESSING,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.FAILED,
)
MARK_SENT = Transition(
    "mark sent",  # the attempt log keeps why it was abandoned
    source=(Status.ABANDONED,),
    sets={
        "status": Const(Status.SENT),
        "sent_at": _NOW,
        "last_error": Const(""),
        "updated_at": _NOW,
    },
    logged_as=Outcome.MARKED_SENT,
)
MARK_FAILED = Transition(
    "mark failed",
    source=(Status.ABANDONED,),
    sets={"status": Const(Status.FAILED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.MARKED_FAILED,
)
CANCEL = Transition(
    "cancel",
    source=(Status.QUEUED, Status.ABANDONED),
    sets={"status": Const(Status.CANCELLED), "updated_at": _NOW},
    logged_as=Outcome.CANCELLED,
)
EXPIRE = Transition(
    "expire",  # queued past its expires_at (the sweeper; the mark does the same for itself)
    source=(Status.QUEUED,),
    sets={"status": Const(Status.CANCELLED), "last_error": _ERROR, "updated_at": _NOW},
    logged_as=Outcome.CANCELLED,
)

ALL = (
    MARK, MARK_COMPANIONS, SENT, FAILED, IN_DOUBT, DROPPED, RETRY, RELEASE,
    RELEASE_COMPANIONS, NOTE_SERVER,
    REQUEUE, REQUEUE_NOW, REQUEUE_DEAD, REQUEUE_NOT_SENT, ABANDON, FAIL_DEAD,
    MARK_SENT, MARK_FAILED, CANCEL, EXPIRE,
)  # fmt: skip
