"""The failure alarm: sends failing far above normal, seen by every worker and every status page.

A wrong credential, a sender domain the relay refuses, a mail server that
refuses everything: each makes every attempt fail, and the worker's log would
say so once per attempt. Instead, per mailer (``""``: the default one), the
attempts and the failed attempts of the last ``FAILURE_ALARM_WINDOW`` seconds
are counted in Redis, and the mailer's alarm is on while its failures reach
both ``FAILURE_ALARM_MIN`` and ``FAILURE_ALARM_SHARE`` of its attempts. "Far
above normal" is that rule: a few refused recipients in a busy minute stay
below the share, a quiet site's one bounce below the minimum.

What counts: an attempt is a hand-over that ended sent, retried, failed or in
doubt (the last three are failures); a row released or held unsent is not (a
mailer whose ESP refused its credential is paused instead,
:func:`~outbox.queue.control.refuse`, and shown as such). A failure carries its *cause*,
one short line that failures alike share (:func:`outbox.mail.failures.cause_of`:
the error's class and the server's code and text, addresses
removed); the alarm names the most frequent cause of the window.

**Where.** ``{p}:alarm`` holds the tallies in buckets of ``window / 60``
seconds (by Redis' clock), so the window slides in steps of a sixtieth;
``{p}:alarm-state`` the mailers whose alarm is on, since when, and when a
worker last logged it. One script, ``lua/alarm.lua``, adds a worker's tallies
and judges every mailer in the same call, atomically: so of all the worker
processes exactly one logs that an alarm began, one that it goes on (once per
window), one that it cleared. ``outbox_status``, the dashboard and the metrics
read the same sums (:func:`read`) and judge them with their own settings: an
alarm shows there within a second of the failure that set it off, and is gone
once the window holds too few failures, whether or not a worker has said so.

**Cost.** A worker counts in memory (:class:`~outbox.worker.alarm.FailureAlarm`) and sends
its tallies at most once a second, plus at once after a failure while it knows of no alarm
for that mailer (so the alarm starts on the failure that sets it off): no
round trip per successful send, and none per failure while the alarm is on.
Each call reads the window's fields (about 60 buckets, per mailer an attempts
and a failures field and a few causes): microseconds. Like every key here the
tallies are a cache: losing them loses at most one window of counting.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..conf import outbox_settings
from .entries import decode
from .reliable import RedisQueue

# The window is counted in this many buckets.
BUCKETS = 60
# The most causes of one mailer a worker sends per call (its most frequent).
CAUSES_PER_CALL = 3


@dataclass
class Tally:
    """One mailer's attempts and failures, counted since the last call."""

    attempts: int = 0
    failures: int = 0
    causes: Counter[str] = field(default_factory=Counter)

    def merge(self, other: Tally) -> None:
        self.attempts += other.attempts
        self.failures += other.failures
        self.causes.update(other.causes)


@dataclass(frozen=True)
class MailerAlarm:
    """One mailer over the window, as :func:`add` or :func:`read` judged it."""

    mailer: str  # the alias; "" for the default one
    on: bool
    attempts: int  # in the window, failed ones included
    failures: int
    cause: str  # the most frequent cause of the window's failures ("" if none)
    since: float | None  # Redis time the alarm began, while it is on (and as add() clears it)
    event: str = ""  # add() only: "began", "still", "cleared" or "": what to log

    def as_dict(self) -> dict[str, object]:
        """For ``outbox_status --json``, the dashboard and the metrics."""
        return {
            "alarm": self.on,
            "attempts": self.attempts,
            "failed": self.failures,
            "cause": self.cause,
            "since": self.since if self.on else None,
        }


@dataclass(frozen=True)
class Rule:
    """The settings the alarm is judged by, read live."""

    window: float
    least: int
    share: float

    @classmethod
    def from_settings(cls) -> Rule:
        return cls(
            outbox_settings.FAILURE_ALARM_WINDOW,
            outbox_settings.FAILURE_ALARM_MIN,
            outbox_settings.FAILURE_ALARM_SHARE,
        )

    def args(self) -> list[str]:
        return [
            f"{self.window:.6f}",
            f"{self.window / BUCKETS:.6f}",
            str(self.least),
            f"{self.share:.6f}",
        ]

    def as_dict(self) -> dict[str, object]:
        return {"window": self.window, "min_failures": self.least, "share": self.share}


def add(tallies: dict[str, Tally], queue: RedisQueue) -> tuple[float, list[MailerAlarm]]:
    """Add a worker's tallies; ``(Redis' time, every mailer judged, with what to log)``."""
    args = ["add", *Rule.from_settings().args()]
    for mailer, tally in tallies.items():
        causes = tally.causes.most_common(CAUSES_PER_CALL)
        args += [mailer, str(tally.attempts), str(tally.failures), str(len(causes))]
        for cause, count in causes:
            args += [cause, str(count)]
    return _call(queue, args)


def read(queue: RedisQueue | None = None) -> tuple[float, list[MailerAlarm]]:
    """Every mailer with attempts in the window or an alarm on; changes nothing."""
    return _call(queue or RedisQueue(), ["read", *Rule.from_settings().args()])


def _call(queue: RedisQueue, args: list[str]) -> tuple[float, list[MailerAlarm]]:
    now, rows = queue.script("alarm")(keys=[queue.alarm_key, queue.alarm_state_key], args=args)
    alarms = [
        MailerAlarm(
            mailer=decode(mailer),
            on=bool(int(on)),
            attempts=int(attempts),
            failures=int(failures),
            cause=decode(cause),
            since=float(decode(since)) if decode(since) else None,
            event=decode(event),
        )
        for mailer, on, attempts, failures, cause, since, event in rows
    ]
    return float(decode(now)), sorted(alarms, key=lambda a: a.mailer)
