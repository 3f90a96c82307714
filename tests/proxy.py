"""A fault-injecting TCP proxy on loopback, for tests of a client against a real server.

``with FaultProxy(redis_server.port) as proxy:`` listens on ``127.0.0.1:proxy.port``
(``FaultProxy(a.port, pool=[b.port])``: each new connection goes to the next
server in turn, a round-robin balancer in front of a pool);
``lost = proxy.swallow_reply(b"INCR")`` loses the reply to the next INCR;
``wait_until(lambda: lost.fired == 1)``. With ``refuse_after=2.0`` the server
then goes away at that very moment: every connection is cut and new ones are
refused for 2 s (no test thread could react between the two in time).

One background thread (a selector loop) forwards every connection to the
target; :meth:`FaultProxy.close` (or leaving the ``with``) stops it and closes
every socket. Faults may be added, and removed with :meth:`Fault.remove`,
from any thread while connections are open. Directions: ``"up"`` is client to
server, ``"down"`` server to client. A pattern is ``bytes`` (matched
literally) or a compiled ``re.Pattern[bytes]``; it is matched across chunk
boundaries (a tail of :data:`TAIL` bytes per direction is kept), and every
occurrence counts, on all connections together, so that ``nth=3`` means the
third matching request the proxy saw.
"""

from __future__ import annotations

import re
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Pattern = bytes | re.Pattern[bytes]
# How much of each direction's stream is kept to match a pattern that straddles chunks.
TAIL = 512
# How much a direction may buffer before the proxy stops reading its source.
BUFFER_LIMIT = 1 << 20
UP, DOWN = "up", "down"


@dataclass(eq=False)
class Fault:
    """One fault; see the :class:`FaultProxy` method that made it. Counters are live."""

    kind: str
    pattern: Pattern | None = None
    direction: str = UP  # where the pattern is looked for
    nth: int = 1
    times: int | None = 1  # how many matches (from the nth on) fire it; None: all
    options: dict[str, Any] = field(default_factory=dict)
    matches: int = 0  # occurrences of the pattern seen
    fired: int = 0  # times it acted
    proxy: FaultProxy | None = None

    def remove(self) -> None:
        if self.proxy is not None:
            self.proxy._remove(self)

    def _hits(self, window: bytes, new_from: int) -> int:
        """Occurrences in ``window`` that end in its new part (past ``new_from``)."""
        assert self.pattern is not None
        if isinstance(self.pattern, bytes):
            count, start = 0, max(0, new_from - len(self.pattern) + 1)
            while (found := window.find(self.pattern, start)) >= 0:
                count, start = count + 1, found + 1
            return count
        return sum(1 for m in self.pattern.finditer(window) if m.end() > new_from)

    def _count(self, hits: int) -> bool:
        """Add ``hits`` matches; whether one of them fires the fault (caller holds the lock)."""
        self.matches += hits
        if self.matches < self.nth or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


class _Flow:
    """One direction of one connection: from ``src`` to ``dst``."""

    def __init__(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        self.src, self.dst, self.direction = src, dst, direction
        self.tail = b""
        self.out = bytearray()  # due now
        self.later: deque[tuple[float, bytes]] = deque()  # delayed or trickled
        self.last_release = 0.0
        self.src_eof = False
        self.dst_shut = False
        self.cut_when_drained = False
        self.refuse_after = 0.0  # with cut_when_drained: then the server goes away

    def drained(self) -> bool:
        return not self.out and not self.later

    def buffered(self) -> int:
        return len(self.out) + sum(len(b) for _, b in self.later)


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.up = _Flow(client, server, UP)
        self.down = _Flow(server, client, DOWN)
        self.swallow: Fault | None = None  # a reply to drop is awaited
        self.blackhole = False  # drop everything from the server
        self.armed: set[int] = set()  # ids of delay/trickle faults a pattern switched on here
        self.masks: dict[socket.socket, int] = {client: 0, server: 0}
        self.closed = False


def _close(sock: socket.socket, reset: bool) -> None:
    if reset:
        try:  # SO_LINGER 0: close() sends a RST, as a crashed peer or a middlebox would
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    sock.close()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:self.port`` to ``host:port``, with faults to inject."""

    def __init__(self, port: int, host: str = "127.0.0.1", *, pool: Sequence[int] = ()) -> None:
        self.target = (host, port)
        # With a pool, each new connection goes to the next of these, in turn:
        # one address in front of several servers, as a load balancer is.
        self.targets = [self.target, *((host, p) for p in pool)]
        self.next_target = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.conns: list[_Conn] = []
        self.refuse_until = 0.0
        self.accepted = 0  # connections forwarded
        self.refused = 0  # connections closed at once by refuse()
        self.up_bytes = 0  # read from clients
        self.down_bytes = 0  # read from the server
        self._commands: list[tuple[bool, threading.Event]] = []
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}")
        self.thread.daemon = True

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> FaultProxy:
        if not self.thread.is_alive():
            self.thread.start()
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread and close every socket, the listener's included."""
        self._stop = True
        self._wake()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
            assert not self.thread.is_alive(), "the proxy thread did not stop"
        elif self.thread.ident is None:
            self._close_all()

    @property
    def open_connections(self) -> int:
        with self.lock:
            return sum(1 for c in self.conns if not c.closed)

    # -- faults -----------------------------------------------------------------------

    def swallow_reply(
        self,
        pattern: Pattern,
        *,
        then="cut",
        nth=1,
        times: int | None = 1,
        reset=False,
        refuse_after=0.0,
    ) -> Fault:
        """After the client sends ``pattern``, drop the server's next chunk on that connection.

        The request reached the server; its reply is lost. ``then="cut"``:
        the connection is then closed (the client sees EOF, or a RST with
        ``reset``); ``"hold"``: it stays open and all the server sends on it
        is dropped, so the client waits for its own timeout. ``refuse_after``
        (seconds): once the reply is dropped, every other connection is cut
        too (with a RST) and new ones are refused for that long.
        """
        assert then in ("cut", "hold"), then
        options = {"then": then, "reset": reset, "refuse_after": refuse_after}
        return self._add(Fault("swallow", pattern, UP, nth, times, options))

    def cut_on(
        self,
        pattern: Pattern,
        *,
        direction=UP,
        when="before",
        nth=1,
        times: int | None = 1,
        reset=False,
        refuse_after=0.0,
    ) -> Fault:
        """Cut the connection when ``pattern`` passes in ``direction``.

        ``when="before"``: the chunk holding it is not forwarded (the request
        never arrives whole; with ``direction="down"``, a reply that is lost);
        ``"after"``: it is, then the cut (the request arrives, its reply is
        lost). ``refuse_after``: as for :meth:`swallow_reply`, from the cut.
        """
        assert direction in (UP, DOWN) and when in ("before", "after"), (direction, when)
        options = {"when": when, "reset": reset, "refuse_after": refuse_after}
        return self._add(Fault("cut", pattern, direction, nth, times, options))

    def delay(self, seconds: float, *, direction=DOWN, after: Pattern | None = None) -> Fault:
        """Hold each chunk in ``direction`` for ``seconds`` (order kept); ``after``: see trickle."""
        return self._add(Fault("delay", after, UP, 1, None, {"on": direction, "seconds": seconds}))

    def trickle(self, interval: float, *, direction=DOWN, after: Pattern | None = None) -> Fault:
        """Forward ``direction`` one byte at a time, ``interval`` seconds before each byte.

        With ``after``: only on a connection whose client sent that pattern,
        from then on (``after=b"\\r\\n.\\r\\n"``: the reply to SMTP's final dot).
        """
        options = {"on": direction, "seconds": interval}
        return self._add(Fault("trickle", after, UP, 1, None, options))

    def refuse(self, seconds: float) -> None:
        """For ``seconds`` from now, close each new connection at once (with a RST)."""
        with self.lock:
            self.refuse_until = time.monotonic() + seconds

    def cut_all(self, reset: bool = False) -> None:
        """Cut every open connection; returns once they are closed."""
        done = threading.Event()
        with self.lock:
            self._commands.append((reset, done))
        self._wake()
        assert done.wait(10), "the proxy thread did not cut the connections"

    def clear(self) -> None:
        """Remove every fault and stop refusing (connections already switched stay so)."""
        with self.lock:
            self.faults.clear()
            self.refuse_until = 0.0

    def _add(self, fault: Fault) -> Fault:
        fault.proxy = self
        with self.lock:
            self.faults.append(fault)
        return fault

    def _remove(self, fault: Fault) -> None:
        with self.lock:
            if fault in self.faults:
                self.faults.remove(fault)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # already closed, or the pipe is full: the loop will look anyway
            pass

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop:
                for key, mask in self.selector.select(self._timeout()):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(4096)  # the loop looks at everything anyway
                    else:
                        self._io(key.data, key.fileobj, mask)  # type: ignore[arg-type]
                self._run_commands()
                for conn in list(self.conns):
                    self._progress(conn)
        finally:
            self._close_all()

    def _timeout(self) -> float:
        due = [f.later[0][0] for c in self.conns for f in (c.up, c.down) if f.later]
        return max(0.0, min(due) - time.monotonic()) if due else 1.0

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            with self.lock:
                refusing = time.monotonic() < self.refuse_until
                self.refused += refusing
            if refusing:
                _close(client, reset=True)
                continue
            target = self.targets[self.next_target % len(self.targets)]
            self.next_target += 1
            try:
                server = socket.create_connection(target, timeout=5)
            except OSError:
                _close(client, reset=True)
                continue
            for sock in (client, server):
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns.append(_Conn(client, server))
                self.accepted += 1

    def _run_commands(self) -> None:
        with self.lock:
            commands, self._commands = self._commands, []
        for reset, done in commands:
            for conn in list(self.conns):
                self._cut(conn, reset)
            done.set()

    def _io(self, conn: _Conn, sock: socket.socket, mask: int) -> None:
        if conn.closed:
            return
        if mask & selectors.EVENT_WRITE:
            self._flush(conn, conn.up if sock is conn.server else conn.down)
        if mask & selectors.EVENT_READ and not conn.closed:
            self._read(conn, conn.up if sock is conn.client else conn.down)

    def _read(self, conn: _Conn, flow: _Flow) -> None:
        try:
            data = flow.src.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._cut(conn, reset=True)
            return
        if not data:
            flow.src_eof = True
            return
        with self.lock:
            if flow.direction == UP:
                self.up_bytes += len(data)
            else:
                self.down_bytes += len(data)
        self._chunk(conn, flow, data)

    def _chunk(self, conn: _Conn, flow: _Flow, data: bytes) -> None:
        """Apply the faults to one chunk read from ``flow.src``, then forward what is left."""
        if flow.direction == DOWN and (conn.swallow is not None or conn.blackhole):
            swallowed, conn.swallow = conn.swallow, None
            if swallowed is not None and swallowed.options["then"] == "cut":
                self._cut(conn, swallowed.options["reset"])
            else:
                conn.blackhole = True
            if swallowed is not None and swallowed.options.get("refuse_after"):
                self._go_away(swallowed.options["refuse_after"])
            return
        window = flow.tail + data
        new_from, flow.tail = len(flow.tail), window[-TAIL:]
        with self.lock:
            faults = list(self.faults)
            fired = [
                f
                for f in faults
                if f.pattern is not None
                and f.direction == flow.direction
                and (hits := f._hits(window, new_from))
                and f._count(hits)
            ]
        cut_after: Fault | None = None
        for fault in fired:
            if fault.kind == "swallow":
                conn.swallow = fault
            elif fault.kind in ("delay", "trickle"):
                conn.armed.add(id(fault))
            elif fault.options["when"] == "before":
                self._cut(conn, fault.options["reset"])
                if fault.options.get("refuse_after"):
                    self._go_away(fault.options["refuse_after"])
                return
            else:
                cut_after = fault
        self._forward(conn, flow, data, faults)
        if cut_after is not None:
            flow.cut_when_drained = True
            flow.refuse_after = cut_after.options.get("refuse_after", 0.0)

    def _forward(self, conn: _Conn, flow: _Flow, data: bytes, faults: list[Fault]) -> None:
        delay = interval = 0.0
        for f in faults:
            if f.kind not in ("delay", "trickle") or f.options["on"] != flow.direction:
                continue
            if f.pattern is None or id(f) in conn.armed:
                if f.kind == "delay":
                    delay += f.options["seconds"]
                else:
                    interval = max(interval, f.options["seconds"])
        now = time.monotonic()
        if not delay and not interval and not flow.later:
            flow.out += data
            return
        release = max(now + delay, flow.last_release)
        if interval:
            for i in range(len(data)):
                release += interval
                flow.later.append((release, data[i : i + 1]))
        else:
            flow.later.append((release, data))
        flow.last_release = release

    def _progress(self, conn: _Conn) -> None:
        """Release due data, write what can be written, close what is done, set the masks."""
        if conn.closed:
            return
        now = time.monotonic()
        for flow in (conn.up, conn.down):
            while flow.later and flow.later[0][0] <= now:
                flow.out += flow.later.popleft()[1]
            if flow.out:
                self._flush(conn, flow)
            if conn.closed:
                return
            if flow.drained() and flow.cut_when_drained:
                self._cut(conn, reset=False)
                if flow.refuse_after:
                    self._go_away(flow.refuse_after)
                return
            if flow.src_eof and flow.drained() and not flow.dst_shut:
                flow.dst_shut = True
                try:
                    flow.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if conn.up.dst_shut and conn.down.dst_shut:
            self._cut(conn, reset=False)
            return
        for sock, reading, writing in (
            (conn.client, conn.up, conn.down),
            (conn.server, conn.down, conn.up),
        ):
            mask = 0
            if not reading.src_eof and reading.buffered() < BUFFER_LIMIT:
                mask |= selectors.EVENT_READ
            if writing.out:
                mask |= selectors.EVENT_WRITE
            self._set_mask(conn, sock, mask)

    def _flush(self, conn: _Conn, flow: _Flow) -> None:
        try:
            sent = flow.dst.send(flow.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._cut(conn, reset=True)
            return
        del flow.out[:sent]

    def _set_mask(self, conn: _Conn, sock: socket.socket, mask: int) -> None:
        old = conn.masks[sock]
        if mask == old:
            return
        if not old:
            self.selector.register(sock, mask, conn)
        elif not mask:
            self.selector.unregister(sock)
        else:
            self.selector.modify(sock, mask, conn)
        conn.masks[sock] = mask

    def _go_away(self, seconds: float) -> None:
        """The server goes away now: cut every connection, refuse new ones for ``seconds``."""
        with self.lock:
            self.refuse_until = time.monotonic() + seconds
        for conn in list(self.conns):
            self._cut(conn, reset=True)

    def _cut(self, conn: _Conn, reset: bool) -> None:
        if conn.closed:
            return
        for sock in (conn.client, conn.server):
            if conn.masks[sock]:
                self.selector.unregister(sock)
                conn.masks[sock] = 0
            _close(sock, reset)
        with self.lock:
            conn.closed = True
            self.conns.remove(conn)

    def _close_all(self) -> None:
        for conn in list(self.conns):
            self._cut(conn, reset=False)
        for sock in (self.listener, self._wake_r, self._wake_w):
            sock.close()
        self.selector.close()
