"""Pause and resume sending, for everything or one recipient domain.

``manage.py outbox_pause`` / ``outbox_resume`` (``--domain example.com``) call
:func:`pause` and :func:`resume`; the dashboard and ``outbox_status`` read
:func:`state`. The switches live in one Redis hash, ``{p}:control`` (its
fields are listed in ``lua/control.lua``).

**What a pause does.** A global pause stops all claiming everywhere at once:
the claim script (``lua/claim.lua``) hands out no id while the hash says
``paused``, and every claim reply carries the hash to the worker. Ids a
thread had already claimed but not yet marked are given back, not sent: each
thread looks at the switches before it marks a row, and the worker's view of
them is never older than :data:`MAX_AGE` seconds (refreshed by every claim
reply, or read again when it is older). So within about one second of
:func:`pause` returning no row is marked ``processing``; messages already
being sent finish. Nothing is lost: rows stay ``queued``, enqueueing goes on,
and :func:`resume` lets the workers claim again within ``BLOCK_TIMEOUT``.

A paused *domain* is checked after the claim UPDATE, where the recipient is
known: its rows go back exactly like a rate-limit refusal (not an attempt),
``PAUSED_DOMAIN_RECHECK`` seconds ahead, so a resume takes effect within that
interval. Each look costs the row two UPDATEs (the claim and the hold),
so a backlog of N rows to a paused domain costs about
``2 * N / PAUSED_DOMAIN_RECHECK`` writes per second: raise the interval for
long pauses of a big domain. A domain whose server answered 421 or 450 is
held the same way until its ``slow:`` time (``THROTTLE_PENALTY``); a 421
while connecting is about the server as a whole, and holds every domain
(``slow:*``).

**A mailer paused by its ESP** (``refused:<mailer>``, :func:`refuse`): an
ESP that answered 401 or 403, or a backend that cannot be created
(:func:`outbox.mail.failures.configuration_refused`), pauses that one mailer
(``""``: the default one) for ``MAILER_PAUSE`` seconds, twice as long after
each refusal in a row, up to its cap. Its rows are held like a slowed
domain's, until the pause ends; then the next send tries the credential
again, and a success forgets the pause (:func:`accepted`). It lives here, in
Redis, rather than in each worker's memory: every worker and thread sends with
the same settings, so one refusal stands for all of them, which then wait
instead of each asking the ESP with a refused credential (ESPs lock accounts
that keep doing so); and ``outbox_status`` and the dashboard, other
processes, read it here. A global ``outbox_resume`` forgets these pauses too
(after a fix, to try again at once). Losing it with Redis costs one more
refusal, so ``sync`` does not restore it.

**If Redis loses the hash** (a flush, a restart without persistence), the
safe default is the state the workers last saw, and a pause is never dropped:
every worker remembers the hash's generation (``created``) and the pauses it
saw; when the hash is missing or of another generation, the worker writes its
remembered pauses back and records ``lost_at``. Until then, and whenever the
hash is missing, :func:`state` reports the state as unknown. ``outbox_status``
shows "lost" until an operator runs ``outbox_resume`` (which also clears the
mark). Why not "paused whenever in doubt": every Redis restart would then
stop all mail until a person acts, while the pauses anyone set are kept
anyway by the workers that saw them. What this cannot keep: a pause set while
no worker runs, lost before any worker started (the status then says
"unknown").
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from ..conf import outbox_settings
from .entries import decode
from .reliable import RedisQueue

logger = logging.getLogger("outbox.queue.control")

# Seconds a worker's view of the switches may be old before a thread marks a row.
MAX_AGE = 0.5

_DOMAIN_RE = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


@dataclass(frozen=True)
class MailerPause:
    """A mailer paused because its ESP refused its credential (module docstring)."""

    until: float  # Redis time the pause ends
    count: int  # pauses in a row, this one included
    since: float  # Redis time this pause began
    why: str  # the refusal, with the ESP's answer

    def as_dict(self) -> dict[str, object]:
        return {"until": self.until, "count": self.count, "since": self.since, "why": self.why}


def _mailer_pause(value: str) -> MailerPause:
    until, count, since, why = [*value.split(" ", 3), ""][:4]
    return MailerPause(float(until), int(count), float(since), why)


@dataclass(frozen=True)
class ControlState:
    """The switches as Redis holds them (times are Redis time, epoch seconds)."""

    known: bool  # False: Redis holds no control hash (never set, or lost)
    generation: str = ""  # the hash's `created`
    paused_since: float | None = None  # global pause
    paused_domains: dict[str, float] = field(default_factory=dict)  # domain -> since
    slow_domains: dict[str, float] = field(default_factory=dict)  # domain -> held until
    lost_at: float | None = None  # when Redis was found to have lost the hash
    # mailer alias ("": the default one) -> its ESP's refusal; kept after the
    # pause ends, until a send through the mailer succeeds
    paused_mailers: dict[str, MailerPause] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    def pause_fields(self) -> list[str]:
        """The hash fields that hold this state's pauses (what a restore writes)."""
        fields = ["paused"] if self.paused else []
        return fields + [f"pause:{d}" for d in sorted(self.paused_domains)]

    def as_dict(self) -> dict[str, object]:
        """For ``outbox_status --json`` and the dashboard."""
        return {
            "known": self.known,
            "paused": self.paused,
            "paused_since": self.paused_since,
            "paused_domains": dict(self.paused_domains),
            "slow_domains": dict(self.slow_domains),
            "lost_at": self.lost_at,
            "paused_mailers": {m: p.as_dict() for m, p in self.paused_mailers.items()},
        }


def parse(fields: dict[str, str] | None) -> ControlState:
    """A :class:`ControlState` from the hash's fields (None or empty: not known)."""
    if not fields:
        return ControlState(known=False)
    paused_domains: dict[str, float] = {}
    slow_domains: dict[str, float] = {}
    paused_mailers: dict[str, MailerPause] = {}
    for name, value in fields.items():
        if name.startswith("pause:"):
            paused_domains[name[6:]] = float(value)
        elif name.startswith("slow:"):
            slow_domains[name[5:]] = float(value)
        elif name.startswith("refused:"):
            paused_mailers[name[8:]] = _mailer_pause(value)
    return ControlState(
        known=True,
        generation=fields.get("created", ""),
        paused_since=float(fields["paused"]) if "paused" in fields else None,
        paused_domains=paused_domains,
        slow_domains=slow_domains,
        lost_at=float(fields["lost_at"]) if "lost_at" in fields else None,
        paused_mailers=paused_mailers,
    )


def clean_domain(domain: str) -> str:
    """A recipient domain as the switches name it (lower case); ValidationError if it is not one."""
    name = domain.strip().lower()
    if not _DOMAIN_RE.match(name):
        raise ValidationError(
            _("%(domain)r is not a domain name, like example.com."),
            code="invalid_domain",
            params={"domain": domain},
        )
    return name


def _call(queue: RedisQueue | None, *args: str) -> tuple[float, ControlState]:
    """Run one operation of ``lua/control.lua``: ``(Redis' time, the hash after it)``."""
    now, state, _rest = _call_more(queue, *args)
    return now, state


def _call_more(queue: RedisQueue | None, *args: str) -> tuple[float, ControlState, list[object]]:
    """As :func:`_call`, and what else the operation's reply carries."""
    queue = queue or RedisQueue()
    now, flat, *rest = queue.script("control")(keys=[queue.control_key], args=list(args))
    decoded = [decode(v) for v in flat]
    return float(now), parse(dict(zip(decoded[::2], decoded[1::2], strict=True))), rest


def _run(queue: RedisQueue | None, *args: str) -> ControlState:
    return _call(queue, *args)[1]


def pause(domain: str | None = None, queue: RedisQueue | None = None, by: str = "") -> ControlState:
    """Stop claiming everywhere, or only for one recipient domain; returns the new state.

    ``by`` names who asked (the dashboard passes the admin user), for the log
    line an operator reads to learn who paused. Without it nothing is logged:
    the caller (``manage.py outbox_pause``) says it itself, once, and every
    worker logs what it sees.
    """
    name = clean_domain(domain) if domain else ""
    state = _run(queue, "pause", name)
    if by:
        logger.warning("sending paused%s by %s", f" for {name}" if name else "", by)
    return state


def resume(
    domain: str | None = None, queue: RedisQueue | None = None, by: str = ""
) -> ControlState:
    """Undo :func:`pause` (a global resume also clears the "lost" mark); returns the new state.

    ``by`` is logged as for :func:`pause`.
    """
    name = clean_domain(domain) if domain else ""
    state = _run(queue, "resume", name)
    if by:
        logger.warning("sending resumed%s by %s", f" for {name}" if name else "", by)
    return state


def resume_mailer(
    mailer: str, queue: RedisQueue | None = None, by: str = ""
) -> tuple[ControlState, bool]:
    """Forget the pause of ``mailer`` alone (``""``: the default mailer); True if it had one.

    What a send through it that succeeds does (:func:`accepted`), on an
    operator's word: the global switch, the domains and the other mailers stay
    as they are. ``by`` is logged as for :func:`pause`.
    """
    state, forgot = accepted(mailer, queue)
    if by and forgot:
        logger.warning("mailer %r resumed by %s", mailer, by)
    return state, forgot


def slow_down(domain: str, seconds: float, queue: RedisQueue | None = None) -> ControlState:
    """Hold a domain for ``seconds`` (its server asked us to slow down); returns the state."""
    return _run(queue, "slow", domain, f"{seconds:.3f}")


def refuse(mailer: str, why: str, queue: RedisQueue | None = None) -> tuple[ControlState, bool]:
    """Pause ``mailer`` (its ESP refused its credential); True if this call began the pause.

    A call while the mailer is paused joins that pause (module docstring);
    ``why`` is kept for ``outbox_status`` and the dashboard.
    """
    base, cap = outbox_settings.MAILER_PAUSE
    _now, state, rest = _call_more(
        queue, "refuse", mailer, f"{base:.3f}", f"{cap:.3f}", " ".join(why.split())
    )
    return state, bool(rest and int(str(rest[0])))


def accepted(mailer: str, queue: RedisQueue | None = None) -> tuple[ControlState, bool]:
    """A send through ``mailer`` succeeded: forget its pause; True if this call forgot it."""
    _now, state, rest = _call_more(queue, "accepted", mailer)
    return state, bool(rest and int(str(rest[0])))


def sync(queue: RedisQueue, seen: ControlState | None) -> ControlState:
    """Make sure the hash exists; restore the pauses of ``seen`` if Redis lost them."""
    if seen is None or not seen.known:
        return _run(queue, "sync", "")
    return _run(queue, "sync", seen.generation, *seen.pause_fields())


def state(queue: RedisQueue | None = None) -> ControlState:
    """The switches now, read only (``known`` is False when Redis holds none)."""
    return read(queue)[1]


def read(queue: RedisQueue | None = None) -> tuple[float, ControlState]:
    """``(Redis' time, the switches)``, read in one round trip.

    The time is what the switches' times compare with (a slow-down's end,
    a pause's start); ``outbox.status`` also reads the rate limits' use at it.
    """
    # A script, not a pipeline with TIME: see "read" in lua/control.lua.
    now, current = _call(queue, "read", "")
    # A domain whose wait is over is no longer slowed down, whatever the hash still says.
    slow = {d: until for d, until in current.slow_domains.items() if until > now}
    return now, dataclasses.replace(current, slow_domains=slow)


class ControlView:
    """One worker process's view of the switches, shared by its sender threads.

    Fed by every claim reply; read again when older than :data:`MAX_AGE`. It
    also remembers the last hash it saw, so that a hash Redis lost is
    restored (see the module docstring).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = ControlState(known=False)
        self.remembered: ControlState | None = None
        self.seen_at = float("-inf")  # time.monotonic()
        self._logged_pause = False

    def observe(self, fields: dict[str, str] | None, queue: RedisQueue) -> ControlState:
        """Take the hash a claim reply (or a read) carried; restore it if Redis lost it."""
        return self.take(parse(fields), queue)

    def take(self, current: ControlState, queue: RedisQueue) -> ControlState:
        """Take the switches as an operation of this worker's left them (or as observed)."""
        remembered = self.remembered
        if not current.known or (
            remembered is not None and current.generation != remembered.generation
        ):
            if remembered is not None and remembered.known:
                logger.error(
                    "Redis lost the pause switches; restoring what this worker last saw (%s)",
                    ", ".join(remembered.pause_fields()) or "not paused",
                )
            current = sync(queue, remembered)
        with self._lock:
            self.current = current
            self.remembered = current
            self.seen_at = time.monotonic()
        self._log(current)
        return current

    def fresh(self, queue: RedisQueue) -> ControlState:
        """The switches, read again from Redis if the view is older than MAX_AGE."""
        if time.monotonic() - self.seen_at <= MAX_AGE:
            return self.current
        raw = queue.redis.hgetall(queue.control_key)
        return self.observe({decode(k): decode(v) for k, v in raw.items()}, queue)

    def _log(self, current: ControlState) -> None:
        # Once per pause, not once per claim.
        if current.paused and not self._logged_pause:
            self._logged_pause = True
            logger.warning("paused by operator: claiming nothing until outbox_resume")
        elif not current.paused and self._logged_pause:
            self._logged_pause = False
            logger.warning("resumed by operator: claiming again")


def hold_until(current: ControlState, domain: str, now: float, mailer: str = "") -> float | None:
    """When a row to ``domain`` may go, if a switch holds it now; None if it may go now.

    ``mailer`` is the row's email's mailer alias: an ESP that answered 429 or
    503 with ``Retry-After`` slows its mailer (``"mailer:<alias>"``), or all
    sending (``"*"``) when it is the default delivery backend
    (:meth:`outbox.worker.gate.Gate.on_send_error`);
    one that refused the mailer's credential pauses that mailer alone.
    """
    if domain in current.paused_domains:
        return now + outbox_settings.PAUSED_DOMAIN_RECHECK
    # "*": the server as a whole asked us to slow down (a 421 when connecting).
    slow = current.slow_domains
    until = max(slow.get(domain, 0.0), slow.get("*", 0.0))
    if mailer:
        until = max(until, slow.get(f"mailer:{mailer}", 0.0))
    refused = current.paused_mailers.get(mailer)
    if refused is not None:
        until = max(until, refused.until)
    return until if until > now else None
