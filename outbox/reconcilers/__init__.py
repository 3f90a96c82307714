"""Reconcilers: ask the mail system itself whether an ``abandoned`` row left.

A row is ``abandoned`` when its worker went away inside the send window: the
outbox cannot know whether the mail server got the message. The mail server
often does know. ``OUTBOX["RECONCILERS"]`` lists dotted paths of
:class:`Reconciler` subclasses; on each pass the sweeper asks them about the
oldest abandoned rows (see :mod:`outbox.sweeper.reconcile` for what it does with the
answers)::

    OUTBOX = {
        "RECONCILERS": ["outbox.reconcilers.PostfixLogReconciler"],
        "POSTFIX_LOG": "/var/log/mail.log",
    }

A reconciler answers each :class:`Question` with an :class:`Answer`:
``SENT`` (the server has it: the row is settled as sent), ``NOT_SENT`` (the
server never got it: the row is requeued, under ``ABANDONED_POLICY`` "review"
only when ``sure``) or ``UNKNOWN`` (left for a person). A reconciler that
raises is logged and counts as ``UNKNOWN`` for every question it was asked.
"""

from .base import UNKNOWN, Answer, Question, Reconciler, Verdict
from .postfix import PostfixLogReconciler

__all__ = ["UNKNOWN", "Answer", "PostfixLogReconciler", "Question", "Reconciler", "Verdict"]
