"""A model-based test of the delivery protocol (issue 11, "Tests").

A hypothesis ``RuleBasedStateMachine`` drives the app's real code against the
real Redis and the real database (no mocks): every step is one thing a
request, a worker, the sweeper, an operator or a fault can do, and after every
step the invariants below are checked. Each example starts from an empty
Redis database and empty outbox tables, and ends by draining the outbox.

The steps (rules), each through the code path the app itself uses:

``enqueue``
    ``enqueue_email()`` for 1-3 recipients inside ``transaction.atomic()``, due
    now, in the past, in a moment or in an hour, at any priority: the push to
    Redis happens after the commit; sometimes the transaction rolls back, and
    then nothing may reach Redis.
``start_worker``
    a new incarnation (``Worker(burst=True)`` registered as ``Worker.run()``
    does, one ``SenderLoop`` on a scripted locmem backend). Names are reused,
    so restarts under the same ``--worker-id`` are in.
``work``
    one worker takes its next 1-6 steps in ``SenderLoop.run()``'s order:
    *claim* (``SenderLoop._claim()``, i.e. ``claim.lua``; sometimes the reply
    is "lost": the same claim, same nonce, runs first and its result is thrown
    away, and the loop's own claim must then get exactly those ids; a claim
    that gets nothing writes the outcome in hand alone), *mark*
    (``SenderLoop._mark()``: the previous outcome and the next row's
    ``processing`` UPDATE in one commit, one statement on PostgreSQL) and
    *send* (``SenderLoop._deliver()``; the server accepts, refuses for now
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

The invariants, after every step:

1. Every ``queued`` row is reachable: its id is in a ready list, in
   ``scheduled`` no later than the row's ``not_before``, or in the
   processing list of a registered (or declared dead, not yet reaped)
   incarnation. If one is not, one full sweep is run on the spot and then it
   must be.
2. Under ``"review"``, no message is handed to the backend (accepted, or
   taken and then in doubt) more often than once plus the number of operator
   requeues of its row.
3. A settled row (``sent``, ``failed``, ``cancelled``, and ``abandoned``,
   which waits for a person) changes only through an operator action.
4. A ``processing`` row names an incarnation that holds it in its processing
   list, or one that is no longer registered: then the sweeper's stuck-row
   rule settles it once it is older than the timeout (checked when draining).

Draining (teardown): every worker stops gracefully, then full sweeps (with a
zero timeout, so nothing has to age) and burst workers run until nothing is
due. Then no row is ``processing``, no due row is ``queued``, every queued row
waits in ``scheduled`` for its time, no processing list is left, every ``sent``
row was handed over (or marked sent by an operator), and invariant 2 holds.

The heartbeat timeout is a minute here, so that only ``crash`` and ``stall``
make an incarnation stale and the steps need no real waiting; retries back
off for a few milliseconds so that draining is quick. 50 examples of up to
30 steps run by default; ``OUTBOX_TEST_MODEL_EXAMPLES=600`` searches deeper.
``test_retried_claim_keeps_the_ids_it_claimed`` replays the machine's first
find by hand.
"""

from __future__ import annotations

import functools
import os
import smtplib
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.core.mail.backends import locmem
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from outbox import enqueue_email, operations
from outbox.conf import PRIORITIES
from outbox.exceptions import AmbiguousDeliveryError
from outbox.models import Attachment, Attempt, Delivery, Email
from outbox.queue import RedisQueue
from outbox.sweeper import Sweeper
from outbox.worker import Started, Worker
from outbox.worker.loop import SenderLoop
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status

TIMEOUT = 60.0  # OUTBOX["HEARTBEAT_TIMEOUT"] inside the machine
STALE = 3600.0  # how far back a crashed or stalled incarnation's heartbeat goes
MAX_WORKERS = 3
NAMES = ("w1", "w2", "w3")
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

    def send_messages(self, messages: Any) -> int:
        plan, self.plan = self.plan, "ok"
        recipient = messages[0].recipients()[0]
        if plan == "transient":
            raise smtplib.SMTPRecipientsRefused({recipient: (451, b"4.2.1 mailbox busy")})
        if plan == "permanent":
            raise smtplib.SMTPRecipientsRefused({recipient: (550, b"5.1.1 no such user")})
        sent = super().send_messages(messages)  # the server has it now
        if plan == "ambiguous":
            raise AmbiguousDeliveryError("connection cut after the final dot")
        return sent


class SimWorker:
    """One worker process with one sender thread, driven step by step."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.worker = Worker(worker_id=name, burst=True)
        self.worker._register(self.worker.worker_id)  # what Worker.run() does first
        self.backend = ScriptedBackend()
        self.loop = SenderLoop(self.worker, 0, self.backend)
        self.in_hand: Started | None = None  # marked processing, not yet sent

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
    def wrapper(self: ProtocolMachine, **kwargs: Any) -> None:
        self.busy = fn.__name__
        self.steps += 1
        fn(self, **kwargs)
        self.busy = ""

    return wrapper


def wipe(queue: RedisQueue) -> None:
    queue.redis.flushdb()
    Attempt.objects.all().delete()
    Delivery.objects.all().delete()
    Attachment.objects.all().delete()
    Email.objects.all().delete()
    mail.outbox = []


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = RedisQueue()
        wipe(self.queue)
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
            }
        )
        self.override.enable()
        self.ready = True
        for name in NAMES[: NAMES.index(workers) + 1]:
            self.workers.append(SimWorker(name))

    def note(self, what: str) -> None:
        """Count what a step did (shown by --hypothesis-show-statistics, too)."""
        RULES_RUN[what] += 1
        if currently_in_test_context():  # not when a test replays steps by hand
            event(what)

    def teardown(self) -> None:
        STEPS.append(self.steps)
        try:
            # Drain only after a clean run: after a failed step or check the
            # state is the evidence, and hypothesis reports that failure.
            if self.ready and not self.busy and sys.exc_info()[0] is None:
                self.drain()
        finally:
            if self.override is not None:
                self.override.disable()

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
        recipients = [f"r{self.recipients + i}@example.com" for i in range(n)]
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
        return data.draw(st.sampled_from([w for w in self.workers if fits(w)]), label="worker")

    @precondition(lambda self: len(self.workers) < MAX_WORKERS)
    @rule(name=st.sampled_from(NAMES))
    @step
    def start_worker(self, name: str) -> None:
        if any(w.name == name for w in self.dead):
            self.note("start_worker: restart under a reused worker id")
        self.workers.append(SimWorker(name))

    @precondition(lambda self: bool(self.workers))
    @rule(
        data=st.data(),
        moves=st.integers(1, 6),
        n=st.integers(1, 3),
        lose_reply=st.booleans(),
        answer=st.sampled_from(["ok", "transient", "permanent", "ambiguous"]),
    )
    @step
    def work(self, data: st.DataObject, moves: int, n: int, lose_reply: bool, answer: str) -> None:
        """One worker takes its next ``moves`` steps, in SenderLoop.run()'s order."""
        w = self._pick(data, lambda w: True)
        for _ in range(moves):
            w.loop._forget_claims_of_a_dead_incarnation()
            if w.in_hand is not None:
                self._send(w, answer)
            elif w.loop.pending:
                self._mark(w)
            elif not self._claim(w, n, lose_reply):
                return

    def _claim(self, w: SimWorker, n: int, lose_reply: bool) -> bool:
        """SenderLoop._claim(); False when it got nothing (then it settled alone)."""
        loop = w.loop
        w.worker.max_messages = n  # claim_size(): min(CLAIM_BATCH, what is left)
        loop.nonce = uuid.uuid4().hex
        lost = None
        if lose_reply:
            # The same round trip, whose reply never arrives.
            lost = self.queue.claim(
                w.incarnation, n, thread=loop.index, nonce=loop.nonce, acks=list(loop.acks)
            )
        incarnation = w.incarnation
        settlement = loop.settlement
        loop._claim()
        if lost is not None:
            self.note("claim: reply lost, retried")
            if lost.registered:
                assert list(loop.pending) == lost.items, (lost.items, list(loop.pending))
        if incarnation != w.incarnation:
            self.note("claim: declared dead, carries on as a new incarnation")
        elif loop.pending:
            self.note("claim: got ids")
        elif settlement is not None:
            self.note("claim: nothing, outcome written alone")
        else:
            self.note("claim: nothing")
        return bool(loop.pending)

    def _mark(self, w: SimWorker) -> None:
        """SenderLoop._mark(): the previous outcome and this row, one commit."""
        settling = w.loop.settlement is not None
        w.in_hand = w.loop._mark(w.loop.pending.popleft())
        what = "marked processing" if w.in_hand else "stale id dropped"
        self.note(f"mark: {what}" + (", previous outcome in the same commit" if settling else ""))

    def _send(self, w: SimWorker, answer: str) -> None:
        """SenderLoop._deliver() on a server that answers ``answer``."""
        assert w.in_hand is not None
        w.backend.plan = answer
        w.loop.settlement = w.loop._deliver(w.in_hand)
        w.in_hand = None
        self.note(f"send: {answer} -> {w.loop.settlement.outcome}")

    @precondition(lambda self: bool(self.workers))
    @rule(
        data=st.data(), kind=st.sampled_from(["crash", "crash", "stall", "heartbeat", "shutdown"])
    )
    @step
    def lifecycle(self, data: st.DataObject, kind: str) -> None:
        """A worker process dies, freezes, beats, or stops gracefully."""
        if kind == "shutdown" and not any(w.in_hand is None for w in self.workers):
            kind = "crash"  # SenderLoop.run() never stops between mark and send
        w = self._pick(data, lambda w: kind != "shutdown" or w.in_hand is None)
        if kind == "crash":
            # Dies where it stands: its loop state is gone, its heartbeat goes stale.
            if w.in_hand is not None:
                point = "after mark"
            elif w.loop.settlement is not None:
                point = "after send"
            elif w.loop.pending:
                point = "after claim"
            else:
                point = "idle"
            self.note(f"crash: {point}")
            self._make_stale(w)
            self.workers.remove(w)
            self.dead.append(w)
        elif kind == "stall":
            # Frozen for longer than the timeout, then resumes: time.monotonic()
            # moved on past the last heartbeat, so the lease check before a send sees it.
            self.note("stall")
            self._make_stale(w)
            w.worker.lease_from -= STALE
        elif kind == "heartbeat":
            # One turn of Worker._heartbeat_loop().
            incarnation = w.incarnation
            w.worker.beat()
            if w.incarnation != incarnation:
                self.note("heartbeat: declared dead, carries on as a new incarnation")
            else:
                self.note("heartbeat")
        else:
            self.note("shutdown")
            self._stop(w)

    def _stop(self, w: SimWorker) -> None:
        # SenderLoop.run()'s finally, then the end of Worker.run().
        w.loop._settle_alone()
        w.loop._give_back()
        w.worker._deregister()
        self.workers.remove(w)
        self.dead.append(w)

    def _make_stale(self, w: SimWorker) -> None:
        # XX: a registration the sweeper already removed must not come back.
        self.queue.redis.zadd(
            self.queue.workers_key, {w.incarnation: self.queue.time() - STALE}, xx=True
        )

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
            picks = data.draw(st.lists(st.integers(0, 999), min_size=1, max_size=3), label="ids")
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

    # -- invariants ---------------------------------------------------------------------------

    def _rows(self) -> dict[int, dict[str, Any]]:
        fields = (
            "pk",
            "status",
            "attempts",
            "sent_at",
            "claim_token",
            "not_before",
            "worker_id",
            "last_error",
            "updated_at",
            "message_id",
        )
        return {row["pk"]: row for row in Delivery.objects.values(*fields)}

    def _check_settled_rows(self, rows: dict[int, dict[str, Any]]) -> None:
        """Invariant 3: a settled row changes only through an operator action."""
        for pk, before in self.settled.items():
            if pk in self.touched:
                continue
            now = rows.get(pk)
            after = None if now is None else tuple(now.values())
            assert after == before, (
                f"settled row {pk} changed without an operator: {before} -> {after}"
            )
        self.settled = {
            pk: tuple(row.values()) for pk, row in rows.items() if row["status"] in SETTLED
        }
        self.touched = set()

    def _check_no_resend(self, rows: dict[int, dict[str, Any]]) -> None:
        """Invariant 2: under "review", one hand-over per row and operator requeue."""
        if self.policy != "review":
            return
        handed = Counter(m.extra_headers.get("Message-ID") for m in mail.outbox)
        for pk, row in rows.items():
            allowed = 1 + self.requeued[pk]
            assert handed[row["message_id"]] <= allowed, (
                f"row {pk} was handed over {handed[row['message_id']]} times under 'review' "
                f"with {self.requeued[pk]} operator requeues"
            )

    def _check_processing_rows(self, rows: dict[int, dict[str, Any]]) -> None:
        """Invariant 4: a processing row is held by its incarnation, or that one is gone."""
        registered = set(self.queue.live_workers()) | set(self.queue.dead_workers())
        for pk, row in rows.items():
            if row["status"] != Status.PROCESSING:
                continue
            owner = row["worker_id"]
            if owner in registered:
                held = self.queue.processing_ids(owner)
                assert pk in held, f"processing row {pk} names {owner}, whose list is {held}"
            else:
                # No longer registered: the stuck-row rule settles it once it is
                # older than the timeout (draining checks that).
                self.note("processing row of an incarnation that is gone")

    def _unreachable(self, rows: dict[int, dict[str, Any]]) -> dict[int, str]:
        """Invariant 1's test: queued rows no worker will ever claim, and why."""
        redis = self.queue.redis
        ready: set[int] = set()
        for key in self.queue.ready_keys:
            ready.update(int(i) for i in redis.lrange(key, 0, -1))
        scheduled: dict[int, float] = {}
        for member, score in redis.zrange(self.queue.scheduled_key, 0, -1, withscores=True):
            pk = int(member.decode().partition(":")[0])
            scheduled[pk] = min(score, scheduled.get(pk, score))
        held: set[int] = set()
        for owner in [*self.queue.live_workers(), *self.queue.dead_workers()]:
            held.update(self.queue.processing_ids(owner))
        lost: dict[int, str] = {}
        for pk, row in rows.items():
            if row["status"] != Status.QUEUED or pk in ready or pk in held:
                continue
            due = row["not_before"].timestamp()
            if pk not in scheduled:
                lost[pk] = "in no ready list, not scheduled, held by no incarnation"
            elif scheduled[pk] > due + 1.0:
                lost[pk] = f"scheduled {scheduled[pk] - due:.1f}s after its not_before"
        return lost

    @invariant()
    def protocol_holds(self) -> None:
        if not self.ready:
            return
        self.busy = "invariants"
        rows = self._rows()
        self._check_settled_rows(rows)
        self._check_no_resend(rows)
        self._check_processing_rows(rows)
        lost = self._unreachable(rows)
        if lost:
            # Reachable after ONE full sweep, or the protocol lost them.
            self.note("invariant: unreachable rows, full sweep on the spot")
            report = Sweeper(policy=self.policy).run_pass(full_mirror_check=True)
            assert not report.errors, report.errors
            rows = self._rows()
            self._check_settled_rows(rows)
            still = self._unreachable(rows)
            assert not still, (
                f"queued rows unreachable after a full sweep: {still} (before: {lost})"
            )
        self.statuses = {pk: row["status"] for pk, row in rows.items()}
        self.busy = ""

    # -- draining --------------------------------------------------------------------------

    def drain(self) -> None:
        for w in list(self.workers):
            if w.in_hand is not None:
                w.loop.settlement = w.loop._deliver(w.in_hand)
                w.in_hand = None
            self._stop(w)

        def drained() -> bool:
            # A zero timeout: every incarnation is gone, nothing has to age.
            report = Sweeper(policy=self.policy, timeout=0).run_pass(full_mirror_check=True)
            assert not report.errors, report.errors
            assert Worker(burst=True).run(install_signal_handlers=False) == 0
            soon = timezone.now() + timedelta(seconds=5)
            return not Delivery.objects.filter(status=Status.QUEUED, not_before__lte=soon).exists()

        wait_until(drained, DRAIN_DEADLINE, interval=0.05)
        rows = self._rows()
        self._check_settled_rows(rows)
        self._check_no_resend(rows)
        stuck = {
            pk: row["status"] for pk, row in rows.items() if row["status"] == Status.PROCESSING
        }
        assert not stuck, f"rows left processing after draining: {stuck}"
        due = [
            pk
            for pk, row in rows.items()
            if row["status"] == Status.QUEUED and row["not_before"] <= timezone.now()
        ]
        assert not due, f"due rows left queued after draining: {due}"
        scheduled = {
            int(m.decode().partition(":")[0]): score
            for m, score in self.queue.redis.zrange(
                self.queue.scheduled_key, 0, -1, withscores=True
            )
        }
        for pk, row in rows.items():
            if row["status"] == Status.QUEUED:
                assert pk in scheduled, f"queued row {pk} does not wait in 'scheduled'"
                assert abs(scheduled[pk] - row["not_before"].timestamp()) < 1.0
        assert self.queue.redis.keys(self.queue.processing_key("*")) == []
        handed = Counter(m.extra_headers.get("Message-ID") for m in mail.outbox)
        for pk, row in rows.items():
            if row["status"] == Status.SENT and pk not in self.marked_sent:
                assert handed[row["message_id"]] >= 1, f"row {pk} is sent but was never handed over"
        self.note("drained: " + ", ".join(sorted({row["status"] for row in rows.values()})))


def test_protocol_model() -> None:
    started = time.monotonic()
    RULES_RUN.clear()
    STEPS.clear()
    try:
        _run()
    finally:
        # Shown with -s: what the examples exercised, and how long they took.
        seconds = time.monotonic() - started
        print(f"\nprotocol model: {len(STEPS)} examples, {sum(STEPS)} steps, {seconds:.1f}s")
        print("what the steps did:", dict(sorted(RULES_RUN.items())))


def _run() -> None:
    run_state_machine_as_test(
        ProtocolMachine,
        settings=settings(
            max_examples=int(os.environ.get("OUTBOX_TEST_MODEL_EXAMPLES", "50")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.filter_too_much,
                HealthCheck.data_too_large,
            ],
        ),
    )


def test_retried_claim_keeps_the_ids_it_claimed() -> None:
    """The machine's first find, replayed step by step (see the report in issue 11).

    A claim whose reply was lost is retried with the same nonce; ``claim.lua``
    then applies the acks a second time. When the lost call had claimed one of
    the acked ids again (a retried row that came due), the second LREM takes
    that fresh copy out of the processing list: the row is then marked
    processing while no processing list holds it (invariant 4), so a crash
    leaves it to the stuck-row rule, or strands it while still queued.
    """
    machine = ProtocolMachine()
    try:
        machine.setup(policy="review", workers="w1")
        with transaction.atomic():
            enqueue_email(
                "Order", "Thanks", None, ["a@x.com", "b@x.com", "c@x.com"], priority="high"
            )
        w = machine.workers[0]
        assert machine._claim(w, 2, lose_reply=False)  # a, b
        machine._mark(w)  # a processing
        machine._send(w, "transient")  # a: retry in a few milliseconds
        machine._mark(w)  # a queued again (acked), b processing
        machine._send(w, "ok")
        # Until a is due again.
        wait_until(
            lambda: (
                not Delivery.objects.filter(
                    status=Status.QUEUED, not_before__gt=timezone.now()
                ).exists()
            ),
            5,
        )
        assert machine._claim(w, 2, lose_reply=True)  # c and a again; the reply is lost once
        machine._mark(w)  # b sent, c processing
        machine._send(w, "ok")
        machine._mark(w)  # c sent, a processing
        machine.protocol_holds()
    finally:
        machine.teardown()
