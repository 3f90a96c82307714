"""``outbox_worker --processes N``: a real supervisor with real child processes.

The supervisor's log names every child it starts ("worker process 0 started:
pid 1234"); the tests find the children there and in Redis (live incarnations
are named ``host:pid#suffix``), signal them by pid, and check what the
supervisor does about it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from outbox import enqueue_email
from outbox.management.commands.outbox_worker import child_arguments
from outbox.models import Delivery
from outbox.queue import RedisQueue
from tests.cells import slow_processes
from tests.paths import ROOT
from tests.servers import SMTPRecorder, subprocess_env, wait_until

pytestmark = slow_processes(
    ("5.2:postgres",),
    why="the processes are the operating system's, the same in every cell",
)

Status = Delivery.Status
STARTED = re.compile(r"worker process (\d+) started: pid (\d+)")


class Supervised:
    """A running ``outbox_worker --processes N``, its output in a file."""

    def __init__(self, log: Path, *args: str, **env: str) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "outbox_worker", *args],
                cwd=ROOT,
                env=subprocess_env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text()

    def child_pids(self) -> list[int]:
        """Every child pid the supervisor has started so far, in order."""
        return [int(pid) for _, pid in STARTED.findall(self.output())]

    def stop(self) -> None:
        """Leave nothing running: the supervisor and every child it started, by pid."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pid in self.child_pids():
            if is_worker(pid):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(is_worker(pid) for pid in self.child_pids()), 10)


def is_worker(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) outbox_worker process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z" and b"outbox_worker" in cmdline


def open_files(pid: int, first: int = 0) -> list[str]:
    """What ``pid``'s descriptors from ``first`` on point to ("pipe:[inode]", a path...).

    A descriptor closed between the listing and its read (a worker closes the
    connection of its start-up checks) is left out: it is not open any more.
    """
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        if int(fd.name) >= first:
            with contextlib.suppress(FileNotFoundError):
                links.append(os.readlink(fd))
    return links


def pipes(pid: int) -> set[str]:
    """The pipes ``pid`` holds open beyond stdin, stdout and stderr ("pipe:[inode]")."""
    return {link for link in open_files(pid, first=3) if link.startswith("pipe:")}


def live_pids() -> set[int]:
    """The pids in the names of the incarnations registered in Redis."""
    return {int(name.split("#")[0].rsplit(":", 1)[1]) for name in RedisQueue().live_workers()}


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    started: list[Supervised] = []

    def start(*args: str, **env: str) -> Supervised:
        run = Supervised(tmp_path / f"supervisor-{len(started)}.log", *args, **env)
        started.append(run)
        return run

    yield start
    for run in started:
        run.stop()


def test_burst_delivers_through_two_children_and_exits_zero(supervisor):
    smtp = SMTPRecorder(delay=0.05).start()
    try:
        deliveries = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(40)])
        run = supervisor("--processes", "2", "--burst", OUTBOX_TEST_SMTP_PORT=str(smtp.port))
        assert run.proc.wait(timeout=60) == 0, run.output()
    finally:
        smtp.stop()
    rows = Delivery.objects.filter(pk__in=[d.pk for d in deliveries])
    assert set(rows.values_list("status", flat=True)) == {Status.SENT}
    assert smtp.count() == len(deliveries)
    incarnations = set(rows.values_list("worker_id", flat=True))
    pids = {int(w.split("#")[0].rsplit(":", 1)[1]) for w in incarnations}
    assert len(incarnations) == 2 and pids == set(run.child_pids()), run.output()
    assert run.proc.pid not in pids
    assert RedisQueue().live_workers() == {}


def test_a_killed_child_is_restarted_and_mail_still_flows(supervisor, smtp_server):
    run = supervisor("--processes", "2", OUTBOX_TEST_SMTP_PORT=str(smtp_server.port))
    wait_until(lambda: len(live_pids()) == 2, 30)
    first = set(run.child_pids())
    assert live_pids() == first
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    # A new child appears in the log and registers in Redis.
    wait_until(lambda: len(run.child_pids()) == 3, 15)
    (replacement,) = set(run.child_pids()) - first
    wait_until(lambda: replacement in live_pids(), 30)
    assert re.search(
        rf"worker process \d \(pid {victim}\) died .*killed by SIGKILL.*restarting",
        run.output(),
    ), run.output()

    deliveries = enqueue_email("s", "b", None, [f"after{i}@example.com" for i in range(6)])
    rows = Delivery.objects.filter(pk__in=[d.pk for d in deliveries])
    wait_until(lambda: set(rows.values_list("status", flat=True)) == {Status.SENT}, 30)
    assert smtp_server.count() == len(deliveries)

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=15) == 0, run.output()


def test_sigterm_stops_every_child_and_the_supervisor_exits_zero(supervisor):
    run = supervisor("--processes", "3", "--concurrency", "2")
    wait_until(lambda: len(live_pids()) == 3, 30)
    children = run.child_pids()
    assert live_pids() == set(children) and run.proc.pid not in children
    # The supervisor holds no database or Redis connection: no socket, no SQLite file.
    fds = open_files(run.proc.pid)
    assert not [fd for fd in fds if fd.startswith("socket:") or ".sqlite3" in fd], fds
    # Its wake-up pipe stays its own: a forked child closes it first thing.
    wake = pipes(run.proc.pid)
    assert len(wake) == 1, fds
    for pid in children:
        assert not pipes(pid) & wake, (pid, wake)

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=15) == 0, run.output()
    assert not any(is_worker(pid) for pid in children)
    assert RedisQueue().live_workers() == {}
    assert run.output().count("SIGTERM: finishing the messages in hand") == 3, run.output()


def test_max_messages_is_refused_with_several_processes():
    with pytest.raises(CommandError, match="--max-messages"):
        call_command("outbox_worker", processes=2, max_messages=5)


def test_each_child_gets_its_own_worker_id():
    options = {
        "concurrency": 4,
        "summary_interval": 60.0,
        "verbosity": 2,
        "burst": True,
        "worker_id": "mail-a",
    }
    args = child_arguments(options, 1)
    assert args[args.index("--worker-id") + 1] == "mail-a-1"
    assert "--processes" not in args and "--burst" in args
    assert args[args.index("--concurrency") + 1] == "4"
