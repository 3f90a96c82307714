"""The outbox at a glance: one snapshot of the database and Redis, and its faces.

``snapshot`` takes it (``collect``) (its docstring lists the keys), ``live`` reads
the Redis side, ``render`` lays it out for ``outbox_status``, ``counters``
keeps the sent total for ``metrics``, the Prometheus endpoint.
"""

from .render import render, watch_loop
from .snapshot import collect

__all__ = ["collect", "render", "watch_loop"]
