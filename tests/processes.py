"""Real worker subprocesses, seen from the test: their state, a kill at a named point, their output.

The processes themselves come from tests/conftest.py's ``worker_process``
fixture (``manage.py outbox_worker`` on the test database); these helpers
watch and stop them. :func:`kill_at` uses OUTBOX_FAULT_POINT: the worker
stops itself (SIGSTOP) at that point of its loop, and is SIGKILLed there, as
an OOM kill or a lost host would. The chaos run has its own, by pid
(tests/chaos/processes.py).
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

from tests.servers import SMTPRecorder, wait_until


def process_state(proc: subprocess.Popen) -> str:
    """The kernel's state letter for the process (T = stopped)."""
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().split(") ", 1)[1][0]
    except FileNotFoundError:
        return "gone"


def kill_at(worker_process, point: str, smtp: SMTPRecorder, policy: str) -> subprocess.Popen:
    """Start a worker that stops itself at ``point``; SIGKILL it there and reap it."""
    proc = worker_process(
        OUTBOX_FAULT_POINT=point,
        OUTBOX_TEST_SMTP_PORT=str(smtp.port),
        OUTBOX_TEST_ABANDONED_POLICY=policy,
    )
    wait_until(lambda: process_state(proc) == "T", timeout=30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return proc


class Run:
    """A worker subprocess whose output a thread reads as it comes (no full pipe)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, name="worker-output", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def send(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def finish(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``signum`` (if still running), wait for the exit; returns the exit status."""
        self.send(signum)
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code
