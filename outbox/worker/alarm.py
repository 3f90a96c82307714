"""The worker's side of the failure alarm (``outbox.queue.alarm``): counting, and one line a window.

Every outcome of a hand-over is counted in memory, per mailer
(:meth:`FailureAlarm.observe`, called by ``report.announce``): a dict update
under a lock, no I/O. The tallies go to Redis (``queue.alarm.add``) from the
process's main loop (``process.Worker.run``, :meth:`FailureAlarm.tick`), at most
once a second, and at once after a failure while this process knows of no
alarm for its mailer (the failure sets ``wake``, the main loop's event), so the
alarm starts with the failure that sets it off. A sender thread never waits
for Redis here.

Each call's reply says which mailers' alarms are on: while one is, the lines
of its single failed attempts go down to DEBUG (:meth:`FailureAlarm.quiet`),
and of all the workers the one the script picks logs a WARNING when the alarm
begins, once a window while it goes on (naming the most frequent cause and
the counts), and when it clears. A process that knows of an alarm keeps
calling once a second, sending or not, so the line that it cleared comes
within a second of the window's failures falling below the rule.

Redis being away costs only the counting: the tallies are kept and sent with
the next call, a second later at the earliest.
"""

from __future__ import annotations

import logging
import threading
import time

from redis.exceptions import RedisError

from ..mail.failures import tidy_cause
from ..models import Attempt
from ..queue import alarm
from ..queue.reliable import RedisQueue
from .outcomes import Settlement

logger = logging.getLogger("outbox.worker")

Outcome = Attempt.Outcome

# Seconds between two calls of one process, but for a failure's own (module docstring).
CALL_EVERY = 1.0
_FAILED = frozenset({Outcome.RETRY, Outcome.FAILED, Outcome.AMBIGUOUS})


class FailureAlarm:
    """One worker process's tallies and its view of the alarms, shared by its threads."""

    def __init__(self, queue: RedisQueue, wake: threading.Event | None = None) -> None:
        self.queue = queue
        self.wake = wake or threading.Event()  # what the process's main loop waits on
        self._lock = threading.Lock()  # the tallies and the view
        self._calling = threading.Lock()  # one call at a time; a busy one is not waited for
        self._tallies: dict[str, alarm.Tally] = {}
        self._alarmed: frozenset[str] = frozenset()  # mailers whose alarm the last reply had on
        self._last_call = float("-inf")  # time.monotonic()
        # Set by a failure that should reach Redis at once (it sets `wake` too).
        self._wanted = False
        # After a call Redis did not answer, a failure waits for the next
        # second's call instead of calling at once.
        self._quiet_until = float("-inf")

    def observe(self, s: Settlement) -> None:
        """Count one outcome: an attempt, and a failure with its cause (not a release)."""
        if s.outcome == Outcome.SENT:
            failed = False
        elif s.outcome in _FAILED:
            failed = True
        else:
            return  # released or cancelled: nothing was handed over
        mailer = s.flight.email.mailer
        with self._lock:
            tally = self._tallies.setdefault(mailer, alarm.Tally())
            tally.attempts += 1
            if failed:
                tally.failures += 1
                tally.causes[s.cause or tidy_cause(s.error)] += 1
            now_too = failed and mailer not in self._alarmed
        if now_too:
            self._wanted = True
            self.wake.set()

    def quiet(self, mailer: str) -> bool:
        """Whether ``mailer``'s alarm is on: its single failures are logged at DEBUG."""
        return mailer in self._alarmed

    def tick(self) -> None:
        """From the main loop: the call a failure wants, or the one a second.

        Once a second only when there is something to send or an alarm to ask
        about; a failure's own call not while Redis just failed to answer.
        """
        now = time.monotonic()
        wanted = self._wanted and now >= self._quiet_until
        self._wanted = False
        with self._lock:
            due = bool(self._tallies or self._alarmed)
        if wanted or (due and now - self._last_call >= CALL_EVERY):
            self.call()

    def flush(self) -> None:
        """As the worker stops: send the tallies not sent yet, if there are any."""
        with self._lock:
            pending = bool(self._tallies)
        if pending:
            self.call()

    def call(self) -> None:
        """Send the tallies and take the reply (logging its events); skipped if a call is on."""
        if not self._calling.acquire(blocking=False):
            return  # the call under way sends what it took; the rest goes with the next
        try:
            with self._lock:
                tallies, self._tallies = self._tallies, {}
            self._last_call = time.monotonic()
            try:
                now, mailers = alarm.add(tallies, self.queue)
            except RedisError as exc:
                self._quiet_until = time.monotonic() + CALL_EVERY
                logger.debug("could not count failures in Redis (%s); sending them later", exc)
                with self._lock:
                    for mailer, tally in tallies.items():
                        self._tallies.setdefault(mailer, alarm.Tally()).merge(tally)
                return
            with self._lock:
                self._alarmed = frozenset(m.mailer for m in mailers if m.on)
            for one in mailers:
                if one.event:
                    _say(one, now)
        finally:
            self._calling.release()


def _say(one: alarm.MailerAlarm, now: float) -> None:
    window = alarm.Rule.from_settings().window
    counts = {
        "mailer": _mailer_name(one.mailer),
        "failed": one.failures,
        "attempts": one.attempts,
        "window": _seconds(window),
        "cause": one.cause or "(none)",
        "lasted": _seconds(max(0.0, now - (one.since or now))),
    }
    if one.event == "began":
        text = (
            "failure alarm for %(mailer)s: %(failed)d of %(attempts)d attempts failed in the "
            "last %(window)s, most often: %(cause)s. Its single failed attempts are logged at "
            "DEBUG while the alarm lasts; this line comes again every %(window)s"
        )
    elif one.event == "still":
        text = (
            "failure alarm for %(mailer)s goes on (for %(lasted)s): %(failed)d of "
            "%(attempts)d attempts failed in the last %(window)s, most often: %(cause)s"
        )
    else:
        text = (
            "failure alarm for %(mailer)s is over after %(lasted)s: %(failed)d of "
            "%(attempts)d attempts failed in the last %(window)s"
        )
    logger.warning(text, counts)


def _mailer_name(mailer: str) -> str:
    return f"the mailer {mailer!r}" if mailer else "the default mailer"


def _seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
