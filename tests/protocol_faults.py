"""Fault injection for the protocol model (``tests/faults/test_protocol_model.py``).

Every call is a real call to the real Redis or the real database; a fault only
changes what the calling thread learns of it. At each *site* (one collaborator
of ``SenderLoop``) a fault fires once, at the site's next call after it was
armed, in one of these modes:

``before``  the call never happened, and the thread gets the error
            (``redis.ConnectionError`` or ``django.db.OperationalError``);
``lose``    the call happened (committed, ran in Redis), then the reply was
            lost: the thread gets the same error;
``freeze``  (the step only) the step committed, then the thread froze past
            the heartbeat timeout: the model's ``freeze`` callback runs (the
            sweeper acts meanwhile), then the thread gets the step's reply;
``refuse``  (the step and the settle, with an outcome in hand) the database
            refuses the outcome's write for good (``django.db.DataError``, as
            for a value too long): that outcome's full write is refused every
            time it is tried, by the step or alone; the least write that
            settles the row (``settling.settle_refused``) is not.

The sites, and where the loop meets them:

``claim``      ``worker.queue.claim`` (``claim.lua``)
``push``       ``worker.queue.push`` (``Worker.push_quietly``: retries, set-backs)
``give_back``  ``worker.queue.give_back`` (``SenderLoop._give_back``)
``heartbeat``  ``worker.queue.heartbeat`` (``Worker.beat``)
``step``       ``SenderLoop._settle_and_mark`` (the step's one commit)
``readback``   ``attempt.take_marked_row`` (reading the marked row back)
``settle``     the write ``persist()`` retries in ``Settling.alone`` (``worker/settling.py``)
``unclaim``    ``sql.unclaim`` (the gate's hold, ``_unclaim_pending``)

The queue and loop sites are patched on the objects the model created; the
module-level ones (``readback``, ``settle``, ``unclaim``) fire only while
:func:`active` names the worker being driven, so the sweeper and burst
workers never meet a fault.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import redis
from django.db import DataError, OperationalError

from outbox.worker import loop as loop_module
from outbox.worker import settling as settling_module
from outbox.worker import sql as sql_module
from outbox.worker.backoff import Backoff

MODES = {
    "claim": ("before", "lose"),
    "push": ("before", "lose"),
    "give_back": ("before", "lose"),
    "heartbeat": ("before", "lose"),
    "step": ("before", "lose", "freeze", "freeze+beat", "refuse"),
    "readback": ("before",),
    "settle": ("before", "lose", "refuse"),
    "unclaim": ("before", "lose"),
}
FAULTS = tuple(f"{site}:{mode}" for site, modes in MODES.items() for mode in modes)
REDIS_SITES = ("claim", "push", "give_back", "heartbeat")

FIRED: Counter[str] = Counter()  # per "site:mode", over a whole test run
# The claim tokens of the attempts whose outcome's full write the database
# refuses for good, and how often that write was tried.
REFUSED: Counter[Any] = Counter()
# A thread may try a refused write in its step, then alone (and once more if a
# fault cut that short); past this it is retrying it for ever, and takes no mail.
REFUSED_TRIES = 4


def refused_write(token: Any) -> Callable[..., Any]:
    def write(*args: Any, **kwargs: Any) -> Any:
        REFUSED[token] += 1
        assert REFUSED[token] <= REFUSED_TRIES, (
            f"a write the database refuses for good was tried {REFUSED[token]} times: "
            "the thread retries it for ever and takes no more mail"
        )
        raise DataError("model: the database refused this outcome's write for good")

    return write


class Faults:
    """The armed faults of one simulated worker process; each fires once."""

    def __init__(self) -> None:
        self.armed: dict[str, str] = {}
        # Called with the site, the mode and the real call's result (None if it never ran).
        self.on_fire: Callable[[str, str, Any], None] = lambda site, mode, result: None
        # Called while frozen mid-step, with the mode ("freeze" or "freeze+beat").
        self.on_freeze: Callable[[str], None] = lambda mode: None

    def arm(self, faults: list[str]) -> None:
        for fault in faults:
            site, _, mode = fault.partition(":")
            self.armed[site] = mode

    def disarm(self) -> None:
        self.armed.clear()

    def call(self, site: str, real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        mode = self.armed.pop(site, None)
        if mode is None:
            return real(*args, **kwargs)
        FIRED[f"{site}:{mode}"] += 1
        error: type[Exception] = redis.ConnectionError if site in REDIS_SITES else OperationalError
        if mode == "before":
            self.on_fire(site, mode, None)
            raise error(f"model: {site} failed before it ran")
        result = real(*args, **kwargs)
        self.on_fire(site, mode, result)
        if mode == "lose":
            raise error(f"model: {site} ran, its reply was lost")
        self.on_freeze(mode)
        return result

    def wrap(self, site: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.call(site, real, *args, **kwargs)

        return wrapped


class NoWait(Backoff):
    """The loop's backoff, minus the wait: the model's next step is the retry."""

    def wait(self, what: str, exc: BaseException | None) -> None:
        self.delay = min(max(self.delay * 2, 0.2), 5.0)


def install_on_worker(faults: Faults, queue: Any) -> None:
    """Wrap the Redis calls of one worker's own ``RedisQueue``."""
    for site in REDIS_SITES:
        setattr(queue, site, faults.wrap(site, getattr(queue, site)))


def install_on_loop(faults: Faults, loop: Any) -> None:
    step = faults.wrap("step", loop._settle_and_mark)

    def settle_and_mark(*args: Any, **kwargs: Any) -> Any:
        s = loop.settling.settlement
        if s is not None and faults.armed.get("step") == "refuse":
            refuse(faults, "step", s)
        if s is not None and s.flight.token in REFUSED:
            return faults.call("step", refused_write(s.flight.token))
        return step(*args, **kwargs)

    loop._settle_and_mark = settle_and_mark
    loop.pause = NoWait(loop.worker)


def refuse(faults: Faults, site: str, s: Any) -> None:
    """Fire a ``refuse`` fault: from now on, ``s``'s full write is refused for good."""
    del faults.armed[site]
    FIRED[f"{site}:refuse"] += 1
    REFUSED.setdefault(s.flight.token, 0)
    faults.on_fire(site, "refuse", None)


_active: Faults | None = None


@contextlib.contextmanager
def active(faults: Faults | None) -> Iterator[None]:
    """Module-level sites fire for ``faults`` only inside this block."""
    global _active
    before, _active = _active, faults
    try:
        yield
    finally:
        _active = before


@contextlib.contextmanager
def module_sites() -> Iterator[None]:
    """Patch the module-level sites for the duration of a test."""
    real_take_marked_row = loop_module.take_marked_row
    real_persist = settling_module.persist
    real_unclaim = getattr(sql_module, "unclaim", None)  # absent before the give-back fix

    def take_marked_row(*args: Any, **kwargs: Any) -> Any:
        if _active is None:
            return real_take_marked_row(*args, **kwargs)
        return _active.call("readback", real_take_marked_row, *args, **kwargs)

    def persist(write: Callable[[], int], s: Any, *args: Any, **kwargs: Any) -> Any:
        faults = _active
        if faults is not None and faults.armed.get("settle") == "refuse":
            refuse(faults, "settle", s)
        if s.flight.token in REFUSED:
            write = refused_write(s.flight.token)
        if faults is not None and "settle" in faults.armed:
            # The first write fails (or commits and its reply is lost), then
            # persist() retries it, as it would after its own pause.
            with contextlib.suppress(OperationalError, DataError):
                faults.call("settle", write)
            loop_module.drop_db_connection()
        return real_persist(write, s, *args, **kwargs)

    def unclaim(*args: Any, **kwargs: Any) -> Any:
        assert real_unclaim is not None
        if _active is None:
            return real_unclaim(*args, **kwargs)
        return _active.call("unclaim", real_unclaim, *args, **kwargs)

    loop_module.take_marked_row = take_marked_row  # type: ignore[assignment]
    settling_module.persist = persist  # type: ignore[assignment]
    if real_unclaim is not None:
        sql_module.unclaim = unclaim  # type: ignore[attr-defined]
    try:
        yield
    finally:
        loop_module.take_marked_row = real_take_marked_row  # type: ignore[assignment]
        settling_module.persist = real_persist  # type: ignore[assignment]
        if real_unclaim is not None:
            sql_module.unclaim = real_unclaim  # type: ignore[attr-defined]
