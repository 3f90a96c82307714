"""The Redis side: a reliable queue of delivery ids, and what rides on it.

``client`` (which Redis, and where), ``entries`` (what the queue says
about a row), ``reliable`` (the keys, a
table of them, and the calls), ``scripts`` and
``lua/`` (the Lua scripts), ``direct`` (the web side's push connection),
``clock`` (Redis time), ``publish`` (pushing committed rows); then
``control`` (pause switches) and ``ratelimit`` (rate limits), built on the
queue.
"""

from .client import get_connection
from .entries import (
    PRIORITY_INDEX,
    PRIORITY_NAME,
    Claimed,
    ClaimResult,
    QueueEntry,
)
from .reliable import RedisQueue

__all__ = [
    "PRIORITY_INDEX",
    "PRIORITY_NAME",
    "ClaimResult",
    "Claimed",
    "QueueEntry",
    "RedisQueue",
    "get_connection",
]
