"""Django settings of the chaos run: the test suite's settings, with a short SEND_TIMEOUT.

The chaos run's stalling SMTP server never answers some messages; the workers
must give up on them within ``OUTBOX["SEND_TIMEOUT"]``, which is set here from
OUTBOX_CHAOS_SEND_TIMEOUT (seconds, default 6) so that a stall costs a thread a
few seconds, not the default minute. It is longer than HEARTBEAT_TIMEOUT (3 s)
so that a slow but answered send (faults/long_send.py) outlives a heartbeat
timeout.

Each PostgreSQL session is named ``chaos-<pid>`` (``application_name``), so that
the harness can tell from pg_stat_activity which worker process waits on a
lock (faults/row_lock.py), whether it connects directly or through a proxy.
With OUTBOX_CHAOS_REDIS_RETRY=0 the Redis client does not retry a command on
a broken connection (redis-py does, by default): a proxied worker's lost reply
then reaches the worker's own code (see tests/chaos/network.py).
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import CACHES, DATABASES, OUTBOX

OUTBOX["SEND_TIMEOUT"] = float(os.environ.get("OUTBOX_CHAOS_SEND_TIMEOUT", "6"))

if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = f"chaos-{os.getpid()}"

if os.environ.get("OUTBOX_CHAOS_REDIS_RETRY") == "0":
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    CACHES["default"]["OPTIONS"]["CONNECTION_POOL_KWARGS"] = {"retry": Retry(NoBackoff(), 0)}
