"""Checks of the outbox's Redis: the cache alias, Sentinel and Cluster, and eviction."""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning
from django.core.exceptions import ImproperlyConfigured

from ..conf import outbox_settings
from ..queue.client import get_connection, redis_address
from ..redis_cluster import startup_nodes
from .settings import outbox_check

CLUSTER_CLIENT = "outbox.redis_cluster.ClusterClient"
SENTINEL_CLIENT = "django_redis.client.SentinelClient"
# Transactions (MULTI) on a cluster pipeline arrived in redis-py 6.1.
CLUSTER_MIN_REDIS_PY = (6, 1)
# How long check W013 waits for Redis' answer: every command that runs the
# checks (migrate, runserver) waits this long at most, whatever the cache's
# own connect timeout (none by default: a host that drops packets would hold
# it for minutes).
PING_PATIENCE = 3.0


@outbox_check()
def check_redis_cache(raw: dict[str, Any]) -> list[CheckMessage]:
    """E002, E003: ``REDIS_CACHE`` names a django-redis cache."""
    return _check_redis_cache()


def _check_redis_cache() -> list[CheckMessage]:
    alias = outbox_settings.REDIS_CACHE
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [
            Error(
                f"OUTBOX['REDIS_CACHE'] names the cache alias {alias!r}, which is not in CACHES.",
                hint="Add a django-redis cache to CACHES, or point REDIS_CACHE at one.",
                id="outbox.E002",
            )
        ]
    config = caches[alias]
    backend = str(config.get("BACKEND", "")) if isinstance(config, dict) else ""
    if backend.startswith("django_redis."):
        return []
    return [
        Error(
            f"The cache {alias!r} uses {backend!r}; the outbox needs django-redis.",
            hint="Set its BACKEND to 'django_redis.cache.RedisCache'.",
            id="outbox.E003",
        )
    ]


@outbox_check()
def check_redis_topology(raw: dict[str, Any]) -> list[CheckMessage]:
    """E018, E019: a Cluster or Sentinel cache that cannot work as configured."""
    return _check_redis_topology()


def _check_redis_topology() -> list[CheckMessage]:
    """E018 / E019: a Cluster or Sentinel cache that cannot work as configured."""
    config = getattr(settings, "CACHES", {}).get(outbox_settings.REDIS_CACHE)
    if not isinstance(config, dict):
        return []  # E002 / E003 report it
    options = config.get("OPTIONS") or {}
    client = str(options.get("CLIENT_CLASS", ""))
    if client == CLUSTER_CLIENT:
        return _check_cluster(config.get("LOCATION"))
    if client == SENTINEL_CLIENT:
        return _check_sentinel(options)
    return []


def _check_cluster(location: Any) -> list[CheckMessage]:

    locations = location.split(",") if isinstance(location, str) else list(location or [])
    problem = ""
    try:
        if not locations:
            problem = "LOCATION names no node"
        else:
            startup_nodes([str(item) for item in locations])
    except ImproperlyConfigured as exc:
        problem = str(exc)
    version = tuple(int(p) for p in redis.__version__.split(".")[:2] if p.isdigit())
    if not problem and version < CLUSTER_MIN_REDIS_PY:
        problem = (
            f"redis-py {redis.__version__} cannot run MULTI on a cluster; it needs 6.1 or later"
        )
    if not problem:
        return []
    return [
        Error(
            f"The outbox's cache {outbox_settings.REDIS_CACHE!r} uses the Redis Cluster client: "
            f"{problem}.",
            hint="List the cluster's nodes as redis://host:port (database 0), e.g. "
            "['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379'].",
            id="outbox.E018",
        )
    ]


def _check_sentinel(options: dict[str, Any]) -> list[CheckMessage]:
    factory = str(
        options.get("CONNECTION_FACTORY")
        or getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", "")
    )
    problems = []
    if not factory.endswith("SentinelConnectionFactory"):
        problems.append("its connection factory is not django_redis.pool.SentinelConnectionFactory")
    sentinels = options.get("SENTINELS")
    if not sentinels or not all(isinstance(s, list | tuple) and len(s) == 2 for s in sentinels):
        problems.append("OPTIONS['SENTINELS'] is not a list of (host, port) pairs")
    if not problems:
        return []
    return [
        Error(
            f"The outbox's cache {outbox_settings.REDIS_CACHE!r} uses SentinelClient, but "
            f"{' and '.join(problems)}.",
            hint="Set OPTIONS['CONNECTION_FACTORY'] to 'django_redis.pool.SentinelConnectionFactory' "
            "and OPTIONS['SENTINELS'] to [(host, port), ...]; LOCATION is redis://<service>/0.",
            id="outbox.E019",
        )
    ]


@outbox_check(Tags.caches)
def check_redis_reachable(raw: dict[str, Any]) -> list[CheckMessage]:
    """W013: the outbox's Redis answers a PING."""
    return _check_redis_reachable()


def _check_redis_reachable() -> list[CheckMessage]:
    config = getattr(settings, "CACHES", {}).get(outbox_settings.REDIS_CACHE)
    if not isinstance(config, dict) or not str(config.get("BACKEND", "")).startswith(
        "django_redis."
    ):
        return []  # E002 / E003 report it
    if _check_redis_topology():
        return []  # E018 / E019: no use asking a server the client cannot reach as configured
    failure: list[str] = []

    def ping() -> None:
        try:
            client = get_connection()
            client.ping()
        except Exception as exc:  # whatever stops it, the check says it: a warning only
            failure.append(f"{type(exc).__name__}: {exc}")
            return
        # Leave no connection behind: `outbox_worker --processes` forks after
        # the checks, and its supervisor holds no socket.
        pool = getattr(client, "connection_pool", None)  # a cluster client has none
        if pool is not None:
            pool.disconnect(inuse_connections=False)

    # A thread, so that the wait is bounded however the client is configured;
    # a daemon, so that one still connecting does not keep the process alive.
    thread = threading.Thread(target=ping, name="outbox check W013", daemon=True)
    thread.start()
    thread.join(PING_PATIENCE)
    if thread.is_alive():
        failure.append(f"no answer within {PING_PATIENCE:.0f}s")
    if not failure:
        return []
    return [
        Warning(
            f"The outbox's Redis ({redis_address()}) is unreachable: {failure[0].rstrip('.')}. "
            "Mail is enqueued, but no worker sends it until Redis answers.",
            hint="Start Redis, or point OUTBOX['REDIS_CACHE'] at a cache whose LOCATION "
            "is where it listens.",
            id="outbox.W013",
        )
    ]


@outbox_check(Tags.caches, deploy=True)
def check_redis_eviction(raw: dict[str, Any]) -> list[CheckMessage]:
    """E021: an evicting Redis breaks the protocol. Deploy only: it asks the server."""
    return _check_redis_eviction()


def _check_redis_eviction() -> list[CheckMessage]:
    """E021: the outbox's Redis may evict any key (``maxmemory-policy allkeys-*``).

    Asks the server itself (``CONFIG GET``). Says nothing when it cannot ask:
    the cache is not a django-redis one (E002 / E003), Redis is unreachable
    (W013 reports that), or ``CONFIG`` is disabled
    or renamed, as managed Redis services often do.
    """
    config = getattr(settings, "CACHES", {}).get(outbox_settings.REDIS_CACHE)
    if not isinstance(config, dict) or not str(config.get("BACKEND", "")).startswith(
        "django_redis."
    ):
        return []

    try:
        reply = get_connection().config_get("maxmemory-policy")
    except Exception:
        return []
    evicting = sorted({p for p in _policies(reply) if p.startswith("allkeys-")})
    if not evicting:
        return []
    return [
        Error(
            f"The outbox's Redis (cache {outbox_settings.REDIS_CACHE!r}) has maxmemory-policy "
            f"{', '.join(evicting)}: when it runs out of memory it may evict the workers' "
            "registrations, claims and dead markers, and the outbox loses track of mail in "
            "flight.",
            hint="Set maxmemory-policy to noeviction (a volatile-* policy is safe too: it "
            "evicts only keys with a TTL, which for the outbox are the sweeper's lease and "
            "rate-limit counters), or give the outbox a Redis of its own.",
            id="outbox.E021",
        )
    ]


def _policies(reply: Any) -> list[str]:
    """The policies in a CONFIG GET reply (a Redis Cluster client answers per node)."""
    if not isinstance(reply, dict):
        return []
    found = []
    for key, value in reply.items():
        if isinstance(value, dict):
            found += _policies(value)
        elif (key.decode() if isinstance(key, bytes) else str(key)) == "maxmemory-policy":
            found.append(value.decode() if isinstance(value, bytes) else str(value))
    return found
