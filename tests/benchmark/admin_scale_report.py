"""The admin scale part's pieces of the benchmark report (report.py): its targets and its section."""

from __future__ import annotations

import os
import statistics
from typing import Any

from tests.benchmark.admin_scale import BUDGET_MS, PAGES

Target = tuple[str, str, str]  # target, measured, verdict (as in report.py)

LABELS = {
    "dashboard": "GET /admin/outbox/dashboard/",
    "metrics": "GET /outbox/metrics (one scrape)",
    "outbox_status": "manage.py outbox_status (call_command)",
    "delivery list": "GET the delivery list",
    "delivery list, status sent": "the delivery list, status sent",
    "delivery list, status failed": "the delivery list, status failed",
    "delivery list, status queued": "the delivery list, status queued",
    "email list": "GET the email list",
}


def _ms(times: list[float]) -> tuple[float, float]:
    """``(median, max)`` in ms of the timed calls (the first, the warm-up, left out)."""
    timed = [t * 1000 for t in times[1:]]
    return statistics.median(timed), max(timed)


def admin_scale_targets(children: dict[str, dict[str, Any]]) -> list[Target]:
    """Each page at most 500 ms at the largest history (PostgreSQL)."""
    results = children.get("postgres", {}).get("extra", {}).get("admin_scale")
    if not results:
        return []
    largest = results[-1]
    out: list[Target] = []
    for name, times in largest["times"].items():
        median, high = _ms(times)
        ok = median <= BUDGET_MS
        full = largest["history"] >= 5_000_000
        out.append(
            (
                f"{name} at {largest['history']:,} history rows (PG) <= {BUDGET_MS:.0f} ms",
                f"median {median:.0f} ms of {len(times) - 1} (max {high:.0f} ms)",
                ("met" if ok else "NOT MET") if full else f"n/a (at a smaller size: {ok})",
            )
        )
    return out


def admin_scale_section(db: str, results: Any) -> list[str]:
    """Times side by side, the answers side by side, index builds, and the slowest plans."""
    if not results:
        return []
    sizes = [r["history"] for r in results]
    md = [f"## The operator's pages at {' and '.join(f'{s:,}' for s in sizes)} rows ({db})", ""]
    md.append(
        "Tables filled in SQL (tests/benchmark/admin_scale_data.py: "
        + "; ".join(f"{r['history']:,} history rows in {r['seed_s']:.0f}s" for r in results)
        + "), plus the same live rows at every size; queued rows mirrored into Redis by a "
        "full sweeper pass. Each page: one warm-up call, then the median and the max of the "
        "next ones, through Django's test client as a logged-in superuser (the whole "
        "request, template included). The machine is shared with other work (2 cores): read "
        "the max as noise, and the medians as an upper bound."
    )
    md.append("")
    head = " | ".join(f"{s:,}: median (max) ms" for s in sizes)
    db_head = " / ".join(f"{s:,}" for s in sizes)
    md.append(
        f"| page | {head} | ratio | <= {BUDGET_MS:.0f} ms | in SQL ms ({db_head}) "
        f"| CPU ms ({db_head}) | warm-up ms |"
    )
    md.append("|---|" + "---:|" * len(sizes) + "---:|---|---:|---:|---:|")
    for name in PAGES:
        cells = [_ms(r["times"][name]) for r in results]
        ratio = cells[-1][0] / cells[0][0] if cells[0][0] else 0.0
        shown = " | ".join(f"{median:.0f} ({high:.0f})" for median, high in cells)
        warm = " / ".join(f"{r['times'][name][0] * 1000:.0f}" for r in results)
        sql = " / ".join(f"{r['db_ms'][name]:.0f}" for r in results)
        cpu = " / ".join(f"{_ms(r['cpu'][name])[0]:.0f}" for r in results)
        ok = "yes" if cells[-1][0] <= BUDGET_MS else "NO"
        md.append(
            f"| {LABELS.get(name, name)} | {shown} | {ratio:.2f}x | {ok} | {sql} | {cpu} | {warm} |"
        )
    md.append("")
    md.append(
        "In SQL: the time one call spent in its queries (the median of three more calls), "
        "the part that could grow with the table; the rest is Python and the template, "
        "the same at every size. CPU: the median CPU time of this process per call "
        "(Python and the template, and the client's side of the queries), which, unlike "
        "the wall clock, leaves out the time spent waiting for a core. "
        "The warm-up is the first call after the fill (cold caches; for the metrics, the "
        "first scrape also counts every sent row once, as after Redis lost the checkpoint "
        "of outbox/status/counters.py)."
    )
    md.append("")
    md.append(
        "Load average (1 min) of the machine before and after each size's timing: "
        + "; ".join(
            f"{r['history']:,}: {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"
            for r in results
        )
        + f" (on {os.cpu_count()} cores)."
    )
    md.append("")
    md += _answers(results)
    largest = results[-1]
    builds = largest.get("index_build_s") or {}
    if builds:
        md.append(
            f"Index builds after the {largest['history']:,}-row fill (seconds; a plain "
            "`CREATE INDEX` holds off writes this long): "
            + ", ".join(f"`{name}` {s:.1f}" for name, s in sorted(builds.items()))
            + "."
        )
        md.append("")
    md += _plans(largest.get("plans") or [], largest["history"])
    return md


def _answers(results: list[dict[str, Any]]) -> list[str]:
    md = [
        "What the pages answered, next to an exact count of the table (run untimed). "
        "`≈` marks the planner's estimate, as the pages do; every other number must equal "
        "the exact one:",
        "",
    ]
    sizes = [r["history"] for r in results]
    md.append("| answer | " + " | ".join(f"{s:,}: shown | exact" for s in sizes) + " |")
    md.append("|---|" + "---:|---:|" * len(sizes))
    rows: dict[str, list[str]] = {}

    def put(key: str, index: int, shown: Any, exact: Any, estimated: bool = False) -> None:
        cells = rows.setdefault(key, ["-", "-"] * len(sizes))
        mark = "≈" if estimated else ("" if exact is None or shown == exact else "DIFFERS ")
        cells[2 * index] = f"{mark}{shown:,}"
        cells[2 * index + 1] = "-" if exact is None else f"{exact:,}"

    for index, result in enumerate(results):
        answers = result["answers"]
        exact = answers["exact"]
        dashboard = answers["dashboard"]
        for status, count in dashboard["counts"].items():
            put(
                f"dashboard: {status}",
                index,
                count,
                exact.get(status, 0),
                status in dashboard["estimated"],
            )
        put("dashboard: due", index, dashboard["due"], answers["exact_due"])
        put("dashboard: sent in the last hour", index, dashboard["sent_last_hour"], None)
        put("dashboard: failed in the last hour", index, dashboard["failed_last_hour"], None)
        for name, part in answers["lists"].items():
            status = name.rsplit(" ", 1)[-1] if "status" in name else None
            want = exact.get(status, 0) if status else None
            if name == "delivery list":
                want = sum(exact.values())
            put(f"{name}: count", index, part["count"], want, part["estimated"])
        for metric, value in answers["metrics"].items():
            status = metric.split('"')[1] if '"' in metric else None
            want = exact.get(status, 0) if status else None
            if metric == "outbox_failed_total":
                want = exact.get("failed", 0)
            if metric == "outbox_due":
                want = answers["exact_due"]
            estimated = status == "sent" and "sent" in dashboard["estimated"]
            put(f"metrics: {metric}", index, int(value), want, estimated)
    for key, cells in rows.items():
        md.append(f"| {key} | " + " | ".join(cells) + " |")
    md.append("")
    return md


def _plans(plans: list[dict[str, Any]], history: int) -> list[str]:
    if not plans:
        return []
    md = [
        f"### The slowest query of each page at {history:,} rows "
        "(`EXPLAIN (ANALYZE, BUFFERS)`, run once after the timing)",
        "",
    ]
    for plan in plans:
        md.append(
            f"**{LABELS.get(plan['page'], plan['page'])}** ({plan['queries']} outbox queries; "
            f"this one {plan['ms']:.1f} ms):"
        )
        md.append("")
        md.append("```sql")
        md.append(plan["sql"])
        md.append("```")
        md.append("")
        md.append("```")
        md.append(plan["plan"])
        md.append("```")
        md.append("")
    return md
