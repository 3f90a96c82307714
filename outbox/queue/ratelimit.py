"""Sending limits shared by every worker on every host: ``OUTBOX["RATE_LIMITS"]``.

::

    OUTBOX = {"RATE_LIMITS": {"*": "14/s", "gmail.com": "20/m", "example.org": "5000/d"}}

``"*"`` limits all sending together; any other key is a recipient domain,
compared lower-cased and exactly (``gmail.com`` does not cover
``mail.gmail.com``: a limit is what one receiving service allows, and a
subdomain is usually another service), or ``"mailer:<alias>"``: the emails
that name that mailer (``enqueue_email(..., mailer=...)``, see
:mod:`outbox.mail.mailers`; the alias is compared exactly, as MAILERS compares
it). Units are ``/s``, ``/m``, ``/h`` and ``/d``.

**How a limit is held.** Each limit is a GCRA bucket with no burst, in Redis,
on Redis' own clock (``lua/rate_take.lua``): ``n/period`` sends are spaced
``period/n`` apart, whichever worker sends them. A message goes out when its
slot has come *and* a worker claims it, which may be later (idle workers look
every ``BLOCK_TIMEOUT``; a loaded host lags). So that a backlog whose slots
came while the workers lagged does not go out at once, the sends keep a
second GCRA clock with a tolerance of a tenth of the period: they may run
ahead of the spacing by that much, and a message beyond it takes a new slot
at the end. Any window of one period then holds at most ``n + n/10 + 1``
sends (at ``50/s``: 56), and exactly the spacing while the workers keep up. A message takes a slot from its domain's
limit, its mailer's and ``"*"`` in one script call: when one of them is busy,
the others are not consumed. The busy one *reserves* its next free slot for the message,
and the message waits for it in ``scheduled``; when it comes back, the slot is
its own. Reservations make a backlog cost one refusal per message (not one per
slot), and they are the backlog each limit reports (:func:`usage`): a
sorted set of the held ids per limit, rather than a counter, because the set
is the reservation itself: the count needs no decrement that a crash or a
cancelled row could skip (a slot stops counting once its time has come, and
a reservation nobody claims is dropped an hour after it).

**Where it is checked, and why there.** Redis holds only ids, so the recipient
is known only once the worker's claim UPDATE has returned the row. The check
therefore runs right after that UPDATE (:meth:`outbox.worker.gate.Gate.holds`). A refused row is
held: ONE conditional UPDATE (``status='queued'``, ``attempts``
restored, ``not_before`` = its slot, ``WHERE status='processing' AND
claim_token=<ours>``) and its id goes to ``scheduled`` for that moment. It is
not an attempt and not a failure: no Attempt row, ``attempts`` unchanged, and
other domains keep flowing (no head-of-line blocking: only this id waits).
Checking before the claim would need the recipient in Redis, or a database
read per id; checking after costs one script call per limited message and
one extra UPDATE per refusal. With no limits configured none of this runs:
the hot path has no extra round trip.

**The window while a row is held.** Between the claim UPDATE and the
hold's UPDATE the row is ``processing`` although nothing will be sent. If
the worker dies in that moment, the sweeper treats the row like any
processing row of a dead worker (``abandoned`` under ``"review"``, requeued
under ``"requeue"``). That is safe: nothing was handed to a mail server, so
the row can be neither lost nor sent twice; at worst a person reviews a row
that never left (its attempt log shows no send).

**Slowing a domain down.** A 421 or 450 from the mail server (see
:func:`throttled`) is a request to slow down: besides the usual retry of
that message, the domain is held for ``THROTTLE_PENALTY`` seconds
(``outbox.queue.control.slow_down``), so the following messages to it wait too. A
421 while connecting (before any recipient was named) is about the server
as a whole: then every domain waits.
"""

from __future__ import annotations

import re
import smtplib
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..conf import outbox_settings
from .reliable import RedisQueue

GLOBAL = "*"
# Keys of limits on the emails of one mailer: "mailer:<alias>".
MAILER_PREFIX = "mailer:"
UNITS: dict[str, float] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_LIMIT_RE = re.compile(r"^\s*(\d+)\s*/\s*([smhd])\s*$")
_DOMAIN_RE = re.compile(
    r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
# SMTP replies that mean "too much, slow down" rather than "no".
THROTTLE_CODES = frozenset({421, 450})


@dataclass(frozen=True)
class Limit:
    """One parsed limit: ``count`` sends per ``period`` seconds, under ``key``."""

    key: str  # "*", a lower-cased domain, or "mailer:<alias>"
    text: str  # as configured, e.g. "20/m"
    count: int
    period: float

    @property
    def interval(self) -> float:
        """Seconds between two sends under this limit."""
        return self.period / self.count


def parse_limit(key: Any, value: Any) -> Limit:
    """One ``RATE_LIMITS`` entry as a :class:`Limit`; raises ValueError saying what is wrong."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"the key {key!r} is not '*' or a domain")
    if key.strip().startswith(MAILER_PREFIX):
        alias = key.strip()[len(MAILER_PREFIX) :].strip()
        if not alias:
            raise ValueError(f"the key {key!r} names no mailer: write 'mailer:<alias>'")
        name = MAILER_PREFIX + alias
    else:
        name = key.strip().lower()
        if name != GLOBAL and not _DOMAIN_RE.match(name):
            raise ValueError(f"the key {key!r} is not '*', a domain or 'mailer:<alias>'")
    if not isinstance(value, str):
        raise ValueError(f"the limit of {key!r} is {value!r}, not a string like '20/m'")
    match = _LIMIT_RE.match(value)
    if match is None:
        raise ValueError(
            f"the limit of {key!r} is {value!r}; write a count and a unit: '14/s', '20/m', "
            "'500/h' or '5000/d'"
        )
    count = int(match.group(1))
    if count < 1:
        raise ValueError(f"the limit of {key!r} is {value!r}; the count must be at least 1")
    return Limit(name, value.strip(), count, UNITS[match.group(2)])


def parse_limits(raw: Any) -> dict[str, Limit]:
    """Every entry of ``RATE_LIMITS``; raises ValueError on the first bad one."""
    if not isinstance(raw, dict):
        raise ValueError(f"RATE_LIMITS is {type(raw).__name__}, not a dict")
    limits: dict[str, Limit] = {}
    for key, value in raw.items():
        limit = parse_limit(key, value)
        if limit.key in limits:
            raise ValueError(f"the domain {limit.key!r} is listed twice (keys ignore case)")
        limits[limit.key] = limit
    return limits


class _Parsed:
    """The limits parsed once per settings value (read live, so compared per call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raw: Any = None
        self._copy: dict[str, Any] = {}
        self._limits: dict[str, Limit] = {}

    def get(self) -> dict[str, Limit]:
        raw = outbox_settings.user_settings.get("RATE_LIMITS") or {}
        # Identity first (the common case: the same settings dict), then
        # equality, so an edited dict is seen without re-parsing every call.
        if raw is self._raw or raw == self._copy:
            return self._limits
        try:
            limits = parse_limits(raw)
        except ValueError:
            limits = {}  # a system check error (outbox.E010) says why
        with self._lock:
            self._raw, self._copy, self._limits = raw, dict(raw), limits
        return limits


_parsed = _Parsed()


def limits() -> dict[str, Limit]:
    """The configured limits by key (``"*"`` and lower-cased domains); ``{}`` when none."""
    return _parsed.get()


def domain_of(recipient: str) -> str:
    """The lower-cased domain of an address (``Name <a@B.com>`` gives ``b.com``)."""
    address = recipient.rsplit("<", 1)[-1].rstrip("> ").strip()
    return address.rpartition("@")[2].lower()


def applicable(domain: str, configured: dict[str, Limit], mailer: str = "") -> list[Limit]:
    """The limits a message to ``domain`` must pass: its domain's, its mailer's, then ``"*"``.

    ``mailer`` is the email's mailer ("" for the default target, which no
    ``mailer:`` key names).
    """
    found = [configured[domain]] if domain in configured else []
    if mailer:
        limit = configured.get(MAILER_PREFIX + mailer)
        if limit is not None:
            found.append(limit)
    if GLOBAL in configured:
        found.append(configured[GLOBAL])
    return found


def state_key(queue: RedisQueue, key: str) -> str:
    """The hash of one limit: ``tat`` (its next free slot), and sends this period."""
    return f"{{{queue.prefix}}}:rate:{key}"


def held_key(queue: RedisQueue, key: str) -> str:
    """The sorted set of ids holding a slot of one limit, score = the slot."""
    return f"{{{queue.prefix}}}:rate-held:{key}"


def take(queue: RedisQueue, delivery_id: int, checks: list[Limit]) -> tuple[float, float | None]:
    """Take a slot of every limit in ``checks`` for one message, atomically.

    Returns ``(redis_now, None)`` when the message may be sent now, or
    ``(redis_now, slot)``: the Redis time its reserved slot comes; the
    message must wait until then (nothing else was consumed).
    """
    keys: list[str] = []
    args: list[Any] = [delivery_id]
    for limit in checks:
        keys += [state_key(queue, limit.key), held_key(queue, limit.key)]
        args += [f"{limit.interval:.6f}", f"{limit.period:.6f}"]
    now, slot = queue.script("rate_take")(keys=keys, args=args)
    return float(now), (None if float(slot) == 0 else float(slot))


def throttled(exc: BaseException) -> bool:
    """Whether a send error is the server asking to slow down (421 or 450)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, smtplib.SMTPRecipientsRefused):
            if any(code in THROTTLE_CODES for code, _msg in current.recipients.values()):
                return True
        elif (
            isinstance(current, smtplib.SMTPResponseException)
            and current.smtp_code in THROTTLE_CODES
        ):
            return True
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


class LimitUsage(NamedTuple):
    """One limit as the status report, the dashboard and metrics show it."""

    key: str  # "*", a domain or "mailer:<alias>"
    limit: str  # as configured, e.g. "20/m"
    used: int  # sends admitted in the current period (a fixed window of one period)
    capacity: int  # the limit's count per period
    held: int  # messages waiting for a slot this limit reserved (its backlog)
    next_free_in: float  # seconds until the limit's next free slot (0: free now)

    @property
    def used_fraction(self) -> float:
        """``used / capacity``, 0..1: what ``outbox_rate_limit_used{key=...}`` reports."""
        return min(1.0, self.used / self.capacity)


def usage(queue: RedisQueue | None = None, now: float | None = None) -> list[LimitUsage]:
    """Every configured limit with its current use and held backlog (one pipeline).

    ``now`` is Redis' time if the caller has just read it (``outbox.status``
    does, in its snapshot): it saves the round trip that reads it here.

    ``used`` counts sends in the current fixed window of one period (Redis
    time, aligned to the epoch), so it resets at each period's start; the
    limit itself is the spacing, which never lets a window exceed the count.
    ``held`` counts the ids holding a future slot of this limit: rows the
    limit rescheduled and that wait in ``scheduled`` for their slot.
    """
    configured = limits()
    if not configured:
        return []
    queue = queue or RedisQueue()
    if now is None:
        now = queue.time()
    pipe = queue.redis.pipeline(transaction=False)
    for limit in configured.values():
        pipe.hmget(state_key(queue, limit.key), ["tat", "win", "used"])
        pipe.zcount(held_key(queue, limit.key), f"({now}", "+inf")
    replies = pipe.execute()
    result = []
    for i, limit in enumerate(configured.values()):
        tat, win, used = replies[2 * i]
        window = int(now // limit.period)
        current = int(used) if used is not None and win is not None and int(win) == window else 0
        result.append(
            LimitUsage(
                key=limit.key,
                limit=limit.text,
                used=current,
                capacity=limit.count,
                held=int(replies[2 * i + 1]),
                next_free_in=round(max(0.0, float(tat or 0) - now), 3),
            )
        )
    return result
