"""The enqueue plan and the enqueueing: committed, rolled-back and savepoint transactions.

``make_plan`` splits the run's deliveries into seeded batches of transactions,
some of them rolled back on purpose (whole transactions and savepoints): those
must never arrive. ``EnqueueMixin`` runs the plan one batch at a time with
``outbox.enqueue_email`` and remembers every Message-ID it committed or rolled back.

Faults that need a worker of their own to get a row (kills in the send window,
the refused write, the restart under a reused id, the SMTP stalls and cuts) draw
on a *reserve*: batches of the plan held back for them, so that they find work
even when the other workers have drained the plan. Whatever is left of the
reserve is enqueued at the end; only if it runs out are extra deliveries
enqueued (counted as "extra enqueued for faults").

One recipient in ``Config.hostile_every`` is hostile but legal
(``hostile_address``): a long internationalised domain within RFC 5321's
limits once IDNA-encoded, mixed case, or a display name. Picking them by
serial number draws nothing from the seeded generator, so a seed's plan is
otherwise the same.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, deque
from dataclasses import dataclass, field

from tests.chaos.config import Config


@dataclass
class Txn:
    """One transaction of enqueue_email calls (recipients per call)."""

    kind: str  # "commit", "rollback" (the whole transaction) or "savepoint"
    calls: list[list[str]]
    rolled_back_calls: list[list[str]] = field(default_factory=list)  # inside the savepoint


# A domain of 151 characters whose IDNA form (what goes on the wire) is 183
# octets: within the 255 of RFC 5321, and with the local part within its path.
_LONG_IDN_DOMAIN = ".".join(f"münchenerbücherstubeöffnungszeiten{i}" for i in range(4)) + ".example"


def hostile_address(n: int) -> str:
    """A legal address that a careless system mangles: IDN, mixed case, a display name."""
    kind = n % 3
    if kind == 0:
        return f"idn{n}@{_LONG_IDN_DOMAIN}"
    if kind == 1:
        return f"Mixed.Case{n}@Example.COM"
    return f'"Reader, Chaos {n}" <reader{n}@example.com>'


def make_plan(config: Config, rng: random.Random) -> tuple[list[list[Txn]], set[str]]:
    """Batches of transactions holding exactly ``config.deliveries`` committed deliveries."""
    counter = iter(range(1, 10**9))
    permanent: set[str] = set()

    def calls(total: int) -> list[list[str]]:
        out = []
        while total > 0:
            size = min(total, rng.choice((1, 1, 1, 2, 3)))
            recipients = []
            for _ in range(size):
                n = next(counter)
                if rng.random() < config.permanent_fraction:
                    address = f"bounce{n}@example.net"
                    permanent.add(address)
                elif config.hostile_every and n % config.hostile_every == 0:
                    address = hostile_address(n)
                else:
                    address = f"user{n}@example.com"
                recipients.append(address)
            out.append(recipients)
            total -= size
        return out

    n_batches = config.batches or max(20, 3 * config.events(), config.deliveries // 250)
    n_batches = max(1, min(n_batches, config.deliveries))
    base, extra = divmod(config.deliveries, n_batches)
    plan: list[list[Txn]] = []
    for index in range(n_batches):
        size = base + (1 if index < extra else 0)
        parts = rng.randint(1, 3) if size >= 3 else 1
        cuts = sorted(rng.sample(range(1, size), parts - 1)) if parts > 1 else []
        bounds = [0, *cuts, size]
        batch = []
        for a, b in itertools.pairwise(bounds):
            txn = Txn("commit", calls(b - a))
            if rng.random() < config.rollback_fraction:
                doomed = calls(max(1, b - a))
                if rng.random() < 0.5:
                    batch.append(Txn("rollback", doomed))
                else:
                    txn = Txn("savepoint", txn.calls, doomed)
            batch.append(txn)
        rng.shuffle(batch)
        plan.append(batch)
    # At least one rolled-back transaction and one rolled-back savepoint, whatever the seed.
    kinds = {txn.kind for batch in plan for txn in batch}
    if "rollback" not in kinds:
        plan[0].insert(0, Txn("rollback", calls(3)))
    if "savepoint" not in kinds:
        plan[-1].append(Txn("savepoint", [], calls(2)))
    return plan, permanent


def split_reserve(plan: list[list[Txn]], config: Config) -> tuple[list[list[Txn]], list[list[Txn]]]:
    """Hold back the last batches of the plan for the faults that need work of their own."""
    counts = config.schedule_counts()
    own = ("window", "refuse", "restart", "stall", "cut", "lost-push", "long-send")
    wanted = 2 * sum(counts[name] for name in own)
    size = min(wanted, len(plan) // 4)
    if size == 0:
        return plan, []
    return plan[:-size], plan[-size:]


class EnqueueMixin:
    """The part of ``Child`` that enqueues (see child.py for the attributes)."""

    plan: deque[list[Txn]]
    reserve: deque[list[Txn]]
    committed: dict[str, str]
    rolled_back: dict[str, str]
    counts: Counter[str]

    def enqueue_next(self, use_reserve: bool = False) -> bool:
        """Run the next batch of the plan (or of the reserve); False when used up."""
        if self.plan:
            self.enqueue_batch(self.plan.popleft())
            return True
        if use_reserve and self.reserve:
            self.enqueue_batch(self.reserve.popleft())
            return True
        return False

    def enqueue_extra(self, n: int) -> None:
        """Plan and reserve are used up, a fault still needs work: n more deliveries."""
        serial = len(self.committed) + len(self.rolled_back)
        addresses = [f"extra{serial + i}@example.com" for i in range(n)]
        self.enqueue_batch([Txn("commit", [[address] for address in addresses])])
        self.counts["extra enqueued for faults"] += n

    def enqueue_batch(self, batch: list[Txn]) -> None:
        """Run one batch of transactions with enqueue_email, remembering every Message-ID."""
        from django.db import transaction

        from outbox import enqueue_email

        class RollBack(Exception):
            pass

        def call(recipients: list[str], into: dict[str, str]) -> None:
            serial = len(self.committed) + len(self.rolled_back) + len(into)
            for delivery in enqueue_email(
                f"chaos {serial}", f"chaos run message {serial}\n", None, recipients
            ):
                into[delivery.message_id] = delivery.recipient

        for txn in batch:
            done: dict[str, str] = {}
            doomed: dict[str, str] = {}
            try:
                with transaction.atomic():
                    for recipients in txn.calls if txn.kind != "rollback" else []:
                        call(recipients, done)
                    if txn.kind == "savepoint":
                        try:
                            with transaction.atomic():
                                for recipients in txn.rolled_back_calls:
                                    call(recipients, doomed)
                                raise RollBack
                        except RollBack:
                            pass
                    if txn.kind == "rollback":
                        for recipients in txn.calls:
                            call(recipients, doomed)
                        raise RollBack
            except RollBack:
                pass
            self.committed.update(done)
            self.rolled_back.update(doomed)

    def queued_count(self) -> int:
        from outbox.models import Delivery

        return Delivery.objects.filter(status="queued").count()

    def ensure_work(self, minimum: int, for_fault: bool = False) -> None:
        """Keep at least ``minimum`` rows queued; a fault may draw on the reserve, then extras."""
        if self.queued_count() >= minimum:
            return
        if not self.enqueue_next(use_reserve=for_fault) and for_fault:
            self.enqueue_extra(max(minimum, 5))
