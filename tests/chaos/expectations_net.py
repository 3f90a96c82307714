"""The rules of the network and signal faults, and the two rules about abandoned rows.

``check_net_faults`` is called by analysis.py with the run's evidence:

- **no abandoned row is ever sent**: every receipt of a row that ends
  ``abandoned`` was recorded by the SMTP server before the row became
  abandoned (the first "abandoned" Attempt by the sweeper, or "ambiguous" by
  a worker: its time). An abandoned row that arrived is fine when the copy
  predates the abandonment (the worker died, or the server went silent, after
  handing it over): what may never happen is a send after it. No person
  settles rows in the run, so an abandoned row stays so. The times are the
  SMTP server's clock and Redis time, both this host's clock; a copy counts as
  later only past ``CLOCK_MARGIN`` (a worker writes Redis time as it last
  observed it plus its monotonic time since).
- **every abandoned row is truly in doubt**: the attempt that abandoned it is
  the sweeper's, for a worker the harness killed or stopped (in its send
  window or not, as analysis.py's window hits) or one a network fault reached
  (``network.explains``), or the worker's own "ambiguous" on a row whose SMTP
  answer the harness stalled or cut (faults/stall.py, cut.py).
- **SIGSTOP while blocked on a row lock** (faults/row_lock.py): never sent
  while abandoned; under "review" ``abandoned`` with no receipt (it had never
  been tried), under "requeue" requeued by the sweeper, then ``sent`` (or
  ``failed``) with one receipt at most.
- **SIGTERM during a long send** (faults/long_send.py): the row ends ``sent``
  with exactly one receipt, the sweeper never touched it, nothing in doubt,
  and the worker exited 0.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from tests.chaos.network import explains
from tests.chaos.processes import pid_of

if TYPE_CHECKING:
    from tests.chaos.analysis import Evidence, ProblemRows
    from tests.chaos.child import Child

CLOCK_MARGIN = 0.25  # seconds

Acts = dict[int, list[tuple[str, str, float]]]  # pk -> (outcome, worker id, epoch seconds)


def epoch(value: datetime.datetime | None) -> float:
    if value is None:
        return 0.0
    if value.tzinfo is None:  # naive: UTC, as the run's settings store it
        value = value.replace(tzinfo=datetime.UTC)
    return value.timestamp()


def abandoning_acts() -> Acts:
    """Every attempt that made a row abandoned: the sweeper's and the workers' in doubt."""
    from django.db.models import Q

    from outbox.models import Attempt

    acts: Acts = defaultdict(list)
    found = Attempt.objects.filter(
        Q(actor="sweeper", outcome__in=("abandoned", "requeued", "failed")) | Q(outcome="ambiguous")
    ).order_by("id")
    for pk, outcome, actor, worker_id, started, finished in found.values_list(
        "delivery_id", "outcome", "actor", "worker_id", "started_at", "finished_at"
    ):
        who = "sweeper" if actor == "sweeper" else "worker"
        acts[pk].append((f"{who} {outcome}", worker_id, epoch(finished or started)))
    return acts


def sweeper_act_explained(child: Child, worker_id: str, when: float, disturbed: set[str]) -> str:
    """Why the sweeper may settle a row of ``worker_id`` at ``when``: "", or the reason."""
    if worker_id in disturbed or pid_of(worker_id) in child.disturbed:
        return "disturbed"
    return "network" if explains(child, worker_id, when) else ""


def check_net_faults(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    check_abandoned(child, ev, c, problems)
    check_lock_rows(child, ev, c, problems)
    check_long_sends(child, ev, c, problems)


def check_abandoned(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    """Abandoned rows: no copy after the abandonment, and each one truly in doubt."""
    from tests.chaos.expectations import disturbed_incarnations

    disturbed = disturbed_incarnations(child)
    smtp_rows = {pk for _kind, pk in child.smtp_fault_rows}
    for pk, (message_id, _rcpt, status, _attempts) in ev.by_pk.items():
        if status != "abandoned":
            continue
        acts = [a for a in ev.acts.get(pk, []) if a[0] in ("sweeper abandoned", "worker ambiguous")]
        if not acts:
            c["abandoned not in doubt"] += 1
            problems["abandoned row not in doubt"].append(pk)
            continue
        kind, worker_id, when = acts[0]
        late = [t for t in ev.receipt_times.get(message_id, []) if t > when + CLOCK_MARGIN]
        if late:
            c["receipt after abandonment"] += len(late)
            problems["abandoned row sent after it was abandoned"].append(pk)
            child.details.append(
                f"row {pk}: abandoned at {when:.3f} ({kind}), receipts at "
                + ", ".join(f"{t:.3f}" for t in ev.receipt_times[message_id])
            )
        if kind == "sweeper abandoned":
            ok = bool(sweeper_act_explained(child, worker_id, when, disturbed))
        else:
            ok = pk in smtp_rows
        if not ok:
            c["abandoned not in doubt"] += 1
            problems["abandoned row not in doubt"].append(pk)


def check_lock_rows(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    review = child.config.policy == "review"
    for pk, _pid in child.lock_rows:
        c["lock rows"] += 1
        message_id, _rcpt, status, _attempts = ev.by_pk[pk]
        n = ev.copies.get(message_id, 0)
        acts = {outcome for outcome, _worker in ev.sweeper_acts.get(pk, [])}
        if not acts:
            # The sweeper never acted on the row: it had not declared the frozen
            # worker dead yet (a Redis wipe can make it look gone), or the step
            # had not committed when it did. The worker's lease decided: the row
            # went out once, or was released and sent once by someone else.
            ok = (status, n) in (("sent", 1), ("failed", 0))
        elif review:
            ok = status == "abandoned" and "abandoned" in acts and n == 0
        else:
            ok = bool(acts & {"requeued", "failed"}) and status in ("sent", "failed") and n <= 1
        if not ok:
            c["lock rows not as documented"] += 1
            problems["row-lock row not as documented"].append(pk)


def check_long_sends(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    for pk, _pid, code in child.long_send_rows:
        c["long-send rows"] += 1
        message_id, _rcpt, status, _attempts = ev.by_pk[pk]
        n = ev.copies.get(message_id, 0)
        touched = ev.sweeper_acts.get(pk) or ev.doubts.get(pk)
        if not (status == "sent" and n == 1 and not touched and code == 0):
            c["long-send rows not as documented"] += 1
            problems["long-send row not as documented"].append(pk)
