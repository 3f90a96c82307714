"""System checks for Redis Sentinel / Cluster and for the reconcilers (see ``checks.py``).

Kept apart from ``checks.py`` so that each module holds one concern; the ids
(``outbox.E015`` to ``E019``, ``E021``, ``W007``) are listed in ``checks.py``'s table.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import DEFAULTS, outbox_settings

CLUSTER_CLIENT = "outbox.redis_cluster.ClusterClient"
SENTINEL_CLIENT = "django_redis.client.SentinelClient"
POSTFIX_RECONCILER = "outbox.reconcilers.PostfixLogReconciler"
# Transactions (MULTI) on a cluster pipeline arrived in redis-py 6.1.
CLUSTER_MIN_REDIS_PY = (6, 1)


def check_redis_topology() -> list[CheckMessage]:
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
    import redis

    from .redis_cluster import startup_nodes

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


def check_redis_eviction() -> list[CheckMessage]:
    """E021: the outbox's Redis may evict any key (``maxmemory-policy allkeys-*``).

    Asks the server itself (``CONFIG GET``). Says nothing when it cannot ask:
    the cache is not a django-redis one (E002 / E003), Redis is unreachable
    (the worker and ``outbox_status`` report that), or ``CONFIG`` is disabled
    or renamed, as managed Redis services often do.
    """
    config = getattr(settings, "CACHES", {}).get(outbox_settings.REDIS_CACHE)
    if not isinstance(config, dict) or not str(config.get("BACKEND", "")).startswith(
        "django_redis."
    ):
        return []
    from .queue import get_connection

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


def check_reconcilers(raw: dict[str, Any]) -> list[CheckMessage]:
    """E015 - E017, W007."""
    errors = _check_reconciler_paths(raw.get("RECONCILERS", DEFAULTS["RECONCILERS"]))
    errors += _check_reconcile_numbers()
    paths = raw.get("RECONCILERS") or []
    if isinstance(paths, list | tuple) and POSTFIX_RECONCILER in paths:
        errors += _check_postfix_log()
    return errors


def _check_reconciler_paths(paths: Any) -> list[CheckMessage]:
    from .reconcilers import Reconciler

    if not isinstance(paths, list | tuple) or not all(isinstance(p, str) for p in paths):
        return [
            Error(
                f"OUTBOX['RECONCILERS'] is {paths!r}; it must be a list of dotted paths.",
                hint="For example ['outbox.reconcilers.PostfixLogReconciler'].",
                id="outbox.E015",
            )
        ]
    errors: list[CheckMessage] = []
    for path in paths:
        try:
            found = import_string(path)
        except ImportError as exc:
            errors.append(
                Error(f"OUTBOX['RECONCILERS']: cannot import {path!r}: {exc}", id="outbox.E015")
            )
            continue
        if not (isinstance(found, type) and issubclass(found, Reconciler)):
            errors.append(
                Error(
                    f"OUTBOX['RECONCILERS']: {path!r} is not a subclass of "
                    "outbox.reconcilers.Reconciler.",
                    hint="Name a class that answers answer() or answer_many().",
                    id="outbox.E015",
                )
            )
    return errors


def _check_reconcile_numbers() -> list[CheckMessage]:
    try:
        batch = outbox_settings.RECONCILE_BATCH
        retry = outbox_settings.RECONCILE_RETRY_AFTER
        max_age = outbox_settings.RECONCILE_MAX_AGE
    except (TypeError, ValueError) as exc:
        return [Error(f"An OUTBOX reconcile setting has the wrong type: {exc}", id="outbox.E016")]
    problems = []
    if batch < 1:
        problems.append("RECONCILE_BATCH must be at least 1")
    if not retry > 0:
        problems.append("RECONCILE_RETRY_AFTER must be a positive number of seconds")
    if not max_age > 0:
        problems.append("RECONCILE_MAX_AGE must be a positive number of seconds")
    return [Error(f"OUTBOX: {problem}.", id="outbox.E016") for problem in problems]


def _check_postfix_log() -> list[CheckMessage]:
    path = outbox_settings.POSTFIX_LOG
    if not path:
        return [
            Error(
                "OUTBOX['RECONCILERS'] lists the Postfix log reconciler, but "
                "OUTBOX['POSTFIX_LOG'] is not set.",
                hint="Set it to Postfix's mail log, e.g. '/var/log/mail.log'.",
                id="outbox.E017",
            )
        ]
    if os.access(path, os.R_OK):
        return []
    return [
        Warning(
            f"OUTBOX['POSTFIX_LOG'] is {path!r}, which this host cannot read; the Postfix "
            "reconciler will answer 'unknown' here.",
            hint="Run the sweeper where the mail log is, as a user that may read it "
            "(on Debian, a member of the 'adm' group).",
            id="outbox.W007",
        )
    ]
