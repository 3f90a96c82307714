"""The protocol model's machine: its steps (``tests/faults/protocol_steps.py``) and invariants.

The invariants, after every step:

1. Every ``queued`` row is reachable: its id is in a ready list, in
   ``scheduled`` no later than the row's ``not_before``, or in the
   processing list of a registered (or declared dead, not yet reaped)
   incarnation. If one is not, one full sweep is run on the spot and then it
   must be. An id held only in a live incarnation's list whose threads will
   never mark it (not claimed, lost, in hand or to acknowledge by any of
   them) counts only until the mirror's grace: the model backdates the
   ``{p}:mirror-held`` watch and runs one plain pass, which must push it.
2. Under ``"review"``, no message is handed to the backend (accepted, or
   taken and then in doubt) more often than once plus the number of operator
   requeues of its row.
3. A settled row (``sent``, ``failed``, ``cancelled``, and ``abandoned``,
   which waits for a person) changes only through an operator action.
4. A ``processing`` row names an incarnation that holds it in its processing
   list, or one that is no longer registered: then the sweeper's stuck-row
   rule settles it once it is older than the timeout (checked when draining).
5. What a live thread holds (claimed ids, a lost claim's ids, the row in
   hand, the outcome not yet written) has a copy in its incarnation's list
   for each holder: acks, applied once across replays, never take another
   thread's copy.
6. No row is handed to the backend while it is ``abandoned`` (checked at
   the hand-over, against the database).
7. A ``processing`` row of a live incarnation is one its threads will still
   settle (in hand, its outcome not yet written, its step to repeat, or kept
   aside after the database refused to settle it): none is left behind a
   live heartbeat, where the sweeper never looks.

Draining (teardown): every worker stops gracefully, then full sweeps (with a
zero timeout, so nothing has to age) and burst workers run until nothing is
due. Then no row is ``processing``, no due row is ``queued``, every queued row
waits in ``scheduled`` for its time, no processing list is left, every ``sent``
row was handed over (or marked sent by an operator), and invariant 2 holds.

"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import timedelta
from typing import Any

from django.core import mail
from django.utils import timezone
from hypothesis.stateful import (
    invariant,
)

from outbox.models import Delivery
from outbox.queue import RedisQueue, control
from outbox.sweeper import Sweeper
from outbox.sweeper import mirror as mirror_module
from outbox.worker import Worker
from tests.faults.protocol_steps import (
    DOMAINS,
    DRAIN_DEADLINE,
    SETTLED,
    STEPS,
    ProtocolSteps,
    SimWorker,
    Status,
)
from tests.servers import wait_until


class RedisView:
    """What Redis holds, read in two round trips: the invariants read it after every step."""

    def __init__(self, queue: RedisQueue) -> None:
        pipe = queue.redis.pipeline(transaction=True)
        for key in queue.ready_keys:
            pipe.lrange(key, 0, -1)
        pipe.zrange(queue.scheduled_key, 0, -1, withscores=True)
        pipe.zrange(queue.workers_key, 0, -1)
        pipe.zrange(queue.dead_key, 0, -1)
        *ready, scheduled, live, dead = pipe.execute()
        self.ready = {int(pk) for ids in ready for pk in ids}
        self.scheduled: dict[int, float] = {}  # the earliest entry of each id
        for member, score in scheduled:
            pk = int(member.decode().partition(":")[0])
            self.scheduled[pk] = min(score, self.scheduled.get(pk, score))
        self.live = [m.decode() for m in live]
        self.dead = [m.decode() for m in dead]
        owners = [*self.live, *self.dead]
        pipe = queue.redis.pipeline(transaction=True)
        for owner in owners:
            pipe.lrange(queue.processing_key(owner), 0, -1)
        self.lists = {
            owner: [int(pk) for pk in ids]
            for owner, ids in zip(owners, pipe.execute(), strict=True)
        }


class ProtocolMachine(ProtocolSteps):
    """The steps, the invariants after each, and the draining at the end."""

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

    def _check_processing_rows(self, rows: dict[int, dict[str, Any]], view: RedisView) -> None:
        """Invariant 4: a processing row is held by its incarnation, or that one is gone."""
        for pk, row in rows.items():
            if row["status"] != Status.PROCESSING:
                continue
            owner = row["worker_id"]
            if owner in view.lists:
                held = view.lists[owner]
                assert pk in held, f"processing row {pk} names {owner}, whose list is {held}"
            else:
                # No longer registered: the stuck-row rule settles it once it is
                # older than the timeout (draining checks that).
                self.note("processing row of an incarnation that is gone")

    def _check_claims_held(self, view: RedisView) -> None:
        """Invariant 5: what a live thread holds is in its incarnation's list, once per holder.

        Its claimed ids, a lost claim's ids, the row in hand and the outcome
        not yet written: one thread's acks (applied once, even across a
        replayed claim) never take another thread's copy of the same id.
        """
        for w in self.workers:
            if w.incarnation not in view.live:
                continue
            owed: Counter[int] = Counter()
            for t in w.threads:
                if t.loop.worker_id != w.worker.worker_id:
                    continue  # its claims are the old incarnation's, for the sweeper
                owed.update(f.id for f in t.loop.pending)
                if t.loop.nonce is not None and t.lost_claim:
                    owed.update(c.id for c in t.lost_claim)
                s = t.loop.settling.settlement
                for flight in (t.in_hand, s and s.flight):
                    if flight is not None and flight.worker_id == w.worker.worker_id:
                        owed[flight.delivery.pk] += 1
            held = Counter(view.lists[w.incarnation])
            short = {pk: (n, held[pk]) for pk, n in owed.items() if held[pk] < n}
            assert not short, (
                f"{w.incarnation}'s threads hold ids its list lacks (held by threads, "
                f"copies in the list): {short}"
            )

    def _check_no_row_left_processing(
        self, rows: dict[int, dict[str, Any]], view: RedisView
    ) -> None:
        """Invariant 7: a processing row of a live incarnation is one its threads will settle.

        A thread that gave up on its outcome (a write the database refuses for
        good) without settling the row would leave it ``processing`` under a
        live heartbeat, where the sweeper never looks.
        """
        ours = {w.incarnation: w for w in self.workers if w.incarnation in view.live}
        for pk, row in rows.items():
            w = ours.get(row["worker_id"])
            if row["status"] == Status.PROCESSING and w is not None:
                parked = {
                    s.delivery.pk for t in w.threads for _, _, s in getattr(t.loop, "parked", [])
                }
                assert pk in self._expected(w) | parked, (
                    f"processing row {pk} of the live {w.incarnation} is held by none of "
                    "its threads: nobody will settle it while it lives"
                )

    def _expected(self, w: SimWorker) -> set[int]:
        """Ids ``w``'s threads will still act on: claimed, lost, in hand, to acknowledge."""
        ids: set[int] = set()
        for t in w.threads:
            loop = t.loop
            ids.update(f.id for f in loop.pending)
            ids.update(loop.acks)
            ids.update(c.id for c in t.lost_claim or [])
            s = loop.settling.settlement
            for flight in (t.in_hand, s and s.flight):
                if flight is not None:
                    ids.add(flight.delivery.pk)
        return ids

    def _unreachable(
        self, rows: dict[int, dict[str, Any]], view: RedisView | None = None
    ) -> tuple[dict[int, str], set[int]]:
        """Invariant 1's test: queued rows no worker will ever claim, and why.

        Also returns the queued rows held only by a live incarnation of ours
        whose threads will never mark them (an ack or a give-back that went
        missing): reachable only once the mirror's grace for held ids is over.
        """
        view = view or RedisView(self.queue)
        ready, scheduled = view.ready, view.scheduled
        ours = {w.incarnation: w for w in self.workers}
        held: set[int] = set()
        watched: dict[int, set[str]] = {}
        for owner, ids in view.lists.items():
            held.update(ids)
            for pk in ids:
                watched.setdefault(pk, set()).add(owner)
        lost: dict[int, str] = {}
        leaked: set[int] = set()
        for pk, row in rows.items():
            if row["status"] != Status.QUEUED or pk in ready:
                continue
            due = row["not_before"].timestamp()
            in_time = pk in scheduled and scheduled[pk] <= due + 1.0
            if pk in held:
                if not in_time and all(
                    o in ours and pk not in self._expected(ours[o]) for o in watched[pk]
                ):
                    leaked.add(pk)
                continue
            if pk not in scheduled:
                lost[pk] = "in no ready list, not scheduled, held by no incarnation"
            elif not in_time:
                lost[pk] = f"scheduled {scheduled[pk] - due:.1f}s after its not_before"
        return lost, leaked

    def _pass_after_grace(self, leaked: set[int]) -> None:
        """The mirror's grace for ids held in live lists runs out, then one plain pass."""
        held_grace = getattr(mirror_module, "held_grace", None)
        if held_grace is None:  # the code before the grace trusted live lists for ever
            report = Sweeper(policy=self.policy).run_pass(full_mirror_check=True)
        else:
            long_ago = self.queue.time() - held_grace() - 1.0
            watch = self.queue.held_watch()
            watch.update(dict.fromkeys(leaked, long_ago))
            self.queue.set_held_watch(watch)
            report = Sweeper(policy=self.policy).run_pass()
        assert not report.errors, report.errors

    @invariant()
    def protocol_holds(self) -> None:
        if not self.ready:
            return
        self.busy = "invariants"
        assert not self._abandoned_sends(), (
            f"abandoned rows handed to the backend: {self._abandoned_sends()}"
        )
        rows = self._rows()
        view = RedisView(self.queue)
        self._check_settled_rows(rows)
        self._check_no_resend(rows)
        self._check_processing_rows(rows, view)
        self._check_claims_held(view)
        self._check_no_row_left_processing(rows, view)
        lost, leaked = self._unreachable(rows, view)
        if leaked:
            self.note("invariant: ids no thread will mark, a pass after the grace")
            self._pass_after_grace(leaked)
            rows = self._rows()
            self._check_settled_rows(rows)
            lost, still = self._unreachable(rows)
            still &= leaked
            assert not still, (
                f"queued rows held only in a live list nobody will mark, after the "
                f"mirror's grace: {still}"
            )
        if lost:
            # Reachable after ONE full sweep, or the protocol lost them.
            self.note("invariant: unreachable rows, full sweep on the spot")
            report = Sweeper(policy=self.policy).run_pass(full_mirror_check=True)
            assert not report.errors, report.errors
            rows = self._rows()
            self._check_settled_rows(rows)
            still_lost, _ = self._unreachable(rows)
            assert not still_lost, (
                f"queued rows unreachable after a full sweep: {still_lost} (before: {lost})"
            )
        self.statuses = {pk: row["status"] for pk, row in rows.items()}
        self.busy = ""

    def _abandoned_sends(self) -> list[str]:
        """Invariant 6: no row is handed to the backend while it is abandoned."""
        return [
            message_id
            for w in [*self.workers, *self.dead]
            for t in w.threads
            for message_id in t.backend.abandoned_sends
        ]

    # -- draining --------------------------------------------------------------------------

    def drain(self) -> None:
        for w in list(self.workers):
            for t in w.threads:
                if t.in_hand is not None:
                    t.loop.settling.settlement = t.loop.sender.deliver(t.in_hand)
                    t.in_hand = None
            self._stop(w)
        control.resume(queue=self.queue)
        for domain in DOMAINS:
            control.resume(domain, queue=self.queue)

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
        assert not self._abandoned_sends(), self._abandoned_sends()
        handed = Counter(m.extra_headers.get("Message-ID") for m in mail.outbox)
        for pk, row in rows.items():
            if row["status"] == Status.SENT and pk not in self.marked_sent:
                assert handed[row["message_id"]] >= 1, f"row {pk} is sent but was never handed over"
        self.note("drained: " + ", ".join(sorted({row["status"] for row in rows.values()})))
