"""The outbox's Redis client: which one, where it is, and how long it waits.

The client is the django-redis cache alias ``OUTBOX["REDIS_CACHE"]``; its
address is shown in errors with passwords hidden.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django_redis import get_redis_connection
from redis import Redis

from ..conf import outbox_settings


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


def socket_timeout(client: Redis) -> float | None:
    """The socket timeout a client's connections read with (None: they wait for ever)."""
    pool = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
    value = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    return float(value) if value else None
