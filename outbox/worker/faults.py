"""The worker's one test hook: stop the process at a named point of its loop.

With ``OUTBOX_FAULT_POINT=<point>`` in its environment the worker stops itself
(SIGSTOP) when it reaches that point, so that a crash test or the chaos run can
SIGKILL it, or cut its database connection, exactly there;
``OUTBOX_FAULT_COUNT=<n>`` limits how many times. The points:

``after_claim``             ids are in the processing list, rows still queued
``after_mark_processing``   the row is ``processing``, nothing sent yet
``after_note_server``       the row names the server it goes to, nothing sent yet
                            (only with ``OUTBOX["RECONCILERS"]``: ``attempt.Sender.note_server``)
``after_mark_companions``   an ESP request's companions are ``processing`` too
                            (``attempt.Sender.send_request``), nothing sent yet
``before_send``             the copy is built, the lease not yet asked again (the
                            last moment an HTTP request can be called back)
``after_send``              the mail server accepted it, the row is not yet ``sent``
``after_mark_sent``         the row is ``sent``, its id not yet acknowledged

Without the variable this is one string comparison per point.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "after_claim",
    "after_mark_processing",
    "after_note_server",
    "after_mark_companions",
    "before_send",
    "after_send",
    "after_mark_sent",
)

_POINT = os.environ.get("OUTBOX_FAULT_POINT", "")
_budget = [int(os.environ.get("OUTBOX_FAULT_COUNT", "-1"))]


def fault(point: str) -> None:
    """Stop this process here if the environment asks for it (see the module doc)."""
    if point == _POINT and _budget[0] != 0:
        _budget[0] -= 1
        # pthread_kill, not kill(getpid()): a process-directed SIGSTOP may be
        # taken by another thread while this one runs on past the point; this
        # stops the calling thread before the call returns, and the process with it.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
