"""tests/proxy.py, the fault-injecting TCP proxy, against a real redis-server and SMTP server.

The clients are made not to retry (redis-py retries a failed command by
default), so that each fault shows as the one failure it causes.
"""

from __future__ import annotations

import re
import smtplib
import socket
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.proxy import FaultProxy
from tests.servers import RedisServer, SMTPRecorder, wait_until
from tests.servers import sample_message as message

PING = b"*1\r\n$4\r\nPING\r\n"


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as started:
        yield started


@pytest.fixture
def through(proxy: FaultProxy) -> Iterator[redis.Redis]:
    """A redis-py client through the proxy, with a short socket timeout and no retries."""
    client = redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=0.5,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    yield client
    client.close()


@pytest.fixture
def direct(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def raw_connection(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    sock.sendall(PING)
    assert sock.recv(100) == b"+PONG\r\n"
    return sock


def answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_it_forwards_both_ways_and_counts(proxy, through):
    assert through.set("k", "v")
    assert through.get("k") == b"v"
    assert proxy.accepted == 1 and proxy.open_connections == 1
    assert proxy.up_bytes > 0 and proxy.down_bytes > 0


@pytest.mark.parametrize("then", ["hold", "cut"])
def test_a_swallowed_reply_fails_the_call_though_the_command_ran(proxy, through, direct, then):
    lost = proxy.swallow_reply(b"INCR", then=then)

    expected = redis.TimeoutError if then == "hold" else redis.ConnectionError
    with pytest.raises(expected):
        through.incr("n")

    assert direct.get("n") == b"1"  # it took effect; only the answer was lost
    assert (lost.matches, lost.fired) == (1, 1)
    assert through.incr("n") == 2  # only once: the next one goes through


def test_a_swallowed_evalsha_of_one_script(proxy, through, direct):
    sha = direct.script_load("return redis.call('INCR', KEYS[1])")
    other = direct.script_load("return redis.call('GET', KEYS[1])")
    lost = proxy.swallow_reply(re.compile(rb"EVALSHA\r\n\$40\r\n" + sha.encode()), then="hold")

    assert through.evalsha(other, 1, "n") is None  # another script's reply passes
    with pytest.raises(redis.TimeoutError):
        through.evalsha(sha, 1, "n")

    assert direct.get("n") == b"1"
    assert lost.fired == 1


def test_the_nth_match_fires_only_once(proxy, through, direct):
    lost = proxy.swallow_reply(b"INCR", nth=2, then="cut")

    assert through.incr("n") == 1
    with pytest.raises(redis.ConnectionError):
        through.incr("n")
    assert through.incr("n") == 3

    assert (lost.matches, lost.fired) == (3, 1)
    assert proxy.accepted == 2  # the client reconnected after the cut


@pytest.mark.parametrize(("when", "ran"), [("before", None), ("after", b"1")])
def test_cut_on_a_request_before_or_after_forwarding_it(proxy, through, direct, when, ran):
    cut = proxy.cut_on(b"INCR", when=when)

    with pytest.raises(redis.ConnectionError):
        through.incr("n")

    # "after": the server got the command; give it the moment it needs to run it.
    wait_until(lambda: direct.get("n") == ran, timeout=2)
    assert direct.get("n") == ran
    assert cut.fired == 1
    wait_until(lambda: proxy.open_connections == 0, timeout=2)


def test_a_pattern_that_straddles_two_chunks_is_seen(proxy, direct):
    cut = proxy.cut_on(b"INCR", when="before")
    sock = raw_connection(proxy)
    first = b"*2\r\n$4\r\nIN"
    sent = proxy.up_bytes
    sock.sendall(first)
    wait_until(lambda: proxy.up_bytes == sent + len(first))  # read as a chunk of its own

    sock.sendall(b"CR\r\n$1\r\nn\r\n")

    assert sock.recv(100) == b""  # cut
    sock.close()
    assert cut.matches == 1
    assert direct.get("n") is None  # the request never arrived whole


def test_a_cut_on_a_server_reply(proxy, through, direct):
    proxy.cut_on(b"+PONG", direction="down", reset=True)

    with pytest.raises(redis.ConnectionError):
        through.ping()
    assert through.ping() is True


def test_refused_for_a_while_then_accepted(proxy, through):
    proxy.refuse(0.5)

    with pytest.raises(redis.ConnectionError):
        through.ping()
    assert proxy.refused >= 1 and proxy.accepted == 0

    wait_until(lambda: answers(through), timeout=5)
    assert proxy.accepted == 1


@pytest.mark.parametrize("reset", [False, True])
def test_cut_all_closes_every_open_connection_now(proxy, reset):
    socks = [raw_connection(proxy) for _ in range(2)]
    assert proxy.open_connections == 2

    proxy.cut_all(reset=reset)

    assert proxy.open_connections == 0
    for sock in socks:
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            assert reset
        sock.close()


def test_close_leaves_no_thread_and_no_socket(redis_server):
    proxy = FaultProxy(redis_server.port).start()
    sock = raw_connection(proxy)
    port = proxy.port

    proxy.close()

    assert not proxy.thread.is_alive()
    assert sock.recv(100) == b""
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_delay_holds_each_chunk(proxy, through):
    through.ping()  # connected: what follows is one round trip
    slow = proxy.delay(0.3)
    started = time.monotonic()
    assert through.ping() is True
    assert time.monotonic() - started >= 0.3

    slow.remove()
    started = time.monotonic()
    assert through.ping() is True
    assert time.monotonic() - started < 0.3


def test_trickle_up_sends_one_byte_at_a_time(proxy, through):
    through.ping()  # connected: what follows is the command alone
    proxy.trickle(0.01, direction="up")
    started = time.monotonic()
    assert through.ping() is True
    assert time.monotonic() - started >= len(PING) * 0.01


@pytest.fixture
def smtp_proxy() -> Iterator[tuple[SMTPRecorder, FaultProxy]]:
    server = SMTPRecorder().start()
    try:
        with FaultProxy(server.port) as proxy:
            yield server, proxy
    finally:
        server.stop()


def test_trickle_down_slows_an_smtp_greeting(smtp_proxy):
    _server, proxy = smtp_proxy
    proxy.trickle(0.01)
    started = time.monotonic()

    connection = smtplib.SMTP("127.0.0.1", proxy.port, timeout=5)

    greeting = proxy.down_bytes
    assert greeting > 20
    assert time.monotonic() - started >= greeting * 0.01
    connection.close()


def test_trickle_after_the_final_dot_slows_only_that_reply(smtp_proxy):
    server, proxy = smtp_proxy
    connection = smtplib.SMTP("127.0.0.1", proxy.port, timeout=5)
    connection.ehlo()
    proxy.trickle(0.01, after=b"\r\n.\r\n")
    msg = message().message().as_bytes()

    started = time.monotonic()
    connection.sendmail("shop@example.com", ["a@example.com"], msg)
    elapsed = time.monotonic() - started

    assert server.count() == 1
    assert elapsed >= len(b"250 Message accepted for delivery\r\n") * 0.01
    connection.close()
