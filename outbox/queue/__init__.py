"""The Redis side: a reliable queue of delivery ids, and what rides on it.

``entries`` (what the queue says about a row), ``reliable`` (the keys, a
table of them, and the calls), ``scripts`` and
``lua/`` (the Lua scripts), ``direct`` (the web side's push connection),
``clock`` (Redis time), ``publish`` (pushing committed rows); then
``control`` (pause switches) and ``ratelimit`` (rate limits), built on the
queue.
"""

from .entries import (
    PRIORITY_INDEX,
    PRIORITY_NAME,
    Claimed,
    ClaimResult,
    QueueEntry,
    get_connection,
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
