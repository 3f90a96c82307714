"""The benchmark's sending-control part (PostgreSQL): rate limits and pause, measured.

Issue 13 asks for these to be measured, not asserted, and reported:

- **global limit**: 4 workers at ``--concurrency 4`` with ``{"*": "50/s"}`` send
  1,000 emails; the time from the first to the last arrival at the SMTP server
  (20 s ±10% is the target) and the most arrivals in any one-second window
  (at most 60);
- **slow domain**: with ``{"slow.example": "2/s"}``, 20 emails to slow.example
  and 500 to other domains; the time the 500 take, against the same 500 alone
  with no limit;
- **pause**: while 4 workers send 3,000 emails to a server that takes 20 ms per
  message, ``manage.py outbox_pause``; the last arrival after the command
  returned, and nothing more for 3 s; then ``outbox_resume`` and the time to
  drain the rest.

The workers are real ``outbox_worker`` processes (not ``--burst``: a held row is
not due, and a burst worker would stop), stopped with SIGTERM by pid. The SMTP
server is ``smtp_sink.py``, which records when each message arrived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmark.common import BENCH, ROOT, free_port

WORKERS = 4
CONCURRENCY = 4


class SendingMixin:
    """The sending-control part of the benchmark's ``Child`` (see child.py)."""

    db: str
    extra: dict[str, Any]

    def bench_sending(self) -> None:
        self.extra["sending"] = {
            "global": self._global_limit(),
            "slow_domain": self._slow_domain(),
            "pause": self._pause(),
        }
        self.log(f"sending: {json.dumps(self.extra['sending'])}")

    # -- the three scenarios -------------------------------------------------------------

    def _global_limit(self) -> dict[str, Any]:
        n, per_second = 1000, 50
        self.reset()
        self._enqueue([f"g{i}@example.com" for i in range(n)])
        arrivals = self._run_until(n, {"*": f"{per_second}/s"}, delay=0.0)
        times = [t for t, _rcpt in arrivals]
        return {
            "emails": n,
            "limit": f"{per_second}/s",
            "first_to_last_s": round(times[-1] - times[0], 2),
            "max_in_one_second": _max_window(times, 1.0),
        }

    def _slow_domain(self) -> dict[str, Any]:
        others = [f"o{i}@other{i % 10}.example" for i in range(500)]
        slow = [f"s{i}@slow.example" for i in range(20)]
        self.reset()
        self._enqueue(others)
        alone = self._run_until(len(others), {}, delay=0.0)
        self.reset()
        self._enqueue(slow + others)
        both = self._run_until(len(slow) + len(others), {"slow.example": "2/s"}, delay=0.0)
        start = both[0][0]
        other_times = [t - start for t, rcpt in both if not rcpt.endswith("@slow.example")]
        slow_times = [t - start for t, rcpt in both if rcpt.endswith("@slow.example")]
        return {
            "others_alone_s": round(alone[-1][0] - alone[0][0], 2),
            "others_with_slow_s": round(max(other_times), 2),
            "slow_done_s": round(max(slow_times), 2),
        }

    def _pause(self) -> dict[str, Any]:
        n = 3000
        self.reset()
        self._enqueue([f"p{i}@example.com" for i in range(n)])
        with _Sink(delay=0.02) as sink, self._workers({}, sink.port):
            _wait(lambda: len(sink.arrivals()) >= 300, 60)
            self._manage("outbox_pause")
            paused_at = time.time()
            time.sleep(3.0)
            during = [t for t, _r in sink.arrivals() if t > paused_at]
            resumed_at = time.time()
            self._manage("outbox_resume")
            _wait(lambda: self.delivered("outbox") >= n, 120)
            drained_at = time.time()
        last = max(during, default=paused_at)
        return {
            "emails": n,
            "arrivals_after_pause_returned": len(during),
            "last_arrival_after_pause_s": round(last - paused_at, 3),
            "arrivals_later_than_1s": sum(1 for t in during if t > paused_at + 1.0),
            "drain_after_resume_s": round(drained_at - resumed_at, 2),
        }

    # -- helpers -----------------------------------------------------------------------

    def _enqueue(self, recipients: list[str]) -> None:
        from django.db import connection, transaction

        from outbox import enqueue_email

        with transaction.atomic():
            for r in recipients:
                enqueue_email("Limits", "Body", "bench@example.com", [r])
        connection.close()

    def _run_until(self, n: int, limits: dict[str, str], delay: float) -> list[tuple[float, str]]:
        """Run the workers until n emails arrived; the arrivals, sorted by time."""
        with _Sink(delay) as sink, self._workers(limits, sink.port):
            _wait(lambda: len(sink.arrivals()) >= n, 180)
            return sorted(sink.arrivals())

    def _workers(self, limits: dict[str, str], smtp_port: int) -> _Workers:
        env = {**self.env("smtp", smtp_port), "BENCH_RATE_LIMITS": json.dumps(limits)}  # type: ignore[attr-defined]
        argv = [sys.executable, "-m", "django", "outbox_worker", "--concurrency", str(CONCURRENCY)]
        return _Workers([argv] * WORKERS, env)

    def _manage(self, command: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "django", command],
            env=self.env("noop"),  # type: ignore[attr-defined]
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )


class _Sink:
    """smtp_sink.py on a free port, writing each arrival's time and recipient to a file."""

    def __init__(self, delay: float) -> None:
        self.port = free_port()
        fd, name = tempfile.mkstemp(prefix="outbox-sink-")
        os.close(fd)
        self.log = Path(name)
        self.delay = delay

    def __enter__(self) -> _Sink:
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH / "smtp_sink.py"), str(self.port), str(self.delay)],
            env={**os.environ, "BENCH_SINK_LOG": str(self.log)},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # "listening on ..."
        return self

    def arrivals(self) -> list[tuple[float, str]]:
        out = []
        for line in self.log.read_text().split("\n")[:-1]:  # a line being written is left out
            when, rcpt = line.split(" ")[:2]
            out.append((float(when), rcpt))
        return out

    def timeline(self) -> dict[str, tuple[float, float, float]]:
        """Per recipient: when its MAIL command arrived, its DATA ended, it was accepted."""
        out = {}
        for line in self.log.read_text().splitlines():
            when, rcpt, mail_at, data_at = line.split(" ")
            out[rcpt] = (float(mail_at), float(data_at), float(when))
        return out

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)


class _Workers:
    """Worker processes started together and stopped with SIGTERM, by pid."""

    def __init__(self, argvs: list[list[str]], env: dict[str, str]) -> None:
        self.argvs, self.env = argvs, env

    def __enter__(self) -> _Workers:
        self.procs = [
            subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL)
            for argv in self.argvs
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the sending-control scenario did not finish in time")
        time.sleep(0.05)


def _max_window(times: list[float], width: float) -> int:
    """The most timestamps in any window of ``width`` seconds (times sorted)."""
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= width:
            start += 1
        best = max(best, end - start + 1)
    return best


def sending_section(db: str, data: Any) -> list[str]:
    """The report's section for this part."""
    if not data:
        return []
    g, s, p = data["global"], data["slow_domain"], data["pause"]
    return [
        f"## Sending control ({db}, {WORKERS} x outbox_worker --concurrency {CONCURRENCY})",
        "",
        "| measure | result |",
        "|---|---|",
        f'| {g["emails"]:,} emails at `{{"*": "{g["limit"]}"}}`: first to last arrival '
        f"| {g['first_to_last_s']} s |",
        f"| most arrivals in any one-second window | {g['max_in_one_second']} |",
        f"| 500 emails to other domains, alone | {s['others_alone_s']} s |",
        f"| the same 500 next to 20 for slow.example at 2/s | {s['others_with_slow_s']} s "
        f"(the 20 done after {s['slow_done_s']} s) |",
        f"| pause: arrivals after `outbox_pause` returned | {p['arrivals_after_pause_returned']}"
        f", the last {p['last_arrival_after_pause_s']} s after it; "
        f"{p['arrivals_later_than_1s']} later than 1 s |",
        f"| resume: the rest of {p['emails']:,} drained in | {p['drain_after_resume_s']} s |",
        "",
    ]


def sending_targets(children: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    data = children.get("postgres", {}).get("extra", {}).get("sending")
    if not data:
        return []
    g, s, p = data["global"], data["slow_domain"], data["pause"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    return [
        (
            "50/s global limit: 1,000 emails take 20 s ±10%",
            f"{g['first_to_last_s']} s first to last",
            verdict(18.0 <= g["first_to_last_s"] <= 22.0),
        ),
        (
            "50/s global limit: no one-second window over 60",
            f"at most {g['max_in_one_second']}",
            verdict(g["max_in_one_second"] <= 60),
        ),
        (
            "a 2/s domain does not delay the other 500 (within 20% of them alone)",
            f"{s['others_with_slow_s']} s vs {s['others_alone_s']} s alone",
            verdict(s["others_with_slow_s"] <= 1.2 * s["others_alone_s"] + 0.5),
        ),
        (
            "pause stops sending within 1 s; resume drains",
            f"last arrival {p['last_arrival_after_pause_s']} s after; drained in "
            f"{p['drain_after_resume_s']} s",
            verdict(p["arrivals_later_than_1s"] == 0 and p["drain_after_resume_s"] > 0),
        ),
    ]
