"""The table a chaos run prints and writes to ``results/latest-<policy>.txt``.

Counts, the faults played, the SMTP answers, timings, PASS or FAIL with every
violation, then details, sweeper exits and the timeline of events.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def table_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The rows of the table: label and value."""
    c = Counter(result["counts"])
    cfg = result["config"]
    smtp = Counter(result.get("smtp", {}))
    t = result.get("timings", {})
    review = cfg["policy"] == "review"
    rows: list[tuple[str, Any]] = [
        ("enqueued (committed deliveries)", c["enqueued"]),
        ("rolled back on purpose (must never arrive)", c["rolled back"]),
        ("delivered once", c["delivered once"]),
        (
            "delivered twice or more",
            f"{c['delivered twice or more']} rows, {c['extra copies']} extra copies"
            + (
                ""
                if review
                else f" (explained by the sweeper: {c['delivered twice or more'] - c['unexplained duplicates']})"
            ),
        ),
        ("lost", c["lost"]),
        ("  still queued/processing at the end", c["not terminal"]),
        ("  sent, but no receipt", c["sent without receipt"]),
        ("  receipt for an unknown Message-ID", c["unknown receipts"]),
        ("  receipt for a rolled-back email", c["rolled-back arrived"]),
        ("sent", c["sent"]),
        (
            "failed",
            f"{c['failed']} ({c['failed permanent']} to 550 recipients, {c['failed but arrived']} arrived)",
        ),
        (
            "abandoned",
            f"{c['abandoned']} ({c['abandoned arrived']} arrived, {c['abandoned not arrived']} did not)",
        ),
        ("cancelled", c["cancelled"]),
        *fault_rows(c, review),
        *net_fault_rows(c, review),
        ("sweeper restarts (it died)", c["sweeper restarts"]),
        ("extra deliveries enqueued for faults (plan used up)", c["extra enqueued for faults"]),
        (
            "worker processes started / exited on their own",
            f"{c['workers started']} / {c['unexpected exits']}",
        ),
        (
            "SMTP answers: 250 / 451 RCPT / 451 DATA / 550",
            f"{smtp['250 accepted']} / {smtp['451 at RCPT']} / {smtp['451 at DATA']} / {smtp['550 at RCPT']}",
        ),
        (
            "time: enqueue+chaos / drain / total",
            f"{t.get('enqueue and chaos', 0):.0f}s / {t.get('drain', 0):.0f}s"
            f"{' (TIME LIMIT)' if c['drain timed out'] else ''} / {t.get('total', 0):.0f}s",
        ),
    ]
    return rows


def fault_rows(c: Counter[str], review: bool) -> list[tuple[str, Any]]:
    """The rows of the faults played: how many, and what they produced."""
    smtp_played = c["stalls played"] + c["cuts played"]
    smtp_ok = smtp_played - c["stall/cut rows not as documented"]
    return [
        ("kills: SIGKILL at a random moment (replaced)", c["random SIGKILL"]),
        ("kills: SIGSTOP past the heartbeat timeout, SIGCONT", c["SIGSTOP"]),
        ("kills: SIGKILL in the window (after_send)", c["SIGKILL after_send"]),
        ("rows in the send window of a killed/stopped worker", c["window hits"]),
        (
            '"mark sent" refused by the database',
            f"{c['db refusals']} (confirmed in the worker log: {c['refusals confirmed']}; "
            f"backends terminated: {c['backends terminated']})",
        ),
        ("redis-server restarted with its data wiped", c["redis wipe"]),
        (
            "SIGKILL mid-send + restart under the same --worker-id",
            f"{c['restart under reused id']} (rows settled by the sweeper as documented: "
            f"{c['restart rows'] - c['restart rows not settled by the sweeper']} of "
            f"{c['restart rows']})",
        ),
        (
            "worker with its clock 90 s behind (faketime)",
            f"{c['skewed workers']} (delivered {c['skew delivered']}; declared dead, rows "
            f"swept or delivered nothing: {c['skew problems']})",
        ),
        (
            "web host 120 s behind, its pushes failing (faketime)",
            f"{c['slow web host enqueues']} ({c['slow web host rows']} rows, each tried "
            "within 30 s, else a violation)",
        ),
        ("hostile recipients (long IDN, mixed case, display name)", c["hostile recipients"]),
        (
            "SMTP stall after DATA (> SEND_TIMEOUT) / cut after DATA",
            f"{c['stall after DATA']} / {c['cut after DATA']} ("
            + ("abandoned in doubt, never resent" if review else "retried in doubt, then sent")
            + f": {smtp_ok} of {smtp_played}; rows in doubt: {c['ambiguous rows']}, "
            f"in-doubt retries: {c['in-doubt retries']})",
        ),
    ]


def net_fault_rows(c: Counter[str], review: bool) -> list[tuple[str, Any]]:
    """The rows of the network and signal faults, and of the rules on abandoned rows."""
    lock_ok = c["lock rows"] - c["lock rows not as documented"]
    long_ok = c["long-send rows"] - c["long-send rows not as documented"]
    return [
        (
            "lost reply + cut: claim / step / push (proxied workers)",
            f"{c['lost claim reply']} / {c['lost step reply']} / {c['lost push reply']}",
        ),
        (
            "refused connections + open ones cut: Redis / PostgreSQL",
            f"{c['redis outage']} / {c['postgres outage']} (connections refused: "
            f"{c['redis proxy: refused'] + c['postgres proxy: refused']}, cut: "
            f"{c['connections cut']})",
        ),
        (
            "sweeper settlements explained by a network fault",
            c["sweeper acts explained by network faults"],
        ),
        (
            "SIGSTOP while its step waits on a row lock",
            f"{c['SIGSTOP blocked on a row lock']} ("
            + (
                "abandoned and never sent, or released and sent once"
                if review
                else "requeued or released, sent once at most"
            )
            + f": {lock_ok} of {c['lock rows']} rows)",
        ),
        (
            "SIGTERM during a send held > HEARTBEAT_TIMEOUT",
            f"{c['SIGTERM during a long send']} (sent once, never abandoned: "
            f"{long_ok} of {c['long-send rows']})",
        ),
        (
            "abandoned rows not in doubt / receipts after abandonment",
            f"{c['abandoned not in doubt']} / {c['receipt after abandonment']}",
        ),
        (
            "workers behind the fault proxies (started)",
            f"{c['proxied workers started']} (Redis proxy: {c['redis proxy: connections']} "
            f"connections, {c['redis proxy: MB forwarded']} MB; PostgreSQL proxy: "
            f"{c['postgres proxy: connections']} connections, "
            f"{c['postgres proxy: MB forwarded']} MB)",
        ),
    ]


def format_table(result: dict[str, Any]) -> str:
    """The table of one policy's run, as printed and written to ``latest-<policy>.txt``."""
    cfg = result["config"]
    rows = table_rows(result)
    width = max(len(k) for k, _ in rows)
    head = (
        f"chaos run {result['date']}  policy={cfg['policy']}  seed={cfg['seed']}  "
        f"deliveries={cfg['deliveries']}  workers={cfg['workers']} "
        f"(concurrency {','.join(map(str, cfg['concurrency']))})  db={cfg['db']}  "
        f"heartbeat={cfg['heartbeat_interval']}s/{cfg['heartbeat_timeout']}s  "
        f"time-limit={cfg['time_limit']:.0f}s"
    )
    lines = [head, "-" * min(len(head), 100)]
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("-" * min(len(head), 100))
    if result["ok"]:
        lines.append("RESULT: PASS")
    else:
        lines.append("RESULT: FAIL")
        lines += [f"  - {v}" for v in result["violations"]]
    if result.get("sweeper_restarts"):
        lines.append("sweeper exits:")
        lines += [f"  {s}" for s in result["sweeper_restarts"]]
    if result.get("details"):
        lines.append("details:")
        lines += [f"  {d}" for d in result["details"][:200]]
    lines.append("events:")
    lines += [f"  {e}" for e in result["events"]]
    lines.append(f"logs: {result['logs']}")
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------
