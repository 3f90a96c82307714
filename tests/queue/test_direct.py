"""The push after a commit on a connection of outbox.queue.direct, and its way back to the client's path.

Each test has a redis-server of its own (and so a connection pool and a free
list of its own, which no other test's threads can touch): the free list, a
script Redis forgot, a connection the server cut, a stalled or restarted
server, threads and a forked child.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis
from redis.sentinel import Sentinel

from outbox.queue import QueueEntry, RedisQueue
from outbox.queue.direct import DirectConnections, direct_connections


@pytest.fixture
def queue(redis_server) -> RedisQueue:
    return RedisQueue(redis_server.client())


def _direct(queue: RedisQueue) -> DirectConnections:
    direct = direct_connections(queue.redis)
    assert direct is not None, "a plain redis.Redis on a ConnectionPool"
    return direct


def _waiting(queue: RedisQueue) -> set[int]:
    return {int(i) for i in queue.redis.lrange(queue.ready_key("normal"), 0, -1)}


def _entry(pk: int) -> QueueEntry:
    return QueueEntry(pk, "normal", time.time())


def test_a_push_goes_on_a_reused_connection_and_lands(queue):
    direct = _direct(queue)
    assert direct.idle() == 0
    assert queue.push([_entry(1)]) == 1
    assert queue.push([_entry(2)]) == 1
    assert queue.push([_entry(2)]) == 0  # the dedup set still decides
    assert _waiting(queue) == {1, 2}
    # One connection, made once and given back after each push.
    assert direct.idle() == 1


def test_a_script_redis_forgot_is_pushed_through_the_client_and_reloaded(queue):
    direct = _direct(queue)
    queue.push([_entry(1)])
    queue.redis.script_flush()
    assert queue.push([_entry(2)]) == 1  # NOSCRIPT on the direct path, then the client's
    assert queue.push([_entry(3)]) == 1  # the client loaded it again: direct works again
    assert _waiting(queue) == {1, 2, 3}
    assert direct.idle() == 1  # an error reply leaves the connection usable


def test_a_connection_the_server_cut_is_replaced_and_nothing_is_lost(queue):
    direct = _direct(queue)
    queue.push([_entry(1)])
    # Every other client of this server goes, the free list's connection too.
    killed = queue.redis.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    assert queue.push([_entry(2)]) == 1
    assert queue.push([_entry(3)]) == 1
    assert _waiting(queue) == {1, 2, 3}
    assert direct.idle() == 1  # the cut one closed, a new one in its place


def test_threads_pushing_at_once_each_get_a_connection_of_their_own(queue):
    direct = _direct(queue)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def pusher(base: int) -> None:
        try:
            start.wait()
            for n in range(50):
                queue.push([_entry(base + n)])
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=pusher, args=(1000 * t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _waiting(queue) == {1000 * t + n for t in range(8) for n in range(50)}
    # Replies never went to the wrong thread (each push returned and counted
    # once above), and the list holds no more connections than pushers.
    assert 1 <= direct.idle() <= 8


# Earlier tests may leave idle threads in this process (asgiref's executor after
# the async enqueue tests): Python 3.12 then warns about fork(). The child here
# only pushes through a fresh connection and exits.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_opens_its_own_connection(queue):
    direct = _direct(queue)
    queue.push([_entry(1)])
    parents = list(direct._idle)
    assert parents
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        code = 1
        try:
            queue.push([_entry(2)])
            mine = list(direct._idle)
            code = 0 if mine and not any(c in parents for c in mine) else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    try:
        child_said = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert child_said == bytes([0]), "the child pushed on a connection of its parent"
    # The parent's connection still answers the parent, not a reply meant for the child.
    assert queue.push([_entry(3)]) == 1
    assert direct._idle == parents
    assert _waiting(queue) == {1, 2, 3}


def test_clients_whose_pool_knows_more_keep_the_client_path():
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool(host="127.0.0.1"))
    assert direct_connections(blocking) is None
    sentinel = Sentinel([("127.0.0.1", 1)])  # no connection is made to build the client
    assert direct_connections(sentinel.master_for("mymaster")) is None
    assert direct_connections(redis.Redis(host="127.0.0.1")) is not None


def test_a_stalled_redis_times_out_once_not_again_through_the_client(redis_server):
    # A client of its own, with a short socket timeout.
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=0.3)
    queue = RedisQueue(client)
    queue.push([_entry(1)])
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            queue.push([_entry(2)])
        waited = time.monotonic() - started
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    # One socket timeout: the client's path (with its own retries) was not
    # tried after it, which would have waited at least as long again.
    assert 0.3 <= waited < 2.0  # through the client: several seconds more
    assert queue.push([_entry(3)]) == 1
    assert {int(i) for i in client.lrange(queue.ready_key("normal"), 0, -1)} >= {1, 3}


def test_a_restarted_redis_gets_the_script_again_and_the_push(redis_server, queue):
    queue.push([_entry(1)])
    redis_server.restart()  # a new process: no keys, no scripts, the connection broken
    assert queue.push([_entry(2)]) == 1
    assert queue.push([_entry(3)]) == 1
    assert _waiting(queue) == {2, 3}
