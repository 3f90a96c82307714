"""The rules of the edge faults: reused worker ids, a skewed clock, SMTP doubts.

``check_new_faults`` is called by analysis.py with the run's evidence:

- **restart under a reused id** (faults/restart.py): the row the killed
  incarnation held is settled by the sweeper under that incarnation's name,
  never left ``processing``: under "review" ``abandoned`` (it never reached the
  server, so no receipt); under "requeue" requeued, then ``sent`` (or
  ``failed``); its copies are left to the general duplicate rules, since an
  earlier fault may have delivered it already.
- **a skewed clock** (faults/skew.py): the worker is never declared dead (no
  "declared dead" line naming one of its incarnations in the sweeper's log; a
  new incarnation after the Redis wipe is fine, Redis lost every entry), it
  delivers, and the sweeper never settles a row it held; no row it held ends
  ``abandoned`` unless the SMTP server made the outcome doubtful on purpose.
- **SMTP stall / cut after DATA** (faults/stall.py, faults/cut.py): the worker
  records the attempt as in doubt. Under "review" the row ends ``abandoned``
  with an "ambiguous" Attempt and as many receipts as the server recorded (one
  or none), never resent; under "requeue" it is retried ("retry" Attempt whose
  error starts "in doubt") and ends ``sent``, having arrived at least once.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from tests.chaos.processes import incarnations

if TYPE_CHECKING:
    from tests.chaos.analysis import Evidence, ProblemRows
    from tests.chaos.child import Child


def disturbed_incarnations(child: Child) -> set[str]:
    """Every incarnation of a worker process the harness killed or stopped."""
    return {
        name
        for proc in child.procs
        if proc.pid in child.disturbed
        for name in incarnations(proc.log)
    }


def check_new_faults(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    check_restarts(child, ev, c, problems)
    check_skewed(child, ev, c, problems)
    check_ambiguous(child, ev, c, problems)


def check_restarts(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    """The killed incarnation's row, settled by the sweeper as the policy says."""
    review = child.config.policy == "review"
    for pk, old in child.restart_rows:
        c["restart rows"] += 1
        message_id, _recipient, status, _attempts = ev.by_pk[pk]
        n = ev.copies.get(message_id, 0)
        acts = {outcome for outcome, worker_id in ev.sweeper_acts.get(pk, []) if worker_id == old}
        if review:
            ok = status == "abandoned" and "abandoned" in acts and n == 0
        else:
            # Copies are not this fault's to count: the row may have arrived before,
            # from another fault's send window (the duplicate rules explain those).
            ok = bool(acts & {"requeued", "failed"}) and status in ("sent", "failed")
        if not ok:
            c["restart rows not settled by the sweeper"] += 1
            problems["restart row not settled by the sweeper as documented"].append(pk)


def check_skewed(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    """A worker 90 s behind: never declared dead, delivers, none of its rows swept."""
    from outbox.models import Delivery

    sweeper_log = (child.logs / "sweeper.log").read_text(errors="replace")
    dead_lines = [line for line in sweeper_log.splitlines() if line.startswith("declared dead")]
    on_purpose = {pk for _kind, pk in child.smtp_fault_rows}
    for proc in child.skewed:
        names = incarnations(proc.log)
        rows = Delivery.objects.filter(worker_id__in=names)
        delivered = rows.filter(status="sent").count()
        c["skew delivered"] += delivered
        # A new incarnation after a Redis wipe is fine (Redis lost every entry); only
        # the sweeper declaring it dead is not.
        found = [f"sweeper: {line}" for line in dead_lines if any(n in line for n in names)]
        if not delivered:
            found.append("it delivered nothing")
        for pk in rows.filter(status="abandoned").values_list("pk", flat=True):
            if pk not in on_purpose:
                problems["skewed worker's row settled by the sweeper"].append(pk)
        for pk, acts in ev.sweeper_acts.items():
            if any(worker_id in names for _outcome, worker_id in acts):
                problems["skewed worker's row settled by the sweeper"].append(pk)
        c["skew problems"] += len(found)
        child.violations += [f"skewed {proc.name} (pid {proc.pid}): {text}" for text in found]


def check_ambiguous(child: Child, ev: Evidence, c: Counter[str], problems: ProblemRows) -> None:
    """Rows whose send the SMTP server stalled or cut after DATA: in doubt, as documented."""
    review = child.config.policy == "review"
    played = played_by_message_id(child)
    for kind, pk in child.smtp_fault_rows:
        c[f"{kind}s played"] += 1
        message_id, _recipient, status, _attempts = ev.by_pk[pk]
        n = ev.copies.get(message_id, 0)
        doubts = [outcome for outcome, _worker in ev.doubts.get(pk, [])]
        recorded = played.get(message_id, {}).get("recorded")
        if recorded is None:
            ok = False  # the server never played it for this row
        elif review:
            ok = status == "abandoned" and "ambiguous" in doubts and n == int(recorded)
        else:
            ok = "retry" in doubts and status == "sent" and n >= 1
        if not ok:
            c["stall/cut rows not as documented"] += 1
            problems["stall/cut row not as documented"].append(pk)
    c["ambiguous rows"] = len(ev.doubts)
    c["in-doubt retries"] = sum(
        1 for acts in ev.doubts.values() for outcome, _worker in acts if outcome == "retry"
    )
    others = sorted(set(ev.doubts) - {pk for _kind, pk in child.smtp_fault_rows})
    if others:
        child.details.append(f"rows in doubt the harness did not stall or cut: {others[:20]}")


def played_by_message_id(child: Child) -> dict[str, dict[str, Any]]:
    smtp = child.smtp
    return {p["message_id"]: p for p in smtp.played} if smtp is not None else {}
