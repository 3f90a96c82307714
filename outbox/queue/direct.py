"""One Redis script call without the client's per-command bookkeeping: the push after a commit.

Why: a one-recipient ``enqueue_email`` pushes one id after its commit, and
going through ``Redis.execute_command`` (the pool's lock and accounting around
taking and giving back a connection, the retry wrapper, the ``Script``
object's checks) cost the web request about as much CPU as everything else the
call does in Python: measured on redis-py 8, about 100 µs of client CPU for a
push against about 40 µs for the same command sent on a connection at hand
(redis-py 8.1, a loaded 2-core machine: 100 against 36 to 54 µs; taking a
connection from the pool, ``pool.get_connection()``, alone costs 75).

Only public parts of redis-py are used: each connection is made by the
client's own pool class and options (``pool.connection_class``,
``pool.connection_kwargs``: host or socket, TLS, credentials, database,
timeouts, protocol), the command is written by the connection's
``send_command`` and its reply read by ``read_response``. What is left out,
on purpose:

- the pool's accounting: these connections are not counted against the pool's
  ``max_connections``. There are at most as many as threads pushing at the
  same moment, kept in a free list and reused;
- retries: after an error reply or a broken connection here, the caller
  (:meth:`outbox.queue.RedisQueue.push`) runs the push again through the
  client, which reloads a script Redis forgot and reconnects; a timeout is
  raised at once, not waited out a second time. Running a push twice is safe:
  the dedup set stops a second push of an id that already waits, and a forced
  push that lands twice leaves a duplicate id, which a worker's conditional
  UPDATE makes harmless.

Only a plain ``redis.Redis`` on a plain ``ConnectionPool`` takes this path: a
cluster, a Sentinel-managed pool (whose connections find the primary through
it), a blocking pool or client-side caching keep the client's own path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from weakref import WeakKeyDictionary

from redis import ConnectionPool, Redis, ResponseError
from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError

_by_pool: WeakKeyDictionary[ConnectionPool, DirectConnections] = WeakKeyDictionary()


def direct_connections(client: Redis) -> DirectConnections | None:
    """The free list for ``client``'s pool, or None where the client's own path must run."""
    pool = getattr(client, "connection_pool", None)
    if (
        type(client) is not Redis
        or type(pool) is not ConnectionPool
        or getattr(pool, "cache", None) is not None
    ):
        return None
    found = _by_pool.get(pool)
    if found is None:
        # Two threads may both get here; one list wins and the other's
        # connections (none yet) are simply dropped.
        found = _by_pool.setdefault(pool, DirectConnections(pool))
    return found


class DirectConnections:
    """Connections made like those of one pool, each used by one thread at a time."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._idle: list[Any] = []
        self._pid = os.getpid()

    def evalsha(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run ``script`` by its SHA1 and return its reply, or None: run it through the client.

        None after an error reply (above all NOSCRIPT: Redis restarted and
        forgot the script, and the client loads it again), which leaves the
        connection reusable, or after a broken connection (the server closed
        an idle one, and the client reconnects), which is closed. A timeout
        raises: Redis is slow or away, and the client would wait as long again.
        """
        connection = self._take()
        try:
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            reply = connection.read_response()
        except ResponseError:
            self._idle.append(connection)
            return None
        except RedisConnectionError:
            connection.disconnect()
            return None
        except BaseException:  # a timeout, or an interrupt: a reply may still be on its way
            connection.disconnect()
            raise
        self._idle.append(connection)
        return reply

    def idle(self) -> int:
        """How many connections wait in the free list (for tests and diagnostics)."""
        return len(self._idle)

    def _take(self) -> Any:
        if self._pid != os.getpid():
            # A forked child must not talk on its parent's sockets: it starts
            # its own list (the parent's connections are left to the parent).
            self._idle = []
            self._pid = os.getpid()
        try:
            # list.pop and list.append are atomic: no lock is needed for the
            # free list, and no two threads ever hold the same connection.
            return self._idle.pop()
        except IndexError:
            return self._pool.connection_class(**self._pool.connection_kwargs)
