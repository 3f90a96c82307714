"""The latency part's timeline: where each email's commit -> accepted went, step by step.

``analyse`` puts together what the request's process noted (the commit; the
outbox's push), what the workers' probe wrote (probe.py: claim, mark, connection,
fence; a task's start) and what the server logged (MAIL, end of DATA, accepted),
per email; then, per step, the time since the previous step and its share of the
whole, the median over the slowest 1% of the run and over all its emails.
``timeline_section`` is the report's part of it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

STEP_NAMES = {
    "push": "push (ids to Redis, after the commit)",
    "claim": "claim (a worker's claim returned the id)",
    "mark": "mark committed (the step's commit returned)",
    "conn": "connection taken (open)",
    "fence": "fence (lease checked, copy built)",
    "mail": "MAIL at the server",
    "dot": "final-dot fence (DATA sent)",
    "data": "end of DATA at the server",
    "accepted": "accepted",
    "start": "task started in the worker",
}


def analyse(
    outbox: bool,
    wanted: tuple[str, ...],
    keys: list[str],
    committed: dict[str, float],
    pushed: dict[str, float],
    ids: dict[str, str],
    records: list[tuple[str, str, float]],
    server: dict[str, tuple[float, float, float]],
) -> dict[str, Any]:
    """Each step's share of commit -> accepted, median over the slowest 1% and over all."""
    per: dict[str, dict[str, list[float]]] = {}
    for step, key, when in records:
        rcpt = ids.get(key, key) if outbox else key
        per.setdefault(rcpt, {}).setdefault(step, []).append(when)
    lines: dict[str, dict[str, float]] = {}
    for k in keys:
        t = {"commit": committed[k]}
        if k in pushed:
            t["push"] = pushed[k]
        got = per.get(k, {})
        for step in ("claim", "mark", "conn", "start"):
            if got.get(step):
                t[step] = min(got[step])
        fences = sorted(got.get("fence", []))
        if fences:
            t["fence"] = fences[0]
            if len(fences) > 1:
                t["dot"] = fences[-1]
        if k in server:
            t["mail"], t["data"], t["accepted"] = server[k]
        lines[k] = t
    steps = [s for s in wanted if all(s in lines[k] for k in keys)]
    total = {k: lines[k]["accepted"] - lines[k]["commit"] for k in keys}
    ordered = sorted(keys, key=lambda k: total[k])
    slow = ordered[-max(1, math.ceil(len(keys) / 100)) :]

    def summary(group: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"emails": len(group), "total_ms": _median([total[k] for k in group])}
        prev = "commit"
        for step in steps:
            seg = [lines[k][step] - lines[k][prev] for k in group]
            shares = [s / total[k] for s, k in zip(seg, group, strict=True) if total[k] > 0]
            out[step] = {"ms": _median(seg), "share": _median(shares, scale=1.0)}
            prev = step
        return out

    return {
        "steps": steps,
        "all": summary(ordered),
        "slowest": summary(slow),
        # The five slowest, each step in ms after the commit.
        "examples": [
            {
                "to": k,
                "total_ms": 1000 * total[k],
                **{s: 1000 * (lines[k][s] - lines[k]["commit"]) for s in steps},
            }
            for k in slow[-5:][::-1]
        ],
    }


def _median(values: list[float], scale: float = 1000.0) -> float:
    return scale * statistics.median(values) if values else float("nan")


def timeline_section(data: dict[str, Any]) -> list[str]:
    if not data.get("timeline"):
        return ["The timeline was off (`--no-timeline`).", ""]
    md = [
        "### Where the time goes: each step's share of commit -> accepted",
        "",
        "Per email, the time from the previous step to this one, as a share of its commit -> "
        "accepted; the median of those over the slowest 1% of each run's emails and over all "
        "of them (with several runs: the median of the runs' medians; ms: the step's own time). Steps recorded "
        "by the requests' process (commit; the outbox's push: its `email_enqueued` signal), "
        "the workers (tests/benchmark/probe.py: wrappers of public functions, installed only "
        "for this part) and the server (MAIL, end of DATA, accepted). Times are `time.time()` "
        "of one machine.",
        "",
    ]
    for key in data["configs"]:
        lines = [r["systems"][key]["timeline"] for r in data["runs"] if key in r["systems"]]
        if not lines:
            continue
        steps = lines[0]["steps"]
        md += [
            f"**{key}** (median commit -> accepted: all "
            f"{statistics.median(t['all']['total_ms'] for t in lines):.1f} ms, slowest 1% "
            f"{statistics.median(t['slowest']['total_ms'] for t in lines):.1f} ms)",
            "",
            "| step (time since the previous one) | all: ms | all: share | slowest 1%: ms "
            "| slowest 1%: share |",
            "|---|---:|---:|---:|---:|",
        ]
        for step in steps:
            a = [t["all"][step] for t in lines if step in t["all"]]
            s = [t["slowest"][step] for t in lines if step in t["slowest"]]
            md.append(
                f"| {STEP_NAMES.get(step, step)} | {_med(a, 'ms')} | {_med(a, 'share', pct=True)} "
                f"| {_med(s, 'ms')} | {_med(s, 'share', pct=True)} |"
            )
        worst = sorted((e for t in lines for e in t["examples"]), key=lambda e: -e["total_ms"])[:5]
        md += [
            "",
            "The slowest five, ms after the commit: "
            + "; ".join(
                f"{e['total_ms']:.1f} ms = " + ", ".join(f"{s} {e[s]:.1f}" for s in steps if s in e)
                for e in worst
            ),
            "",
        ]
    return md


def _med(items: list[dict[str, float]], field_: str, pct: bool = False) -> str:
    values = [i[field_] for i in items if i[field_] == i[field_]]
    if not values:
        return "-"
    m = statistics.median(values)
    return f"{100 * m:.0f}%" if pct else f"{m:.2f}"
