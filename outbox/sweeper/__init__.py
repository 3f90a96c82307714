"""The sweeper: settle what dead workers and lost Redis data left behind.

``sweep`` (one pass and its order), ``mirror`` (every queued row waits in
Redis), ``reconcile`` (abandoned rows settled from the mail server's log) and
``retention`` (the content of settled mail cleared).
"""

from .sweep import Sweeper, SweepReport

__all__ = ["SweepReport", "Sweeper"]
