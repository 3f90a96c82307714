"""What the queue says about a row, and the small pieces every Redis call shares.

Queue entries (id, priority, due time) and claims, the priorities' numbers
in Redis, the outbox's Redis client, and how replies and arguments are
encoded. ``reliable`` builds the queue on these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from django.conf import settings
from django_redis import get_redis_connection
from redis import Redis

from ..conf import PRIORITIES, outbox_settings

PRIORITY_INDEX: dict[str, int] = {name: i + 1 for i, name in enumerate(PRIORITIES)}
PRIORITY_NAME: dict[int, str] = {i: name for name, i in PRIORITY_INDEX.items()}


class QueueEntry(NamedTuple):
    """What Redis needs to know about a row to place it: id, priority, due time."""

    id: int
    priority: str
    due: float  # epoch seconds


class Claimed(NamedTuple):
    id: int
    priority: str


def get_connection() -> Redis:
    """The Redis client of the django-redis cache alias ``OUTBOX["REDIS_CACHE"]``."""
    return get_redis_connection(outbox_settings.REDIS_CACHE)


def redis_address() -> str:
    """Where the outbox's Redis is, for an error message: the cache and its LOCATION.

    Passwords in the URLs are shown as ``***``; a Sentinel setup names its Sentinels.
    """
    alias = outbox_settings.REDIS_CACHE
    config = getattr(settings, "CACHES", {}).get(alias)
    if not isinstance(config, dict):
        return f"cache {alias!r} (not in CACHES)"
    location = config.get("LOCATION")
    locations = location.split(",") if isinstance(location, str) else list(location or [])
    shown = ", ".join(_without_password(str(item).strip()) for item in locations)
    text = f"cache {alias!r} at {shown or '(no LOCATION)'}"
    sentinels = (config.get("OPTIONS") or {}).get("SENTINELS")
    if isinstance(sentinels, list | tuple) and sentinels:
        text += " through Sentinels " + ", ".join(
            ":".join(str(part) for part in sentinel)
            if isinstance(sentinel, list | tuple)
            else str(sentinel)
            for sentinel in sentinels
        )
    return text


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}***@{host}").geturl()


def entry_args(entries: Iterable[QueueEntry]) -> list[Any]:
    args: list[Any] = []
    for entry in entries:
        args += [entry.id, PRIORITY_INDEX[entry.priority], f"{entry.due:.6f}"]
    return args


def socket_timeout(client: Redis) -> float | None:
    """The socket timeout a client's connections read with (None: they wait for ever)."""
    pool = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
    value = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    return float(value) if value else None


def decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ClaimResult(NamedTuple):
    """What one claim round trip returned."""

    now: float  # Redis time, epoch seconds
    registered: bool  # False: this incarnation was declared dead; claim nothing more
    items: list[Claimed]
    # The operator's control hash as the claim saw it (read by control.parse);
    # None when not registered. While it says "paused", items is empty.
    control: dict[str, str] | None = None
    # When nothing was claimed: the earliest scheduled id's due time (Redis
    # time; math.inf when none is scheduled). None: not looked at.
    next_due: float | None = None
