"""The protocol model's world and its steps, for ``tests/faults/test_protocol_model.py``.

``ProtocolSteps`` is a hypothesis ``RuleBasedStateMachine`` whose rules drive the
app's real code against the real Redis and the real database (no mocks): each
step is one thing a request, a worker, the sweeper, an operator or a fault can
do. ``ProtocolMachine`` (``tests/faults/protocol_machine.py``) adds the
invariants checked after every step and the draining at the end.

The steps (rules), each through the code path the app itself uses:


``enqueue``
    ``enqueue_email()`` for 1-3 recipients inside ``transaction.atomic()``, due
    now, in the past, in a moment or in an hour, at any priority: the push to
    Redis happens after the commit; sometimes the transaction rolls back, and
    then nothing may reach Redis.
``start_worker``
    a new incarnation (``Worker(burst=True)`` registered as ``Worker.run()``
    does, two ``SenderLoop`` threads, each on its own scripted locmem
    backend, sharing one processing list). Names are reused, so restarts
    under the same ``--worker-id`` are in.
``work``
    one worker takes its next 1-6 steps in ``SenderLoop.run()``'s order:
    *claim* (``SenderLoop._claim()``, i.e. ``claim.lua``; sometimes the reply
    is "lost": the same claim, same nonce, runs first and its result is thrown
    away, and the loop's own claim must then get exactly those ids; a claim
    that gets nothing writes the outcome in hand alone), *mark*
    (``SenderLoop._mark()``: the previous outcome and the next row's
    ``processing`` UPDATE in one commit, one statement on PostgreSQL) and
    *send* (``Sender.deliver()``; the server accepts, refuses for now
    with 451, refuses for good with 550, or takes the message and cuts the
    connection: ``AmbiguousDeliveryError``).
``lifecycle``
    *crash*: the process dies where it stands (after a claim, a mark, a send,
    or idle): its loop is abandoned and its heartbeat goes stale. *stall*: it
    freezes for longer than the heartbeat timeout and resumes (its heartbeat
    goes stale and the lease of its last heartbeat runs out, so the check
    before a send sees the time that passed). *heartbeat*: one turn of
    ``Worker._heartbeat_loop()``; an incarnation declared dead carries on as a
    new one. *shutdown*: the ``finally`` of ``SenderLoop.run()`` (outcome,
    give back) and ``Worker._deregister()``.
``work`` and ``lifecycle`` arm 0-3 faults (``tests/protocol_faults.py``):
    a call of the loop to Redis (claim, push, give_back, heartbeat) or to the
    database (the step, reading the claimed row back, the outcome written
    alone, the give-back UPDATE) fails before it ran, or runs and loses its
    reply; or the step commits and the thread freezes past the timeout while
    the sweeper (and, in ``freeze+beat``, its own heartbeat thread) acts;
    or the database refuses an outcome's write for good (``DataError``, a
    value too long): every time that write is tried, in the step or alone,
    so the thread must settle the row with the least write and go on (a
    thread that tries it more than a few times is retrying it for ever).
    ``work`` also runs the loop's pause check before a mark
    (``_hold_while_paused``) and the gate after it (``_held``).
``switch``
    ``outbox_pause`` / ``outbox_resume``, global or for one of two recipient
    domains; sometimes the workers' view of the switches has aged meanwhile.
``burst_worker``
    a whole ``Worker(burst=True, max_messages=k).run()`` in process.
``sweep``
    ``Sweeper().run_pass()``, incremental or with ``full_mirror_check``.
``damage``
    Redis damage short of FLUSHALL: one ready list, ``scheduled``, the dedup
    set or the sweeper's marker deleted while the rest survives; ids of sent
    rows, or second copies of queued/processing ids, pushed into a ready list.
``operator``
    one of the admin's actions on one row through ``outbox.operations``:
    requeue (abandoned, failed, cancelled), cancel (queued, abandoned), mark
    sent or mark failed (abandoned).


The heartbeat timeout is a minute here, so that only ``crash`` and ``stall``
make an incarnation stale and the steps need no real waiting; retries back
off for a few milliseconds so that draining is quick.
"""

from __future__ import annotations

import contextlib
import functools
import smtplib
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.mail.backends import locmem
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)
from redis.exceptions import RedisError

from outbox import enqueue_email, operations
from outbox.conf import PRIORITIES
from outbox.exceptions import AmbiguousDeliveryError
from outbox.models import Delivery
from outbox.queue import RedisQueue, control
from outbox.sweeper import Sweeper
from outbox.worker import InFlight, Worker
from outbox.worker.loop import SenderLoop
from tests import protocol_faults as pf
from tests.servers import empty_outbox

Status = Delivery.Status

TIMEOUT = 60.0  # OUTBOX["HEARTBEAT_TIMEOUT"] inside the machine
STALE = 3600.0  # how far back a crashed or stalled incarnation's heartbeat goes
MAX_WORKERS = 3
THREADS = 2  # sender threads per worker: their acks share one processing list
NAMES = ("w1", "w2", "w3")
DOMAINS = ("example.com", "example.org")
SETTLED = (Status.SENT, Status.FAILED, Status.CANCELLED, Status.ABANDONED)
ACTOR = "admin:model"
DRAIN_DEADLINE = 15.0
RULES_RUN: Counter[str] = Counter()
STEPS: list[int] = []


class ScriptedBackend(locmem.EmailBackend):
    """locmem, told before each send how the mail server will answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = "ok"
        self.abandoned_sends: list[str] = []  # Message-IDs of abandoned rows handed over

    def send_messages(self, messages: Any) -> int:
        plan, self.plan = self.plan, "ok"
        recipient = messages[0].recipients()[0]
        message_id = messages[0].extra_headers.get("Message-ID")
        # The row as it is at the hand-over: an abandoned one must never get here.
        status = Delivery.objects.filter(message_id=message_id).values_list("status", flat=True)
        if Status.ABANDONED in status:
            self.abandoned_sends.append(message_id)
        if plan == "transient":
            raise smtplib.SMTPRecipientsRefused({recipient: (451, b"4.2.1 mailbox busy")})
        if plan == "permanent":
            raise smtplib.SMTPRecipientsRefused({recipient: (550, b"5.1.1 no such user")})
        sent = super().send_messages(messages)  # the server has it now
        if plan == "ambiguous":
            raise AmbiguousDeliveryError("connection cut after the final dot")
        return sent


class SimThread:
    """One sender thread of a :class:`SimWorker`: its loop, its connection, what it holds."""

    def __init__(self, worker: Worker, index: int, faults: pf.Faults) -> None:
        self.index = index
        self.backend = ScriptedBackend()
        self.loop = SenderLoop(worker, index, self.backend)
        pf.install_on_loop(faults, self.loop)
        self.in_hand: InFlight | None = None  # marked processing, not yet sent
        self.lost_claim: list[Any] | None = None  # ids of a claim whose reply was lost

    def __repr__(self) -> str:
        return f"thread {self.index}"


class SimWorker:
    """One worker process with THREADS sender threads, driven step by step."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.worker = Worker(worker_id=name, burst=True)
        self.faults = pf.Faults()
        pf.install_on_worker(self.faults, self.worker.queue)
        self.worker._register(self.worker.worker_id)  # what Worker.run() does first
        self.threads = [SimThread(self.worker, i, self.faults) for i in range(THREADS)]

    def __repr__(self) -> str:
        return self.worker.worker_id

    @property
    def incarnation(self) -> str:
        return self.worker.worker_id


class Rollback(Exception):
    pass


def step(fn: Callable[..., None]) -> Callable[..., None]:
    """Note that a step is under way, so that teardown knows whether it ended."""

    @functools.wraps(fn)
    def wrapper(self: ProtocolSteps, **kwargs: Any) -> None:
        self.busy = fn.__name__
        self.steps += 1
        fn(self, **kwargs)
        self.busy = ""

    return wrapper


class ProtocolSteps(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = RedisQueue()
        empty_outbox()
        self.policy = "review"
        self.override: override_settings | None = None
        self.ready = False
        self.busy = ""
        self.workers: list[SimWorker] = []  # not crashed, not shut down
        self.dead: list[SimWorker] = []  # crashed or shut down
        self.requeued: Counter[int] = Counter()  # operator requeues per row
        self.marked_sent: set[int] = set()
        self.touched: set[int] = set()  # rows an operator changed in this step
        self.settled: dict[int, tuple[Any, ...]] = {}  # settled rows as last seen
        self.statuses: dict[int, str] = {}
        self.recipients = 0
        self.steps = 0
        self.current: SimThread | None = None  # the thread being driven

    # -- setup and teardown -------------------------------------------------------

    @initialize(policy=st.sampled_from(["review", "requeue"]), workers=st.sampled_from(NAMES))
    def setup(self, policy: str, workers: str) -> None:
        self.policy = policy
        self.override = override_settings(
            OUTBOX={
                **django_settings.OUTBOX,
                "ABANDONED_POLICY": policy,
                "HEARTBEAT_TIMEOUT": TIMEOUT,
                "RETRY_BACKOFF": (0.005, 0.02),
                # A paused thread's idle wait: the model's next step is what comes after it.
                "BLOCK_TIMEOUT": 0.001,
            }
        )
        self.override.enable()
        self.ready = True
        for name in NAMES[: NAMES.index(workers) + 1]:
            self._add_worker(name)

    def note(self, what: str) -> None:
        """Count what a step did (shown by --hypothesis-show-statistics, too)."""
        RULES_RUN[what] += 1
        if currently_in_test_context():  # not when a test replays steps by hand
            event(what)

    # -- a request ------------------------------------------------------------------

    @rule(
        n=st.integers(1, 3),
        when=st.sampled_from(["now", "now", "past", "soon", "later"]),
        priority=st.sampled_from(PRIORITIES),
        rollback=st.sampled_from([False, False, False, False, True]),
    )
    @step
    def enqueue(self, n: int, when: str, priority: str, rollback: bool) -> None:
        offset = {"now": None, "past": -600.0, "soon": 0.3, "later": 3600.0}[when]
        send_at = None if offset is None else timezone.now() + timedelta(seconds=offset)
        recipients = [
            f"r{k}@{DOMAINS[k % len(DOMAINS)]}" for k in range(self.recipients, self.recipients + n)
        ]
        self.recipients += n
        before = Delivery.objects.count()
        created: list[Delivery] = []
        try:
            with transaction.atomic():  # like a request: the push runs after the commit
                created = enqueue_email(
                    "Order",
                    "Thanks",
                    "shop@example.com",
                    recipients,
                    send_at=send_at,
                    priority=priority,
                )
                if rollback:
                    raise Rollback
        except Rollback:
            self.note("enqueue: rolled back")
            assert Delivery.objects.count() == before
            assert not {d.pk for d in created} & self.queue.waiting_ids()
        else:
            self.note(f"enqueue: {when}")

    # -- workers ----------------------------------------------------------------------

    def _pick(self, data: st.DataObject, fits: Callable[[SimWorker], bool]) -> SimWorker:
        # A position, not a choice among the workers that fit: which fit (a worker between
        # messages) depends on timing, and a draw's shape must not (see damage() below).
        fitting = [w for w in self.workers if fits(w)]
        return fitting[data.draw(st.integers(0, 999), label="worker") % len(fitting)]

    @precondition(lambda self: len(self.workers) < MAX_WORKERS)
    @rule(name=st.sampled_from(NAMES))
    @step
    def start_worker(self, name: str) -> None:
        if any(w.name == name for w in self.dead):
            self.note("start_worker: restart under a reused worker id")
        self._add_worker(name)

    def _add_worker(self, name: str) -> SimWorker:
        w = SimWorker(name)
        w.faults.on_fire = functools.partial(self._fault_fired, w)
        w.faults.on_freeze = functools.partial(self._frozen, w)
        self.workers.append(w)
        return w

    @precondition(lambda self: bool(self.workers))
    @rule(
        data=st.data(),
        moves=st.integers(1, 6),
        n=st.integers(1, 3),
        faults=st.lists(st.sampled_from(pf.FAULTS), max_size=3),
        answer=st.sampled_from(["ok", "transient", "permanent", "ambiguous"]),
    )
    @step
    def work(self, data: st.DataObject, moves: int, n: int, faults: list[str], answer: str) -> None:
        """One sender thread takes its next ``moves`` steps, in SenderLoop.run()'s order.

        ``faults`` are armed for these moves: each fires at its site's next call.
        """
        w = self._pick(data, lambda w: True)
        t = data.draw(st.sampled_from(w.threads), label="thread")
        with self._driving(w, t, faults):
            for _ in range(moves):
                t.loop._forget_claims_of_a_dead_incarnation()
                if t.in_hand is not None:
                    self._send(t, answer)
                elif t.loop.pending:
                    if t.loop.gate.paused():
                        self._hold_while_paused(t)
                    else:
                        self._mark(t)
                elif not self._claim(w, t, n):
                    return

    @contextlib.contextmanager
    def _driving(self, w: SimWorker, t: SimThread | None, faults: list[str]) -> Iterator[None]:
        """Arm ``faults`` on ``w`` while ``t`` (or the whole process) runs; disarm after."""
        self.current = t
        w.faults.arm(faults)
        try:
            with pf.active(w.faults):
                yield
        finally:
            w.faults.disarm()
            self.current = None

    def _fault_fired(self, w: SimWorker, site: str, mode: str, result: Any) -> None:
        self.note(f"fault: {site}:{mode}")
        t = self.current
        if site == "claim" and result is not None and result.registered and t is not None:
            # A replay of the same nonce must hand back the same ids.
            if t.lost_claim is not None:
                assert list(result.items) == t.lost_claim, (result.items, t.lost_claim)
            t.lost_claim = list(result.items)

    def _frozen(self, w: SimWorker, mode: str) -> None:
        """The step committed; the thread froze past the timeout; meanwhile the sweeper ran."""
        with pf.active(None):
            self._make_stale(w)
            self._clock_jumps(w)
            report = Sweeper(policy=self.policy).run_pass()
            assert not report.errors, report.errors
            self.note(
                "freeze: sweeper "
                + ("settled the row mid-step" if report.abandoned or report.requeued else "ran")
            )
            if mode == "freeze+beat":
                # The heartbeat thread ran while the sender thread was frozen.
                self._beat(w)

    def _claim(self, w: SimWorker, t: SimThread, n: int) -> bool:
        """SenderLoop._claim(); False when it got nothing (then it settled alone)."""
        loop = t.loop
        w.worker.max_messages = n  # claim_size(): min(CLAIM_BATCH, what is left)
        lost = t.lost_claim if loop.nonce is not None else None
        incarnation = w.incarnation
        settlement = loop.settling.settlement
        loop._claim()
        if loop.nonce is not None:
            self.note("claim: failed, to be retried with its nonce")
            return True
        t.lost_claim = None
        if incarnation != w.incarnation:
            self.note("claim: declared dead, carries on as a new incarnation")
            return True
        if lost is not None:
            self.note("claim: replayed after a lost reply")
            claimed = [(f.id, f.priority) for f in loop.pending]
            assert claimed == lost, (lost, claimed)
        if loop.pending:
            self.note("claim: got ids")
        elif settlement is not None:
            self.note("claim: nothing, outcome written alone")
        elif w.worker.control.current.paused:
            self.note("claim: nothing (paused)")
        else:
            self.note("claim: nothing")
        return bool(loop.pending)

    def _mark(self, t: SimThread) -> None:
        """SenderLoop._mark(), then SenderLoop._held(): the previous outcome and this row."""
        loop = t.loop
        settling = loop.settling.settlement is not None
        flight = loop.pending.popleft()
        marked = loop._mark(flight)
        if marked is not None and loop._held(marked):
            what = "held by a switch, given back"
        elif marked is not None:
            t.in_hand = marked
            what = "marked processing"
        elif loop.pending and loop.pending[0] is flight:
            what = "failed, first in line again" + (" with its token" if flight.tried else "")
        else:
            what = "stale id dropped"
        self.note(f"mark: {what}" + (", previous outcome in the same commit" if settling else ""))

    def _send(self, t: SimThread, answer: str) -> None:
        """Sender.deliver() on a server that answers ``answer``."""
        assert t.in_hand is not None
        t.backend.plan = answer
        t.loop.settling.settlement = settlement = t.loop.sender.deliver(t.in_hand)
        t.in_hand = None
        self.note(f"send: {answer} -> {settlement.outcome}")

    def _hold_while_paused(self, t: SimThread) -> None:
        """SenderLoop._hold_while_paused(): outcome written, claimed ids given back."""
        tokens = sum(1 for f in t.loop.pending if f.tried)
        t.loop._hold_while_paused()
        self.note("paused: gave back" + (" items with tokens" if tokens else ""))

    @precondition(lambda self: bool(self.workers))
    @rule(
        data=st.data(),
        kind=st.sampled_from(["crash", "crash", "stall", "heartbeat", "shutdown"]),
        faults=st.lists(st.sampled_from(pf.FAULTS), max_size=3),
    )
    @step
    def lifecycle(self, data: st.DataObject, kind: str, faults: list[str]) -> None:
        """A worker process dies, freezes, beats, or stops gracefully."""

        def between_messages(w: SimWorker) -> bool:
            return all(t.in_hand is None for t in w.threads)

        if kind == "shutdown" and not any(between_messages(w) for w in self.workers):
            kind = "crash"  # SenderLoop.run() never stops between mark and send
        w = self._pick(data, lambda w: kind != "shutdown" or between_messages(w))
        if kind == "crash":
            # Dies where it stands: its loops' state is gone, its heartbeat goes stale.
            points = []
            for t in w.threads:
                if t.in_hand is not None:
                    points.append("after mark")
                elif t.loop.settling.settlement is not None:
                    points.append("after send")
                elif t.loop.pending:
                    points.append("after claim")
            self.note(f"crash: {', '.join(sorted(set(points))) or 'idle'}")
            self._make_stale(w)
            self.workers.remove(w)
            self.dead.append(w)
        elif kind == "stall":
            # Frozen for longer than the timeout, then resumes: time.monotonic()
            # moved on past the last heartbeat, so the lease check before a send sees it.
            self.note("stall")
            self._make_stale(w)
            self._clock_jumps(w)
        elif kind == "heartbeat":
            with self._driving(w, None, faults):
                self._beat(w)
        else:
            self.note("shutdown")
            with self._driving(w, None, faults):
                self._stop(w)

    def _beat(self, w: SimWorker) -> None:
        """One turn of Worker._heartbeat_loop()."""
        incarnation = w.incarnation
        try:
            if hasattr(w.worker, "beat"):
                w.worker.beat()
            else:  # the code before the heartbeat lease
                now, alive = w.worker.queue.heartbeat(incarnation)
                w.worker.clock.observe(now)
                if not alive:
                    w.worker.reincarnate(incarnation)
        except RedisError:
            self.note("heartbeat: failed")
            return
        if w.incarnation != incarnation:
            self.note("heartbeat: declared dead, carries on as a new incarnation")
        else:
            self.note("heartbeat")

    def _clock_jumps(self, w: SimWorker) -> None:
        """time.monotonic() moves on past the last heartbeat (a freeze, a stall)."""
        if hasattr(w.worker, "lease_from"):
            w.worker.lease_from -= STALE
        else:  # the code before the heartbeat lease timed a send from its mark
            for t in w.threads:
                if t.in_hand is not None:
                    t.in_hand.started -= STALE

    def _stop(self, w: SimWorker) -> None:
        # SenderLoop.run()'s finally in each thread, then the end of Worker.run().
        for t in w.threads:
            self.current = t
            t.loop._settle_alone()
            t.loop._give_back()
        self.current = None
        w.worker._deregister()
        self.workers.remove(w)
        self.dead.append(w)

    def _make_stale(self, w: SimWorker) -> None:
        # XX: a registration the sweeper already removed must not come back.
        self.queue.redis.zadd(
            self.queue.workers_key, {w.incarnation: self.queue.time() - STALE}, xx=True
        )

    # -- the operator's switches ----------------------------------------------------------

    @rule(
        # Resumes weigh more: a pause stays until one, and stops all claiming meanwhile.
        action=st.sampled_from(
            ["pause", "pause domain", "resume", "resume", "resume domain", "resume domain"]
        ),
        domain=st.sampled_from(DOMAINS),
        seen=st.booleans(),
    )
    @step
    def switch(self, action: str, domain: str, seen: bool) -> None:
        """outbox_pause / outbox_resume, for everything or one domain (outbox/queue/control.py)."""
        name = domain if action.endswith("domain") else None
        if action.startswith("pause"):
            control.pause(name, queue=self.queue)
        else:
            control.resume(name, queue=self.queue)
        self.note(f"switch: {action}")
        if seen:
            # CONTROL MAX_AGE went by: every thread looks again before its next mark.
            for w in self.workers:
                w.worker.control.seen_at = float("-inf")

    @rule(k=st.integers(1, 4))
    @step
    def burst_worker(self, k: int) -> None:
        worker = Worker(worker_id="burst", burst=True, max_messages=k)
        assert worker.run(install_signal_handlers=False) == 0

    # -- the sweeper ---------------------------------------------------------------------

    @rule(full=st.booleans())
    @step
    def sweep(self, full: bool) -> None:
        report = Sweeper(policy=self.policy).run_pass(full_mirror_check=full)
        assert not report.errors, report.errors
        self.note("sweep: " + ("full" if report.full_mirror_check else "incremental"))
        if report.reaped:
            self.note("sweep: reaped a dead incarnation")
        if report.abandoned or report.requeued:
            self.note("sweep: settled a row left mid-send")
        if report.remirrored:
            self.note("sweep: re-mirrored rows")

    # -- Redis damage short of FLUSHALL ------------------------------------------------------

    def _ids(self, *statuses: str) -> list[int]:
        return sorted(pk for pk, s in self.statuses.items() if s in statuses)

    @rule(data=st.data(), priority=st.sampled_from(PRIORITIES))
    @step
    def damage(self, data: st.DataObject, priority: str) -> None:
        redis, queue = self.queue.redis, self.queue
        pools = {
            "stale ids of sent rows": self._ids(Status.SENT),
            "duplicate ids": self._ids(Status.QUEUED, Status.PROCESSING),
        }
        # What is drawn must not depend on the system's state (which rows happen to
        # be sent by now): Hypothesis replays draws, and a real worker's timing can
        # differ between replays. So every kind is always drawable, and ids are drawn
        # as positions into whatever pool there is.
        kinds = ["lose ready list", "lose scheduled", "lose dedup set", "lose mirror marker"]
        kinds += list(pools)
        kind = data.draw(st.sampled_from(kinds), label="damage")
        # Drawn whatever the pool holds, even nothing: a draw made only when a pool has
        # ids would make the draws' shape depend on it.
        picks = data.draw(st.lists(st.integers(0, 999), min_size=1, max_size=3), label="ids")
        if kind in pools and not pools[kind]:
            self.note(f"damage: {kind} (none to make)")
            return
        self.note(f"damage: {kind}")
        if kind == "lose ready list":
            redis.delete(queue.ready_key(priority))
        elif kind == "lose scheduled":
            redis.delete(queue.scheduled_key)
        elif kind == "lose dedup set":
            redis.delete(queue.queued_key)
        elif kind == "lose mirror marker":
            redis.delete(queue.mirror_key)
        else:
            pool = pools[kind]
            redis.lpush(queue.ready_key(priority), *(pool[i % len(pool)] for i in picks))

    # -- operators (the admin's actions) --------------------------------------------------

    OPERATIONS = {
        "requeue": (operations.requeue, (Status.ABANDONED, Status.FAILED, Status.CANCELLED)),
        "cancel": (operations.cancel, (Status.QUEUED, Status.ABANDONED)),
        "mark_sent": (operations.mark_sent, (Status.ABANDONED,)),
        "mark_failed": (operations.mark_failed, (Status.ABANDONED,)),
    }

    @rule(data=st.data())
    @step
    def operator(self, data: st.DataObject) -> None:
        # Drawn independently of the rows' states, as in damage() above.
        name = data.draw(st.sampled_from(sorted(self.OPERATIONS)), label="action")
        action, allowed = self.OPERATIONS[name]
        rows = self._ids(*allowed)
        index = data.draw(st.integers(0, 999), label="row")
        if not rows:
            self.note(f"operator: {name} (no row it applies to)")
            return
        pk = rows[index % len(rows)]
        changed = action([pk], ACTOR).changed
        self.note(f"operator: {name}" + ("" if changed else " (row moved on meanwhile)"))
        self.touched.update(changed)
        if name == "requeue":
            self.requeued.update(changed)
        elif name == "mark_sent":
            self.marked_sent.update(changed)
