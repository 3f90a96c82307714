"""``outbox_worker --processes N``: start N worker processes and keep them running.

One command uses N cores without N service units: the supervisor starts N
children, each an ordinary single worker (what ``outbox_worker`` without
``--processes`` runs) in its own OS process, restarts a child that dies, and
passes SIGTERM/SIGINT on to all of them.

Where ``os.fork`` exists, a child is forked from the supervisor, which has
Django and the app loaded already: it starts delivering at once instead of
paying the Python and Django start-up again (most of a second), and shares the
loaded code's memory. The supervisor forks only from its single thread and
holds no database connection when it does (Redis clients notice the fork and
reconnect). Elsewhere each child is the ``outbox_worker`` command run again.

Why it is safe: the supervisor delivers nothing and holds no database or Redis
connection; it only starts, signals (always by pid, never by name) and reaps its
own children. Each child is an independent worker with its own incarnation
(``<name>#<suffix>``), exactly as if it had been started by hand, so nothing in
the delivery protocol changes. A child that is killed leaves what it had in hand
to the sweeper, as any dead worker does; its replacement is a new incarnation
and never takes over the old one's claims.

The rules:

- a child that dies unexpectedly (killed by a signal, or exit status other than
  0) is restarted after a backoff: 1 s, doubling up to 30 s, back to 1 s once a
  child has lived 60 s. Each restart is logged at WARNING with the pid and the
  exit status;
- a child that exits 0 was asked to stop (by the supervisor, or by whoever
  signalled it directly, such as systemd signalling the whole control group) and
  is not restarted. The supervisor exits when no child is left;
- with ``--burst`` no child is restarted: a burst run is a one-off job, and a
  child that fails should fail the job rather than crash in a loop. The exit
  status is 0 if every child exited 0, the children's exit status if all that
  failed exited alike (75: they gave up on an unreachable Redis or database),
  else 1;
- the first SIGTERM or SIGINT is passed on to every child as SIGTERM (each
  finishes the messages in hand and exits 0), then the supervisor exits 0 when
  all have. SIGTERM, not SIGINT: a terminal's Ctrl-C already reaches the
  children, which share the supervisor's process group, and a worker treats a
  second SIGINT as "exit at once";
- a second SIGINT sends SIGKILL to every child still running and exits 130 at
  once, like a single worker's second interrupt. Their messages in hand are the
  sweeper's.

If the supervisor itself is SIGKILLed its children carry on as ordinary
workers until signalled (systemd's default ``KillMode=control-group`` stops
them with the unit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from django.db import connections

logger = logging.getLogger("outbox.worker.supervisor")

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
# A child that lived this long was healthy: its next restart waits FIRST_BACKOFF again.
STABLE_AFTER = 60.0
# How often the supervisor looks at its children and at the signals it received,
# at the latest: a child's exit (SIGCHLD) and SIGTERM/SIGINT wake it at once.
TICK = 0.1
# Exit status after a second SIGINT, as a single worker's.
INTERRUPTED = 130


def child_command(arguments: Sequence[str]) -> list[str]:
    """The command line that runs this program again with ``arguments``.

    ``python manage.py ...`` (or ``django-admin``) is re-run as it was started;
    ``python -m django ...`` is re-run with ``-m django``. Either way the child
    finds the same settings: it inherits the environment (with
    DJANGO_SETTINGS_MODULE) and the working directory.
    """
    script = sys.argv[0] if sys.argv else ""
    if script and os.path.isfile(script) and os.path.basename(script) != "__main__.py":
        return [sys.executable, script, *arguments]
    return [sys.executable, "-m", "django", *arguments]


def describe_exit(returncode: int) -> str:
    """``exit status 1`` or ``killed by SIGKILL``."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


class ForkedProcess:
    """A forked child, with the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, target: Callable[[], int], close_in_child: tuple[int, ...] = ()) -> None:
        self.returncode: int | None = None
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _run_forked(target, close_in_child)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _pid, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Never once reaped: the pid may belong to another process by now.
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_forked(target: Callable[[], int], close_in_child: tuple[int, ...]) -> NoReturn:
    """The body of a forked child: run ``target`` and exit with its status."""
    code = 1
    try:
        for fd in close_in_child:  # the supervisor's, not the worker's
            os.close(fd)
        # The supervisor's handlers only set its flags; the worker installs its own.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        code = target()
    except BaseException:
        logger.exception("worker process crashed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class Child:
    """One slot of the supervisor: the process running in it now, if any.

    ``start`` forks and runs a worker in the child; without it, ``argv`` is
    the command line of the child process.
    """

    index: int
    argv: list[str]
    start: Callable[[], int] | None = None
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None
    started: float = 0.0
    restart_at: float = 0.0
    backoff: float = FIRST_BACKOFF
    returncode: int | None = None
    stop_sent: bool = False
    done: bool = False


class Supervisor:
    """Run one child process per command line in ``argvs`` until they are done."""

    def __init__(
        self,
        argvs: Sequence[Sequence[str]],
        *,
        burst: bool = False,
        targets: Sequence[Callable[[], int]] | None = None,
    ) -> None:
        """``argvs``: each child's command line; ``targets``, where fork exists: what
        each child runs instead, forked (``argvs`` then only name them in logs)."""
        if not argvs:
            raise ValueError("at least one child is needed")
        if targets is not None and len(targets) != len(argvs):
            raise ValueError("one target per child is needed")
        can_fork = hasattr(os, "fork")
        self.children = [
            Child(i, list(argv), targets[i] if targets is not None and can_fork else None)
            for i, argv in enumerate(argvs)
        ]
        self.burst = burst
        # Set by the signal handler only; the main loop acts on them.
        self.stopping = False
        self.interrupts = 0
        # Written to by the handlers of SIGCHLD, SIGTERM and SIGINT: look now, not
        # at the next TICK. A pipe, since a handler must not take a lock the main
        # thread may hold (threading.Event's).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def run(self, install_signal_handlers: bool = True) -> int:
        """Supervise until every child is done; returns the exit status (see the rules above)."""
        if install_signal_handlers:
            self._install_signal_handlers()
        try:
            return self._supervise()
        finally:
            if install_signal_handlers:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _supervise(self) -> int:
        # The command's system checks may have opened a database connection
        # (Django 6.1 does); the supervisor must hold none, and children must
        # not inherit one.
        connections.close_all()
        logger.info(
            "supervisor (pid %d) starting %d worker processes%s",
            os.getpid(),
            len(self.children),
            ", burst" if self.burst else "",
        )
        for child in self.children:
            self._start(child)
        while not all(child.done for child in self.children):
            self._sleep(TICK)
            if self.interrupts > 1:
                self._kill_all()
                return INTERRUPTED
            if self.stopping:
                self._forward_stop()
            now = time.monotonic()
            for child in self.children:
                self._tend(child, now)
        status = self._exit_status()
        logger.info("supervisor (pid %d) exiting with status %d", os.getpid(), status)
        return status

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: it will wake anyway
            os.write(self._wake_w, b"\0")

    def _sleep(self, timeout: float) -> None:
        readable, _, _ = select.select([self._wake_r], [], [], timeout)
        if readable:
            os.read(self._wake_r, 512)

    def child_pids(self) -> list[int]:
        """The pids of the children running now."""
        return [c.proc.pid for c in self.children if c.proc is not None]

    def _install_signal_handlers(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only flags here; the main loop, woken at once, signals the children.
            if signum == signal.SIGINT:
                self.interrupts += 1
            self.stopping = True
            self._wake()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # A burst run ends when its last child does, not up to a TICK later.
        signal.signal(signal.SIGCHLD, lambda signum, frame: self._wake())

    def _start(self, child: Child) -> None:
        child.started = time.monotonic()
        child.stop_sent = False
        try:
            if child.start is not None:
                sys.stdout.flush()
                sys.stderr.flush()
                child.proc = ForkedProcess(child.start, (self._wake_r, self._wake_w))
            else:
                child.proc = subprocess.Popen(child.argv, stdin=subprocess.DEVNULL)
        except OSError as exc:
            child.proc = None
            self._schedule_restart(child, f"could not start: {exc}", None)
            return
        logger.info("worker process %d started: pid %d", child.index, child.proc.pid)

    def _tend(self, child: Child, now: float) -> None:
        """Reap the child if it exited; restart it, or mark it done."""
        if child.done:
            return
        if child.proc is None:  # waiting for its restart
            if self.stopping:
                child.done = True
            elif now >= child.restart_at:
                self._start(child)
            return
        code = child.proc.poll()
        if code is None:
            return
        pid, child.proc, child.returncode = child.proc.pid, None, code
        if self.stopping or code == 0 or self.burst:
            child.done = True
            level = logging.INFO if self._clean(code) else logging.WARNING
            logger.log(
                level,
                "worker process %d (pid %d) finished: %s",
                child.index,
                pid,
                describe_exit(code),
            )
            return
        if now - child.started >= STABLE_AFTER:
            child.backoff = FIRST_BACKOFF
        self._schedule_restart(child, describe_exit(code), pid)

    def _schedule_restart(self, child: Child, why: str, pid: int | None) -> None:
        now = time.monotonic()
        child.restart_at = now + child.backoff
        logger.warning(
            "worker process %d (pid %s) died after %.1fs (%s); restarting it in %.0fs",
            child.index,
            pid if pid is not None else "none",
            now - child.started,
            why,
            child.backoff,
        )
        child.backoff = min(child.backoff * 2, MAX_BACKOFF)

    def _forward_stop(self) -> None:
        """SIGTERM, by pid, to every running child that has not had it yet."""
        for child in self.children:
            if child.proc is not None and not child.stop_sent:
                child.stop_sent = True
                # Popen.send_signal does nothing once the child is reaped, so
                # a recycled pid is never signalled.
                child.proc.send_signal(signal.SIGTERM)

    def _kill_all(self) -> None:
        """Second interrupt: SIGKILL every running child (by pid) and reap it."""
        logger.warning("second interrupt: killing the worker processes")
        for child in self.children:
            if child.proc is not None:
                child.proc.kill()
        for child in self.children:
            if child.proc is not None:
                child.proc.wait()
                child.proc = None

    def _clean(self, code: int) -> bool:
        """Whether an exit counts as a clean stop.

        0, or killed by the SIGTERM we forwarded before the child had set up its
        own handler (it was still starting and held nothing).
        """
        return code == 0 or (self.stopping and code == -signal.SIGTERM)

    def _exit_status(self) -> int:
        codes = [c.returncode for c in self.children]
        if all(code is not None and self._clean(code) for code in codes):
            return 0
        # Children that all failed alike (75: they gave up on an outage) say why.
        failed = {code for code in codes if code is None or not self._clean(code)}
        code = failed.pop() if len(failed) == 1 else None
        return code if code is not None and code > 0 else 1
