"""The benchmark's floors (PostgreSQL, issue 27): what an email costs before our worker's Python.

The CPU target (ours <= 0.5x post_office's best, per delivered email) is judged on
workers + PostgreSQL + redis-server. Two parts of that sum are not the worker's
Python, and each is measured here with no worker running:

- **The protocol's writes.** Every email is marked ``processing`` before it is
  handed over and ``sent`` after: two conditional UPDATEs, each durable. This
  process drives the worker's own step statements (``outbox.worker.sql.run_steps``,
  the group commit's batch: the success of one email and the claim of the next,
  per step) over n queued rows, in batches of 1, 9 (what the group commit wrote
  per commit in the no-op run) and 16, and counts PostgreSQL's CPU only (this
  process's is left out), the median of three runs each. Once more with the
  secondary indexes the two UPDATEs write dropped: the most that pruning indexes
  could save.
- **Django's SMTP send.** Our worker and post_office both hand each message to
  Django's SMTP backend, which builds it (``message()``), flattens it
  (``as_bytes()``), parses both addresses (``sanitize_address()``) and talks SMTP
  (``smtplib``). Measured in this process, one thread, one connection, against
  the sink with no delay: the whole ``send_messages()`` and its parts.

- **The enqueue's Redis push.** ``enqueue_email`` pushes the new row's id to
  Redis after its commit (``queue.publish``), a round trip ``mail.send`` does not
  make. Measured alone, one id per call as the enqueue pushes it: this
  process's CPU and redis-server's.

``floor_section`` adds them up against post_office's best tier: the least our
tier could be if our worker's own Python cost nothing.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from tests.benchmark.common import BODY, SENDER, SUBJECT, rcpt

BATCHES = (1, 9, 16)
# The secondary indexes a claim UPDATE and a success UPDATE write (the status
# changes, so neither is a HOT update); the primary key stays.
HOT_PATH_INDEXES = (
    "outbox_deliv_processing",
    "outbox_deliv_sent_at",
    "outbox_delivery_email_id_5ffd3aff",
)
HOT_PATH_CONSTRAINT = "outbox_delivery_message_id_uniq"


def steps_floor(
    n: int, batch: int, pg_cpu: Callable[[], float], reset: Callable[[], None], seed: Any
) -> dict[str, float]:
    """PostgreSQL's CPU per email for the worker's steps alone, ``batch`` steps per commit."""
    from django.db import connection
    from django.utils import timezone

    from outbox.worker import sql

    reset()
    seed(n)
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM outbox_delivery WHERE status = 'queued' ORDER BY id")
        ids = [row[0] for row in cur.fetchall()]
        cur.execute("CHECKPOINT")  # no checkpoint of the seeding inside the measurement
    tokens = {pk: uuid.uuid4() for pk in ids}
    settle: list[int] = []
    before, start = pg_cpu(), time.perf_counter()
    for k in range(0, len(ids) + batch, batch):
        claim = ids[k : k + batch]
        width = max(len(claim), len(settle))
        if not width:
            break
        now = timezone.now()
        steps = []
        for j in range(width):
            done = settle[j] if j < len(settle) else None
            next_id = claim[j] if j < len(claim) else None
            steps.append(
                sql.Step(
                    (done, tokens[done]) if done is not None else None,
                    next_id,
                    "floor",
                    tokens[next_id] if next_id is not None else uuid.uuid4(),
                    now,
                    0,
                )
            )
        results = sql.run_steps(steps)
        if any(s.settle is not None and r[0] != 1 for s, r in zip(steps, results, strict=True)):
            raise RuntimeError("a step did not settle its row")
        settle = claim
    used, wall = pg_cpu() - before, time.perf_counter() - start
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM outbox_delivery WHERE status = 'sent'")
        sent = cur.fetchone()[0]
    connection.close()
    if sent != n:
        raise RuntimeError(f"steps floor: {sent} of {n} rows sent")
    return {"postgres": used / n, "rate": n / wall}


def without_hot_path_indexes(run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``run()`` with the hot path's secondary indexes dropped; put back after."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'outbox_delivery' "
            "AND indexname = ANY(%s)",
            [list(HOT_PATH_INDEXES)],
        )
        definitions = dict(cur.fetchall())
        if set(definitions) != set(HOT_PATH_INDEXES):
            raise RuntimeError(f"indexes not found: {set(HOT_PATH_INDEXES) - set(definitions)}")
        for name in HOT_PATH_INDEXES:
            cur.execute(f"DROP INDEX {name}")
        cur.execute(f"ALTER TABLE outbox_delivery DROP CONSTRAINT {HOT_PATH_CONSTRAINT}")
    try:
        return run()
    finally:
        with connection.cursor() as cur:
            cur.execute("TRUNCATE outbox_delivery, outbox_attempt")
            for name in HOT_PATH_INDEXES:
                cur.execute(definitions[name])
            cur.execute(
                f"ALTER TABLE outbox_delivery ADD CONSTRAINT {HOT_PATH_CONSTRAINT} "
                "UNIQUE (message_id)"
            )
        connection.close()


def django_send_floor(n: int, port: int) -> dict[str, float]:
    """This process's CPU per message of Django's SMTP ``send_messages()``, and of its parts."""
    from django.core.mail import EmailMessage
    from django.core.mail import message as django_message
    from django.core.mail.backends.smtp import EmailBackend

    def cpu_per(call: Callable[[int], object]) -> float:
        start = time.process_time()
        for i in range(n):
            call(i)
        return (time.process_time() - start) / n

    def make(i: int) -> EmailMessage:
        return EmailMessage(SUBJECT, BODY, SENDER, [rcpt(i)])

    backend = EmailBackend(host="127.0.0.1", port=port)
    backend.open()
    try:
        out = {"send_messages": cpu_per(lambda i: backend.send_messages([make(i)]))}
        built: list[Any] = []
        out["message"] = cpu_per(lambda i: built.append(make(i).message()))
        flat = [b""] * n
        out["as_bytes"] = cpu_per(lambda i: flat.__setitem__(i, built[i].as_bytes(linesep="\r\n")))
        sanitize = getattr(django_message, "sanitize_address", None)
        if sanitize is not None:  # Django 5.2's backend parses both addresses with it
            out["sanitize_address"] = cpu_per(
                lambda i: (sanitize(SENDER, "utf-8"), sanitize(rcpt(i), "utf-8"))
            )
        smtp = backend.connection
        assert smtp is not None
        out["smtplib"] = cpu_per(lambda i: smtp.sendmail(SENDER, [rcpt(i)], flat[i]))
    finally:
        backend.close()
    return out


def push_floor(n: int, redis_cpu: Callable[[], float]) -> dict[str, float]:
    """CPU per call of the push an ``enqueue_email`` makes after its commit (one id)."""
    from outbox.models import Delivery
    from outbox.queue.entries import QueueEntry
    from outbox.queue.publish import publish

    normal = Delivery.Priority.NORMAL
    publish([QueueEntry(n + 1, normal, 0.0)])  # the connection and the script, once
    before, redis_before = time.process_time(), redis_cpu()
    for i in range(1, n + 1):
        if not publish([QueueEntry(i, normal, 0.0)]):
            raise RuntimeError("push floor: Redis refused a push")
    return {"caller": (time.process_time() - before) / n, "redis": (redis_cpu() - redis_before) / n}


def _us(x: float) -> str:
    return f"{1e6 * x:,.0f}"


def floor_section(
    floor: Any, noop: dict[str, Any], smtp: dict[str, Any], enqueue: dict[str, Any]
) -> list[str]:
    """The report's lines: the floors, and what they leave our worker's Python.

    ``noop``, ``smtp`` and ``enqueue``: the efficiency part's measurements, for
    post_office's best tier and for the enqueue's.
    """
    if not floor:
        return []
    steps, send = floor["steps"], floor["send"]
    po_best = noop[noop["post_office_best"]]
    po, po_smtp = _tier(po_best), _tier(smtp[smtp["post_office_best"]])
    md = [
        "",
        "### What blocks the CPU target: floors measured with no worker running",
        "",
        "PostgreSQL's CPU per email for the worker's own step statements "
        "(`sql.run_steps`: the success of one email and the claim of the next), driven "
        f"over {floor['n']:,} queued rows by the benchmark with no worker; the driver's "
        "CPU is not counted:",
        "",
        "| steps per commit | PostgreSQL µs per email | x post_office's best tier (no-op) "
        "| steps/s |",
        "|---|---:|---:|---:|",
    ]
    labels = {str(b): str(b) for b in BATCHES}
    labels["9-noindex"] = "9, the hot path's 4 secondary indexes dropped"
    for key, label in labels.items():
        s = steps[key]
        md.append(
            f"| {label} | {_us(s['postgres'])} | {s['postgres'] / po:.2f}x | {s['rate']:,.0f} |"
        )
    md += [
        "",
        "Django's SMTP backend, one message per `send_messages()`, one thread and one "
        "connection, to the sink without delay (this process's CPU; our worker and "
        "post_office both send through it):",
        "",
        "| part | µs per message |",
        "|---|---:|",
    ]
    parts = {
        "send_messages": "`send_messages()`, all of it",
        "message": "of which `message()`",
        "as_bytes": "of which `as_bytes()`",
        "sanitize_address": "of which `sanitize_address()`, sender and recipient",
        "smtplib": "of which smtplib, the SMTP talk of the flattened bytes",
    }
    md += [f"| {label} | {_us(send[key])} |" for key, label in parts.items() if key in send]
    pg9, django_send = steps["9"]["postgres"], send["send_messages"]
    md += [
        "",
        f"- No-op backend: post_office's best tier is {_us(po)} µs, so the target is "
        f"{_us(po / 2)} µs. The protocol's two writes at 9 steps per commit take "
        f"{_us(pg9)} µs of it ({pg9 / po:.2f}x) before any Python runs, which leaves "
        f"{_us(max(0.0, po / 2 - pg9))} µs per email for the worker and redis-server; "
        f"post_office's own worker spends {_us(po_best['workers'])} µs.",
        f"- 20 ms SMTP: post_office's best tier is {_us(po_smtp)} µs, so the target is "
        f"{_us(po_smtp / 2)} µs. Django's `send_messages()` alone takes {_us(django_send)} µs; "
        f"with the two writes, {_us(django_send + pg9)} µs = "
        f"{(django_send + pg9) / po_smtp:.2f}x, with our worker's own Python at zero.",
        f"- Steps share a commit only when threads reach them together. With sends spread "
        f"out (a 20 ms server, or Postfix, below saturation) most steps commit alone, at "
        f"{_us(steps['1']['postgres'])} µs each: our PostgreSQL share over the 20 ms sink "
        f"above is {_us(smtp['outbox']['postgres'])} µs, post_office's "
        f"{_us(smtp[smtp['post_office_best']]['postgres'])} µs (one UPDATE for a batch "
        "of 100 after sending them, which a crash mid-batch sends again). Marking each "
        "email durably before it is handed over is the promise; its commit is the price.",
    ]
    md += _throughput_lines(noop) + _enqueue_lines(floor.get("push"), enqueue) + [""]
    return md


def _throughput_lines(noop: dict[str, Any]) -> list[str]:
    ours = noop["outbox"]
    if "commits" not in ours:
        return []
    cores, nproc = _tier(ours) * ours["steady_rate"], os.cpu_count() or 1
    if cores >= 0.8 * nproc:
        why = "the tier is close to CPU-bound, so throughput follows the CPU per email."
    else:
        why = (
            "a sender thread waits for its step's commit before its next send, and each "
            "worker process writes one batch at a time: with cores to spare, the rate is "
            "how fast those commits follow each other."
        )
    return [
        f"- Throughput (no-op): our steady {ours['steady_rate']:,.0f}/s kept {cores:.2f} "
        f"of {nproc} cores busy (tier CPU x rate), at {1 / ours['commits']:.1f} emails "
        f"per commit; {why}",
    ]


def _enqueue_lines(push: dict[str, float] | None, enqueue: dict[str, Any]) -> list[str]:
    if not push:
        return []
    ours, po = _tier(enqueue["outbox"]), _tier(enqueue["post_office"])
    cost = push["caller"] + push["redis"]
    return [
        f"- Enqueue: the push after the commit, alone, costs {_us(push['caller'])} µs in "
        f"the caller and {_us(push['redis'])} µs in redis-server, {_us(cost)} µs of our "
        f"{_us(ours)} µs per call. Without it ours would be {_us(ours - cost)} µs = "
        f"{(ours - cost) / po:.2f}x `mail.send`'s {_us(po)} µs.",
    ]


def _tier(d: dict[str, float]) -> float:
    return d["workers"] + d["postgres"] + d["redis"]
