"""The checks of a chaos run: every row against the SMTP receipts and the Attempt log.

``analyze`` reads what the SMTP server received, every Delivery row and every
sweeper Attempt, counts (``COUNT_KEYS``) and applies the rules; any broken rule
is a violation, and the run exits 1 (the rules of the edge faults,
restarts under a reused id, a skewed clock, SMTP stalls and cuts, are in
expectations.py). The rules: nothing lost (no row left
queued/processing, no row "sent" without a receipt, no receipt for an unknown
Message-ID), no rolled-back email arrives, no receipt for the wrong recipient;
under "review" no email arrives twice, and every email that arrived is either
``sent`` or ``abandoned`` (left to a person; an ``abandoned`` row that did not
arrive is fine: the worker died before the server had it); under "requeue" the
extra copies are no more than the rows that a killed or stopped worker had in
its send window plus the retries after an outcome in doubt, and each
duplicated row has a sweeper "requeued"/"abandoned" Attempt or an in-doubt
retry per extra copy. A worker that exits on its own counts as a violation too.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any

from tests.chaos.config import COUNT_KEYS, LIVE, NET_COUNT_KEYS
from tests.chaos.expectations import check_new_faults, disturbed_incarnations
from tests.chaos.expectations_net import (
    Acts,
    abandoning_acts,
    check_net_faults,
    sweeper_act_explained,
)

if TYPE_CHECKING:
    from tests.chaos.child import Child

Row = tuple[int, str, str, int]  # pk, recipient, status, attempts
ProblemRows = dict[str, list[int]]


@dataclass
class Evidence:
    """What the run left: receipts, copies per Message-ID, rows, sweeper actions."""

    receipts: list[tuple[str, str]]
    copies: Counter[str]
    rows: dict[str, Row]  # by Message-ID
    by_pk: dict[int, tuple[str, str, str, int]]  # pk -> Message-ID, recipient, status, attempts
    sweeper_acts: dict[int, list[tuple[str, str]]]  # pk -> (outcome, worker id)
    doubts: dict[int, list[tuple[str, str]]]  # pk -> (outcome, worker id): in-doubt attempts
    receipt_times: dict[str, list[float]] = field(default_factory=dict)  # Message-ID -> times
    acts: Acts = field(default_factory=dict)  # sweeper settlements, workers' "ambiguous", timed


def gather(child: Child) -> Evidence:
    from django.db.models import Q

    from outbox.models import Attempt, Delivery

    receipts: list[tuple[str, str]] = []
    receipt_times: dict[str, list[float]] = defaultdict(list)
    for line in child.receipts_path.read_text(encoding="utf-8").splitlines():
        message_id, rcpt, when = line.split(" ")
        receipts.append((message_id, rcpt))
        receipt_times[message_id].append(float(when))
    copies = Counter(message_id for message_id, _ in receipts)
    rows = {
        message_id: (pk, recipient, status, attempts)
        for pk, message_id, recipient, status, attempts in Delivery.objects.values_list(
            "pk", "message_id", "recipient", "status", "attempts"
        )
    }
    by_pk = {row[0]: (message_id, *row[1:]) for message_id, row in rows.items()}
    sweeper_acts: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for delivery_id, outcome, worker_id in Attempt.objects.filter(actor="sweeper").values_list(
        "delivery_id", "outcome", "worker_id"
    ):
        sweeper_acts[delivery_id].append((outcome, worker_id))
    # A worker's attempt whose outcome was in doubt (an SMTP stall or cut after
    # DATA): "ambiguous" under review, a "retry" whose error says so under requeue.
    doubts: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for delivery_id, outcome, worker_id in (
        Attempt.objects.exclude(actor="sweeper")
        .filter(Q(outcome="ambiguous") | Q(error__startswith="in doubt"))
        .values_list("delivery_id", "outcome", "worker_id")
    ):
        doubts[delivery_id].append((outcome, worker_id))
    return Evidence(
        receipts, copies, rows, by_pk, sweeper_acts, doubts, receipt_times, abandoning_acts()
    )


def analyze(child: Child) -> dict[str, Any]:
    """Count, check every rule, and return the run's result (violations included)."""
    ev = gather(child)
    c: Counter[str] = Counter({key: 0 for key in COUNT_KEYS})
    c["enqueued"] = len(child.committed)
    c["rolled back"] = len(child.rolled_back)
    c["rows"] = len(ev.rows)
    problem_rows: ProblemRows = defaultdict(list)

    check_rows_match_plan(child, ev)
    count_receipts(child, ev, c)
    count_rows(child, ev, c, problem_rows)
    c["window hits"] = count_window_hits(child, ev, c)
    check_documented_outcomes(child, ev, c, problem_rows)
    check_new_faults(child, ev, c, problem_rows)
    check_net_faults(child, ev, c, problem_rows)
    add_violations(child, c, problem_rows)
    child.details.extend(row_details(child, problem_rows, ev.copies))
    return result_of(child, c)


def check_rows_match_plan(child: Child, ev: Evidence) -> None:
    """Every committed delivery is a row, and no rolled-back one is."""
    rows = ev.rows
    missing = set(child.committed) - set(rows)
    extra = set(rows) - set(child.committed)
    if missing:
        child.violations.append(f"{len(missing)} committed deliveries have no row")
    if extra:
        child.violations.append(f"{len(extra)} rows the harness did not commit (rolled back?)")


def count_receipts(child: Child, ev: Evidence, c: Counter[str]) -> None:
    """Receipts for rolled-back, unknown or other recipients' emails."""
    rows, receipts = ev.rows, ev.receipts
    for message_id, rcpt in receipts:
        row = rows.get(message_id)
        if row is None:
            if message_id in child.rolled_back:
                c["rolled-back arrived"] += 1
            else:
                c["unknown receipts"] += 1
                child.details.append(f"receipt for unknown Message-ID {message_id} to {rcpt}")
        elif not same_mailbox(rcpt, wire_address(row[1])):
            c["misaddressed"] += 1
            child.details.append(f"row {row[0]}: receipt to {rcpt}, row is for {row[1]}")


def wire_address(recipient: str) -> str:
    """The envelope address a row's recipient becomes: bare, its domain IDNA-encoded.

    Django sends the local part as written and the domain in its IDNA form; a
    plain ASCII domain keeps its case (the SMTP server receives it so).
    """
    local, _, domain = parseaddr(recipient)[1].rpartition("@")
    return f"{local}@{domain.encode('idna').decode('ascii')}"


def same_mailbox(a: str, b: str) -> bool:
    """The same envelope address: the local part as written, the domain in any case."""
    a_local, _, a_domain = a.rpartition("@")
    b_local, _, b_domain = b.rpartition("@")
    return a_local == b_local and a_domain.lower() == b_domain.lower()


def count_rows(child: Child, ev: Evidence, c: Counter[str], problem_rows: ProblemRows) -> None:
    """Each row's status against the copies that arrived."""
    rows, copies, sweeper_acts = ev.rows, ev.copies, ev.sweeper_acts
    for message_id, (pk, recipient, status, _attempts) in rows.items():
        n = copies.get(message_id, 0)
        c[status] += 1
        if wire_address(recipient) != recipient:
            c["hostile recipients"] += 1
        if n == 1:
            c["delivered once"] += 1
        elif n >= 2:
            c["delivered twice or more"] += 1
            c["extra copies"] += n - 1
            problem_rows["duplicate"].append(pk)
            explained = [a for a in sweeper_acts.get(pk, []) if a[0] in ("requeued", "abandoned")]
            explained += ev.doubts.get(pk, [])
            if len(explained) < n - 1:
                c["unexplained duplicates"] += 1
                problem_rows["unexplained duplicate"].append(pk)
        if status in LIVE:
            c["not terminal"] += 1
            problem_rows["not terminal"].append(pk)
        elif status == "sent" and n == 0:
            c["sent without receipt"] += 1
            problem_rows["sent without receipt"].append(pk)
        elif status == "failed":
            if recipient in child.permanent:
                c["failed permanent"] += 1
            if n:
                c["failed but arrived"] += 1
                if not sweeper_acts.get(pk):
                    c["failed arrived unexplained"] += 1
                    problem_rows["failed but arrived, no sweeper action"].append(pk)
        elif status == "abandoned":
            c["abandoned arrived" if n else "abandoned not arrived"] += 1
        if child.config.policy == "review" and n and status not in ("sent", "abandoned"):
            # At most once: what arrived is either recorded as sent or left to a person.
            problem_rows["arrived, neither sent nor abandoned (review)"].append(pk)
        if recipient in child.permanent and n:
            c["permanent recipient arrived"] += 1
            problem_rows["refused recipient arrived"].append(pk)


def count_window_hits(child: Child, ev: Evidence, c: Counter[str]) -> int:
    """Rows a killed, stopped or cut-off worker had in its send window: the sweeper settled them.

    Cut off: a proxied worker a network fault reached just before (network.py).
    """
    disturbed = disturbed_incarnations(child)
    window_hits = 0
    for pk, acts in ev.acts.items():
        for what, worker_id, when in acts:
            if what not in ("sweeper requeued", "sweeper abandoned", "sweeper failed"):
                continue
            why = sweeper_act_explained(child, worker_id, when, disturbed)
            if why:
                window_hits += 1
                c["sweeper acts explained by network faults"] += why == "network"
            else:
                c["sweeper acted on undisturbed worker"] += 1
                child.details.append(
                    f"row {pk}: {what} it from worker {worker_id!r}, which the "
                    "harness did not kill or stop, nor cut off from its servers"
                )
    return window_hits


def check_documented_outcomes(
    child: Child, ev: Evidence, c: Counter[str], problem_rows: ProblemRows
) -> None:
    """The documented outcome of each SIGKILL after_send and of each refused "mark sent"."""
    config, copies, by_pk = child.config, ev.copies, ev.by_pk
    for pk in child.window_rows:
        message_id, _recipient, status, _a = by_pk[pk]
        n = copies.get(message_id, 0)
        ok = (
            (status == "abandoned" and n == 1)
            if config.policy == "review"
            else (status in ("sent", "failed") and n >= 2)
        )
        if not ok:
            problem_rows["after_send kill not as documented"].append(pk)
    # The refused "mark sent": retried, the row sent once, the refusal in the worker log.
    for pk, _pid, log, offset in child.refused_rows:
        message_id, _recipient, status, _a = by_pk[pk]
        n = copies.get(message_id, 0)
        # What the worker logged after it was woken: its first database call fails. Its
        # words depend on which call that is ("database error recording delivery <pk> as
        # sent" alone, "the database is unavailable (...)" with the next claim) and the
        # error's on psycopg ("terminating connection ...", "the connection is lost", ...).
        text = log.read_bytes()[offset:].decode(errors="replace")
        if "database error recording delivery" in text or "the database is unavailable" in text:
            c["refusals confirmed"] += 1
        else:
            problem_rows["refused write not seen in the worker log"].append(pk)
        if not (status == "sent" and n == 1):
            problem_rows["refused mark sent not recovered"].append(pk)


def add_violations(child: Child, c: Counter[str], problem_rows: ProblemRows) -> None:
    """The rules: every one broken is a line in ``child.violations``."""
    config, window_hits = child.config, c["window hits"]
    lost = c["not terminal"] + c["sent without receipt"] + c["unknown receipts"]
    c["lost"] = lost + c["rolled-back arrived"]
    v = child.violations
    if lost:
        v.append(
            f"{lost} emails lost ({c['not terminal']} not terminal, {c['sent without receipt']} "
            f"sent without receipt, {c['unknown receipts']} receipts for unknown Message-IDs)"
        )
    if c["rolled-back arrived"]:
        v.append(f"{c['rolled-back arrived']} rolled-back emails arrived")
    if c["misaddressed"]:
        v.append(f"{c['misaddressed']} receipts went to the wrong recipient")
    if c["permanent recipient arrived"]:
        v.append(f"{c['permanent recipient arrived']} emails to a 550 recipient arrived")
    if config.policy == "review" and c["delivered twice or more"]:
        v.append(f"review policy: {c['delivered twice or more']} emails arrived twice or more")
    if config.policy == "requeue":
        if c["extra copies"] > window_hits + c["in-doubt retries"]:
            v.append(
                f"requeue policy: {c['extra copies']} extra copies, more than the "
                f"{window_hits} rows killed/stopped workers had in their send window and the "
                f"{c['in-doubt retries']} retries after an outcome in doubt"
            )
        if c["unexplained duplicates"]:
            v.append(
                f"requeue policy: {c['unexplained duplicates']} duplicated rows without a "
                "sweeper requeued/abandoned Attempt per extra copy"
            )
    if c["failed arrived unexplained"]:
        v.append(f"{c['failed arrived unexplained']} failed rows arrived, no sweeper action")
    if c["sweeper acted on undisturbed worker"]:
        v.append(
            f"the sweeper settled {c['sweeper acted on undisturbed worker']} rows of workers "
            "the harness did not kill or stop"
        )
    for what in (
        "after_send kill not as documented",
        "refused write not seen in the worker log",
        "refused mark sent not recovered",
        "arrived, neither sent nor abandoned (review)",
        "restart row not settled by the sweeper as documented",
        "skewed worker's row settled by the sweeper",
        "stall/cut row not as documented",
        "abandoned row sent after it was abandoned",
        "abandoned row not in doubt",
        "row-lock row not as documented",
        "long-send row not as documented",
    ):
        if problem_rows.get(what):
            v.append(f"{what}: rows {problem_rows[what]}")
    if child.unexpected_exits:
        v.append(f"{len(child.unexpected_exits)} worker processes exited on their own")
        child.details.extend(child.unexpected_exits)


def result_of(child: Child, c: Counter[str]) -> dict[str, Any]:
    """The run's result, as the child writes it (JSON) for the parent."""
    config = child.config
    counts = {key: c[key] for key in COUNT_KEYS} | dict(c)
    counts.update(
        {
            "random SIGKILL": child.counts["random SIGKILL"],
            "SIGSTOP": child.counts["SIGSTOP"],
            "SIGKILL after_send": child.counts["SIGKILL after_send"],
            "db refusals": child.counts["db refusals"],
            "backends terminated": child.counts["backends terminated"],
            "redis wipe": child.counts["redis wipe"],
            "restart under reused id": child.counts["restart under reused id"],
            "skewed workers": child.counts["skewed workers"],
            "slow web host enqueues": child.counts["slow web host enqueues"],
            "slow web host rows": child.counts["slow web host rows"],
            "stall after DATA": child.counts["stall after DATA"],
            "cut after DATA": child.counts["cut after DATA"],
            "extra enqueued for faults": child.counts["extra enqueued for faults"],
            "workers started": child.counts["workers started"],
            "sweeper restarts": len(child.sweeper_restarts),
            "unexpected exits": len(child.unexpected_exits),
            "drain timed out": child.counts["drain timed out"],
        }
        | {key: child.counts[key] for key in NET_COUNT_KEYS}
        | child.proxy_counters()
    )
    smtp_answers = dict(child.smtp.answers) if child.smtp else {}
    return {
        "policy": config.policy,
        "config": asdict(config),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "database": child.db_name,
        "counts": counts,
        "smtp": smtp_answers,
        "events": child.events,
        "sweeper_restarts": child.sweeper_restarts,
        "violations": child.violations,
        "details": child.details,
        "logs": str(child.logs),
        "ok": not child.violations,
    }


def row_details(
    child: Child, problem_rows: dict[str, list[int]], copies: Counter[str]
) -> list[str]:
    """The Attempt log (and for live rows, where Redis holds the id) of problem rows."""
    from outbox.models import Attempt, Delivery

    out = []
    for what, pks in problem_rows.items():
        if what == "duplicate" and child.config.policy == "requeue":
            pks = pks[:5]  # expected under requeue: a few examples are enough
        for pk in pks[:20]:
            row = Delivery.objects.get(pk=pk)
            out.append(
                f"[{what}] row {pk} {row.recipient} {row.message_id}: status {row.status}, "
                f"attempts {row.attempts}/{row.max_attempts}, worker {row.worker_id!r}, "
                f"receipts {copies.get(row.message_id, 0)}, updated {row.updated_at:%H:%M:%S.%f}"
                + (f", redis: {where_in_redis(child, pk)}" if row.status in LIVE else "")
            )
            for a in Attempt.objects.filter(delivery_id=pk).order_by("id"):
                out.append(
                    f"    attempt #{a.number} {a.outcome} by {a.actor or '-'} worker "
                    f"{a.worker_id!r} started {a.started_at:%H:%M:%S.%f} "
                    f"{(a.error or '')[:150]}"
                )
        if len(pks) > 20:
            out.append(f"[{what}] ... and {len(pks) - 20} more rows")
    return out


def where_in_redis(child: Child, pk: int) -> str:
    from redis.exceptions import RedisError

    try:
        client = child.redis_client()
        found = []
        for key in client.scan_iter(match="{outbox}:*"):
            kind = client.type(key).decode()
            member = str(pk)
            if kind == "list":
                held = client.lpos(key, member) is not None
            elif kind == "set":
                held = bool(client.sismember(key, member))
            elif kind == "zset":
                held = any(m.decode().split(":")[0] == member for m in client.zrange(key, 0, -1))
            else:
                held = False
            if held:
                found.append(key.decode())
        return ", ".join(found) or "nowhere"
    except RedisError as exc:
        return f"unknown ({exc})"
