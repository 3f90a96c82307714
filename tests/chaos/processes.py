"""The chaos run's worker and sweeper processes: start them, watch them, stop them.

``Proc`` is one ``manage.py outbox_worker`` or ``outbox_sweep`` subprocess;
``ProcessesMixin`` is the part of ``Child`` that spawns them (with their logs in
the results folder), restarts the sweeper when it dies, notices workers that
exit on their own, and asks Redis which worker pids are registered.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.config import ROOT


def process_state(pid: int) -> str:
    """The kernel's state letter for the process (T = stopped), or 'gone'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "gone"


def pid_of(worker_id: str) -> int | None:
    """The pid in a worker id: ``host:pid#incarnation`` (outbox.worker's default name).

    The older form ``host:pid:suffix`` is understood too.
    """
    found = re.search(r":(\d+)(?:[:#][^:#]*)?$", worker_id)
    return int(found.group(1)) if found else None


@dataclass
class Proc:
    name: str
    role: str  # "worker", "window" (killed after_send), "refuse" (DB refuses mark sent), "sweeper"
    proc: subprocess.Popen[bytes]
    log: Path
    concurrency: int = 1
    expected_exit: bool = False
    proxied: bool = False  # reaches Redis and PostgreSQL through the fault proxies

    @property
    def pid(self) -> int:
        return self.proc.pid


STARTED = re.compile(r"worker (\S+) started: concurrency")
REINCARNATED = re.compile(r"; continuing as (\S+)")


def incarnations(log: Path) -> list[str]:
    """Every incarnation a worker's log names: the first, and each one after a reincarnation."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return STARTED.findall(text) + REINCARNATED.findall(text)


def last_line(path: Path) -> str:
    """The last line of a log file (for messages), at most 300 characters."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return ""
    return lines[-1][:300] if lines else ""


def last_traceback(path: Path, limit: int = 40) -> str:
    """The log's last traceback (at most ``limit`` lines), or "" if it has none.

    The logs live in the run's temporary directory, which a test run removes:
    an unexpected exit must carry its own cause into the report.
    """
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    if not starts:
        return ""
    # The log line that announced it (logger.exception) comes just before.
    tail = lines[max(0, starts[-1] - 1) :]
    return "\n".join(tail[:limit])


class ProcessesMixin:
    """The part of ``Child`` that runs processes (see child.py for the attributes)."""

    def _spawn(
        self,
        args: list[str],
        log: Path,
        extra_env: dict[str, str] | None = None,
        module: str = "django",
    ) -> Any:
        env = {**os.environ, **self.env, **(extra_env or {})}
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def start_worker(
        self,
        concurrency: int,
        role: str = "worker",
        fault: str | None = None,
        worker_id: str | None = None,
        env: dict[str, str] | None = None,
        proxied: bool = False,
    ) -> Proc:
        """Start ``outbox_worker``; ``fault`` names the point where it stops itself, once.

        A worker with an ``env`` of its own (faketime) runs through
        tests/chaos/worker_main.py (see there why); ``worker_id`` is its
        ``--worker-id``; a ``proxied`` one reaches its servers through the fault
        proxies (network.py).
        """
        self.worker_serial += 1
        name = f"{role}-{self.worker_serial}"
        log = self.logs / f"{name}.log"
        extra = {"OUTBOX_FAULT_POINT": fault, "OUTBOX_FAULT_COUNT": "1"} if fault else {}
        extra.update(env or {})
        if proxied:
            extra.update(self.proxied_env())
        args = ["outbox_worker", "--concurrency", str(concurrency), "--summary-interval", "10"]
        if worker_id:
            args += ["--worker-id", worker_id]
        module = "tests.chaos.worker_main" if env else "django"
        popen = self._spawn(args, log, extra, module=module)
        proc = Proc(name, role, popen, log, concurrency, proxied=proxied)
        self.procs.append(proc)
        self.counts["workers started"] += 1
        return proc

    def start_sweeper(self) -> None:
        log = self.logs / "sweeper.log"
        self.sweeper = Proc(
            "sweeper", "sweeper", self._spawn(["outbox_sweep", "--loop", "1"], log), log
        )

    def tick(self) -> None:
        """Restart the sweeper if it died; replace a worker that exited on its own."""
        if self.sweeper is not None and self.sweeper.proc.poll() is not None:
            code = self.sweeper.proc.returncode
            self.sweeper_restarts.append(
                f"exit {code} at {time.monotonic() - self.t0:.1f}s: " + last_line(self.sweeper.log)
            )
            self.say(f"sweeper exited ({code}); restarting it")
            self.start_sweeper()
        for proc in list(self.procs):
            if proc.expected_exit or proc.proc.poll() is None:
                continue
            proc.expected_exit = True
            text = (
                f"{proc.name} (pid {proc.pid}) exited on its own with status "
                f"{proc.proc.returncode}; log {proc.log}: {last_line(proc.log)}"
            )
            trace = last_traceback(proc.log)
            if trace:
                text += f"\n{trace}"
            self.unexpected_exits.append(text)
            self.say("UNEXPECTED: " + text)
            if proc.role == "worker":
                self.start_worker(proc.concurrency, proxied=proc.proxied)

    def live_workers(self) -> list[Proc]:
        return [
            p
            for p in self.procs
            if p.role == "worker"
            and not p.expected_exit
            and p.proc.poll() is None
            and process_state(p.pid) not in ("T", "gone")
        ]

    def registered(self, pid: int) -> bool:
        """Whether Redis lists a worker id of this pid as live or dead-not-yet-reaped."""
        from redis.exceptions import RedisError

        try:
            client = self.redis_client()
            members = client.zrange("{outbox}:workers", 0, -1) + client.zrange(
                "{outbox}:dead", 0, -1
            )
        except RedisError:
            return True
        return any(pid_of(m.decode()) == pid for m in members)

    def is_live(self, pid: int) -> bool:
        from redis.exceptions import RedisError

        try:
            members = self.redis_client().zrange("{outbox}:workers", 0, -1)
        except RedisError:
            return False
        return any(pid_of(m.decode()) == pid for m in members)

    def wait_until_up(self, proc: Proc, timeout: float = 60) -> bool:
        """Wait until the worker has logged its start (its signal handlers are in place).

        A worker SIGTERMed while Python and Django are still starting dies of the
        signal (exit -15) before it could install its handler: that is the
        harness's timing, not a worker fault. False if it did not come up in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if incarnations(proc.log) or proc.proc.poll() is not None:
                return True
            time.sleep(0.05)
        return False

    def terminate(self, proc: Proc, timeout: float = 90) -> int:
        """SIGTERM one worker once it is up (SIGCONT first); its exit status, recorded."""
        if not self.wait_until_up(proc):
            self.unexpected_exits.append(f"{proc.name} (pid {proc.pid}) never logged its start")
        os.kill(proc.pid, signal.SIGCONT)
        proc.proc.send_signal(signal.SIGTERM)
        return self._await_exit(proc, timeout)

    def _await_exit(self, proc: Proc, timeout: float) -> int:
        """Wait for a SIGTERMed worker; anything but exit 0 in time is a violation."""
        try:
            code = proc.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.proc.kill()
            code = proc.proc.wait()
            self.unexpected_exits.append(
                f"{proc.name} did not stop within {timeout:.0f}s of SIGTERM"
            )
        if code != 0 and not proc.expected_exit:
            self.unexpected_exits.append(f"{proc.name} (pid {proc.pid}) exited {code} on SIGTERM")
        proc.expected_exit = True
        return code

    def live_incarnations(self, name: str) -> list[str]:
        """The live incarnations registered under the worker name (``name#...``)."""
        from redis.exceptions import RedisError

        try:
            members = self.redis_client().zrange("{outbox}:workers", 0, -1)
        except RedisError:
            return []
        return [m.decode() for m in members if m.decode().split("#", 1)[0] == name]

    def stop_processes(self) -> None:
        """SIGTERM every worker once it is up (they finish the message in hand), then the sweeper."""
        running = [p for p in self.procs if p.proc.poll() is None]
        for proc in running:
            self.wait_until_up(proc)
        for proc in running:
            os.kill(proc.pid, signal.SIGCONT)
            proc.proc.send_signal(signal.SIGTERM)
        for proc in running:
            # A worker whose send stalls may take SEND_TIMEOUT to finish it.
            self._await_exit(proc, 90)
        if self.sweeper is not None:
            self.sweeper.proc.send_signal(signal.SIGTERM)
            try:
                self.sweeper.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.sweeper.proc.kill()
                self.sweeper.proc.wait()
            self.sweeper = None
