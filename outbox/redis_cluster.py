"""``ClusterClient``: a django-redis client for Redis Cluster, through redis-py's ``RedisCluster``.

django-redis has no cluster client; this one lets a cache alias carry the
outbox on a cluster::

    CACHES = {
        "outbox": {
            "BACKEND": "django_redis.cache.RedisCache",
            # Any of the cluster's nodes; the client discovers the rest.
            "LOCATION": ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"],
            "OPTIONS": {"CLIENT_CLASS": "outbox.redis_cluster.ClusterClient"},
        }
    }
    OUTBOX = {"REDIS_CACHE": "outbox"}

Every LOCATION is a *startup node* of one cluster (not a primary and its
replicas, as django-redis' default client reads a list). ``SOCKET_TIMEOUT``,
``SOCKET_CONNECT_TIMEOUT``, ``USERNAME`` and ``PASSWORD`` are honoured, and
``OPTIONS["CLUSTER_KWARGS"]`` is passed on to ``RedisCluster``.

Why the outbox works on a cluster: every key it uses carries the hash tag
``{KEY_PREFIX}`` (see :mod:`outbox.queue`), so all of them live in one slot,
on one primary at a time. Scripts and pipelines therefore stay single-slot;
the few keyless commands (``TIME``) are sent to that slot's primary
(:func:`slot_target`), so the one clock stays one clock. Transactions
(``MULTI``, used by ``outbox_status``) need redis-py 6.1 or later on a cluster.

One ``RedisCluster`` is kept per process and configuration: it holds a
connection pool per node and the slot table, and it is thread-safe, so the
worker's threads share it instead of each discovering the cluster again.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured
from django_redis.client import DefaultClient
from redis import Redis
from redis.cluster import ClusterNode, RedisCluster

_clusters: dict[tuple[Any, ...], RedisCluster] = {}
_lock = threading.Lock()


def startup_nodes(locations: list[str]) -> list[ClusterNode]:
    """``ClusterNode`` of each ``redis://host:port`` (``rediss://`` too) location.

    Raises ``ImproperlyConfigured`` for what a cluster cannot be: a Unix
    socket, or a database other than 0 (a cluster has only database 0).
    """
    nodes = []
    for location in locations:
        url = urlparse(location.strip())
        if url.scheme not in ("redis", "rediss") or not url.hostname:
            raise ImproperlyConfigured(
                f"Redis Cluster LOCATION {location!r}: use redis://host:port for each node."
            )
        if url.path.strip("/") not in ("", "0"):
            raise ImproperlyConfigured(
                f"Redis Cluster LOCATION {location!r}: a cluster has only database 0."
            )
        nodes.append(ClusterNode(url.hostname, url.port or 6379))
    return nodes


def _credentials(locations: list[str]) -> dict[str, Any]:
    url = urlparse(locations[0].strip())
    found: dict[str, Any] = {}
    if url.username:
        found["username"] = unquote(url.username)
    if url.password:
        found["password"] = unquote(url.password)
    if url.scheme == "rediss":
        found["ssl"] = True
    return found


class ClusterClient(DefaultClient):
    """django-redis ``CLIENT_CLASS`` whose connection is a ``RedisCluster``."""

    def __init__(self, server: Any, params: dict[str, Any], backend: Any) -> None:
        super().__init__(server, params, backend)
        self._locations = [str(s) for s in self._server if str(s).strip()]
        self._nodes = startup_nodes(self._locations)
        # One cluster connection, whatever the number of startup nodes.
        self._clients = [None]

    def get_next_client_index(self, write: bool = True, tried: list[int] | None = None) -> int:
        return 0

    def connect(self, index: int = 0) -> Redis:
        kwargs = self._cluster_kwargs()
        key = (tuple(self._locations), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        with _lock:
            cluster = _clusters.get(key)
            if cluster is None:
                cluster = RedisCluster(startup_nodes=self._nodes, **kwargs)
                _clusters[key] = cluster
        # RedisCluster offers the commands of Redis, and is what callers get.
        return cluster  # type: ignore[return-value]

    def disconnect(self, index: int = 0, client: Any = None) -> None:
        # The cluster connection is shared by the process: close its connections
        # (they reopen on the next command), never the shared object's state.
        target = client if client is not None else self._clients[0]
        if target is not None:
            target.disconnect_connection_pools()

    def _cluster_kwargs(self) -> dict[str, Any]:
        options = self._options
        kwargs: dict[str, Any] = _credentials(self._locations)
        for option, name in (
            ("SOCKET_TIMEOUT", "socket_timeout"),
            ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
            ("USERNAME", "username"),
            ("PASSWORD", "password"),
        ):
            if options.get(option) is not None:
                kwargs[name] = options[option]
        kwargs.update(options.get("CLUSTER_KWARGS", {}))
        return kwargs


def is_cluster(connection: Any) -> bool:
    return isinstance(connection, RedisCluster)


def slot_target(connection: Any, key: str) -> dict[str, Any]:
    """Keyword arguments that send a keyless command to the primary holding ``key``.

    Empty for a plain ``Redis``. On a cluster, ``TIME`` would otherwise go to
    a random node, whose clock need not be the clock the scripts read.
    """
    if not is_cluster(connection):
        return {}
    return {"target_nodes": connection.get_node_from_key(key)}
